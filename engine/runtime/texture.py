"""`VirtualTexture`: one open pack as the user's shader sees it, and the fixed GL bindings it uses.

Every virtual texture samples through the same few GL objects, so any number of them (up to 256)
draw in one frame on a fixed set of bindings:

- ``VT_PAGES_BINDING`` (6): one shader storage buffer with the page tables of every texture;
- ``VT_FEEDBACK_BINDING`` (7): the feedback buffer the draws append wanted pages to;
- texture units ``FIRST_UNIT`` (8) and up: one per cache pool (texel format x slot size), at most
  ``MAX_POOLS``; textures of the same format share their pool's unit.

`Streamer` checks these against the driver's limits at construction (one clear error if a driver
cannot) and `VirtualTexture.bind` sets a program's `VT_DECLARE(name)` uniforms.
"""

from __future__ import annotations

from collections.abc import Callable

import moderngl

from ..errors import EngineError, GLError
from ..gl import enums
from ..gl.gl_ext import GLExt
from ..pack.format import PackHeader
from ..pack.reader import PackReader
from ..remote import SourceState, SourceStatus
from .origin import Origin, meta_flags
from .page_table import TexturePages
from .pools import CachePool
from .slots import MAX_POOLS  # units FIRST_UNIT .. FIRST_UNIT + MAX_POOLS - 1
from .texture_sets import check_priority
from .tiles import TileRange

__all__ = ["FIRST_UNIT", "MAX_POOLS", "VT_FEEDBACK_BINDING", "VT_PAGES_BINDING", "VirtualTexture", "check_bindings"]

VT_PAGES_BINDING = 6  # shaders/vt.glsl
VT_FEEDBACK_BINDING = 7  # shaders/vt.glsl
FIRST_UNIT = 8  # texture units below are left to the application


def check_bindings(gl: GLExt) -> None:
    """GLError unless the context offers the units and storage bindings every virtual texture uses."""
    units = gl.get_integer(enums.GL_MAX_COMBINED_TEXTURE_IMAGE_UNITS)
    bindings = gl.get_integer(enums.GL_MAX_SHADER_STORAGE_BUFFER_BINDINGS)
    blocks = gl.get_integer(enums.GL_MAX_FRAGMENT_SHADER_STORAGE_BLOCKS)
    if units < FIRST_UNIT + MAX_POOLS or bindings <= VT_FEEDBACK_BINDING or blocks < 2:
        raise GLError(
            f"this GL context offers {units} texture units, {bindings} storage-buffer bindings and {blocks} "
            f"fragment storage blocks; texstream needs units {FIRST_UNIT}..{FIRST_UNIT + MAX_POOLS - 1}, "
            f"bindings {VT_PAGES_BINDING} and {VT_FEEDBACK_BINDING}, and 2 fragment storage blocks"
        )


def max_anisotropy(border: int) -> int:
    """Anisotropic taps the border allows: at the finer trilinear level the minor axis spans up to 2
    texels, so N taps reach N texels either side; N = B keeps them inside the border."""
    return max(1, min(16, border))


