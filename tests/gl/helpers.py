"""Test data and an independent reference for GL texture tests: etcpak encodes, texture2ddecoder decodes."""

from __future__ import annotations

import functools
from pathlib import Path

import etcpak
import moderngl
import numpy as np
import texture2ddecoder

from texstream.gl import shaders
from texstream.gl.gl_ext import GLExt
from texstream.gl.objects import TextureArray
from texstream.pack.format import TexelFormat
from texstream.testing import psnr as testing_psnr

DATA = Path(__file__).parent / "data"
SLOT = 136  # a production slot: 128 content texels plus a 4-texel border on each side

# texel fetch of one layer into a float framebuffer (exact texels, no filtering); the vertex stage
# comes from texstream's own common.glsl through a user-string #include
FETCH_VS = """
#version 330
#include "texstream/common.glsl"
void main() { gl_Position = ts_fullscreen_position(gl_VertexID); }
"""
FETCH_FS = """
#version 330
uniform sampler2DArray tex;
uniform int layer;
out vec4 color;
void main() { color = texelFetch(tex, ivec3(ivec2(gl_FragCoord.xy), layer), 0); }
"""


def make_image(size: int, seed: int) -> np.ndarray:
    """RGBA8 test content: smooth gradients, an edge and mild noise (what tiles of photos look like)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    r = 0.5 + 0.5 * np.sin(6.0 * x + seed)
    g = y
    b = 0.5 + 0.5 * np.cos(5.0 * (x + y))
    a = np.where(x + y > 1.0, 0.8, 0.3) + 0.2 * x
    img = np.stack([r, g, b, a], axis=-1) * 255.0 + rng.normal(0.0, 4.0, (size, size, 4))
    return np.ascontiguousarray(np.clip(img, 0, 255).astype(np.uint8))


def encode(fmt: TexelFormat, img: np.ndarray) -> bytes:
    h, w = img.shape[:2]
    if fmt is TexelFormat.RGBA8:
        return img.tobytes()
    if fmt is TexelFormat.BC7:
        return bytes(etcpak.compress_bc7(img, w, h, None))
    fn = {
        TexelFormat.BC1: etcpak.compress_bc1,
        TexelFormat.BC3: etcpak.compress_bc3,
        TexelFormat.BC4: etcpak.compress_bc4,
        TexelFormat.BC5: etcpak.compress_bc5,
    }[fmt]
    return bytes(fn(img, w, h))


def reference_rgba(fmt: TexelFormat, data: bytes, size: int) -> np.ndarray:
    """What sampling `data` must give, as RGBA8, decoded by texture2ddecoder (not by the encoder)."""
    if fmt is TexelFormat.RGBA8:
        return np.frombuffer(data, np.uint8).reshape(size, size, 4).copy()
    decode = {
        TexelFormat.BC1: texture2ddecoder.decode_bc1,
        TexelFormat.BC3: texture2ddecoder.decode_bc3,
        TexelFormat.BC4: texture2ddecoder.decode_bc4,
        TexelFormat.BC5: texture2ddecoder.decode_bc5,
        TexelFormat.BC7: texture2ddecoder.decode_bc7,
    }[fmt]
    bgra = np.frombuffer(decode(data, size, size), np.uint8).reshape(size, size, 4)
    return bgra[..., [2, 1, 0, 3]].copy()


def compared_channels(fmt: TexelFormat) -> list[int]:
    """Channels GL and the reference agree on: BC1 is opaque in GL (RGB DXT1), BC4 is R, BC5 is RG."""
    return {TexelFormat.BC1: [0, 1, 2], TexelFormat.BC4: [0], TexelFormat.BC5: [0, 1]}.get(fmt, [0, 1, 2, 3])


def srgb_to_linear(c: np.ndarray) -> np.ndarray:
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


# float layers read back in [0, 1], every channel compared
psnr = functools.partial(testing_psnr, peak=1.0, ignore_alpha=False)


class LayerSampler:
    """Renders one layer of a texture array with texelFetch into an RGBA32F framebuffer."""

    def __init__(self, ctx: moderngl.Context, gl: GLExt, size: int) -> None:
        self.ctx, self.gl, self.size = ctx, gl, size
        self.prog = shaders.program(ctx, vertex=FETCH_VS, fragment=FETCH_FS)
        self.vao = ctx.vertex_array(self.prog, [])
        self.target = ctx.texture((size, size), 4, dtype="f4")
        self.fbo = ctx.framebuffer(color_attachments=[self.target])

    def sample(self, texture: TextureArray, layer: int, unit: int = 0) -> np.ndarray:
        """The layer's texels as float RGBA, shape (size, size, 4), row 0 = the layer's first row."""
        # restored after, so no later code finds this (maybe released) framebuffer bound
        previous = self.ctx.fbo or self.ctx.detect_framebuffer(0)
        self.fbo.use()
        try:
            self.fbo.clear(0.0, 0.0, 0.0, 0.0)
            texture.bind(unit)
            self.prog["tex"] = unit
            self.prog["layer"] = layer
            self.vao.render(moderngl.TRIANGLES, vertices=3)
            raw = self.fbo.read(components=4, dtype="f4")
        finally:
            previous.use()
        return np.frombuffer(raw, np.float32).reshape(self.size, self.size, 4).copy()

    def release(self) -> None:
        for obj in (self.vao, self.fbo, self.target, self.prog):
            obj.release()