class VirtualTexture:
    """One open pack, made by `Streamer.open`: bind it in a shader that declares it with
    ``VT_DECLARE(name)`` and samples it with ``VT_SAMPLE(name, uv)`` (``#include "texstream/vt.glsl"``).

    Opening a pack that is already open gives another handle on the same residency: the same tiles,
    one page table, one share of the cache. Closing one handle leaves the others working; the tiles
    go when the last handle closes.

    Attributes
    ----------
    id : int
        The texture's number in its streamer (0..255); handles on the same pack share it.
    path : pathlib.Path or str
        Where the pack was opened from (a URL stays a string).
    header : PackHeader
        The pack's geometry and format (size, levels, tile size, texel format).
    reader : PackReader
        The pack's reader (owned by the streamer; closed with the last handle).
    lod_bias : float
        Added to the level the shader samples (positive: blurrier, fewer tiles). Default 0.
    origin : Origin
        Which image row v = 0 names: `Origin.BOTTOM_LEFT` (default, the GL convention) or
        `Origin.TOP_LEFT` (glTF, DirectX). Set by ``Streamer.open(path, origin=...)``; may be
        changed at any time (the next `bind` uses it).
    priority : float
        How much this texture's sharpness counts under pressure (default 1; > 1 stays sharper, < 1
        gives way first: docs/priorities.md). Handles on one pack stream it at the highest priority
        any of them has. Settable at any time.
    writes_feedback : bool
        False for a member of a `TextureSet` other than its lead (the lead's feedback stands for the
        set; ``VTInfo.meta`` carries the bit, so the shader needs no change). Owned by the set.
    closed : bool
        True once this handle or its streamer is closed.
    """

    def __init__(
        self,
        tex_id: int,
        reader: PackReader,
        pool: CachePool,
        tiles: TileRange,
        table: TexturePages,
        *,
        on_bind: Callable[[int], None],
        on_close: Callable[[VirtualTexture], None],
        failures: Callable[[int], tuple[int, int]],
        origin: Origin = Origin.BOTTOM_LEFT,
        priority: float = 1.0,
        on_priority: Callable[[int], None] = lambda _tex: None,
    ) -> None:
        self.id, self.reader, self.pool, self.tiles, self.table = tex_id, reader, pool, tiles, table
        self.header: PackHeader = reader.header
        self.path = reader.path
        self.lod_bias = 0.0
        self.origin = origin
        self.writes_feedback = True
        self.closed = False
        self._on_bind, self._on_close, self._failures = on_bind, on_close, failures
        self._priority, self._on_priority = check_priority(priority), on_priority

    @property
    def priority(self) -> float:
        return self._priority

    @priority.setter
    def priority(self, value: float) -> None:
        self._priority = check_priority(value)
        self._on_priority(self.id)  # the streamer streams the pack at its handles' highest priority

    @property
    def origin(self) -> Origin:
        return self._origin

    @origin.setter
    def origin(self, value: Origin | str) -> None:
        self._origin = Origin.parse(value)

    @property
    def shader_meta(self) -> tuple[int, int, int, int]:
        """``VTInfo.meta`` of this texture (level count, page-table base, flags, max anisotropy), for
        programs that pass a texture's description per instance instead of through `bind`."""
        h = self.header
        flags = meta_flags(h.address_mode, self.origin, feedback=self.writes_feedback)
        return (h.level_count, self.tiles.start, flags, max_anisotropy(h.border))

    @property
    def corrupt_tiles(self) -> int:
        """How many distinct tiles of this texture failed to load (corrupt, truncated, unreadable)."""
        return self._failures(self.id)[0]

    @property
    def failed_loads(self) -> int:
        """Load attempts that failed (a tile retried and failing again counts again)."""
        return self._failures(self.id)[1]

    @property
    def source_status(self) -> SourceStatus:
        """Whether the pack's bytes can be read now (read-only; owned by the pack's remote file).

        ``status.state`` is `SourceState.OK` for a local pack; for one read by URL it is OFFLINE while
        its server cannot be reached (or asked to wait) and STALE once the pack changed on the server:
        tiles not yet loaded then fail, until the server serves the opened version again (tiles load
        again) or the program reopens the pack to see the new one. ``status.reason`` says why.
        """
        remote = self.reader.remote
        return remote.status() if remote is not None else SourceStatus(SourceState.OK)

    def close(self) -> None:
        """Stop streaming this texture and free its cache slots (same as ``streamer.close(self)``)."""
        self._on_close(self)

    def bind(self, program: moderngl.Program, name: str) -> None:
        """Bind this texture for the next draws with `program`: its cache pool (a texture unit from
        8 up), the shared page tables (SSBO 6) and feedback buffer (SSBO 7), and the uniforms that
        ``VT_DECLARE(name)`` declares. Bind before each frame's draws: open, close and budget
        changes resize pools, which replaces the pool's array and changes its layer count (a uniform:
        cache slots are numbered cell by cell, layer within the cell).

        Parameters
        ----------
        program : moderngl.Program
            A program built with `texstream.program` whose shaders declare ``VT_DECLARE(name)``.
        name : str
            The name given to ``VT_DECLARE`` in the shader.

        Raises
        ------
        EngineError
            The texture is closed, or the program does not use ``VT_DECLARE(name)``.
        """
        if self.closed:
            raise EngineError(f"virtual texture {self.path} is closed")
        h, pool = self.header, self.pool
        self._on_bind(self.id)  # the shared page-table and feedback buffers; the no-update() warning
        pool.bind()
        g = pool.geometry
        values = {
            f"{name}_cache": pool.unit,
            f"{name}.size": (h.width, h.height, 1.0 / h.width, 1.0 / h.height),
            f"{name}.tile": (h.tile_size, h.border, h.slot_size, 1.0 / g.layer_size[0]),
            f"{name}.meta": self.shader_meta,
            f"{name}.cells": (g.cells_x, g.cells, pool.layers, 0),
            f"{name}.bias": (self.lod_bias, 0.0, 0.0, 0.0),
        }
        for key, value in values.items():
            member = program.get(key, None)
            if member is None:
                if key.endswith("_cache"):
                    raise EngineError(f"program has no uniform {key}: declare VT_DECLARE({name}) and use it")
                continue
            member.value = value

    def __repr__(self) -> str:
        return f"VirtualTexture(id={self.id}, {self.path}, {self.header.width}x{self.header.height}, {self.pool.name})"
