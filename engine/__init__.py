"""texstream: stream huge block-compressed textures into a moderngl program inside a VRAM budget.

The public API is what this module exports (``import texstream as ts``): the `Streamer` and its
`VirtualTexture` (with its texture-coordinate `Origin`) and `TextureSet` (one material's textures
streamed as one), the configurations, the errors, the shader
loader (`program`, `preprocess`, `shader_file`: they resolve ``#include "texstream/vt.glsl"``;
`register_includes` makes plain ``ctx.program()`` resolve it too), the per-frame statistics
(`FrameStats`, `StreamerStats`, `StreamTotals`, `Completeness`), `FrameThrottle` for headless loops,
per-frame `Telemetry` and its `Overlay`, the pack reader and writer, and glTF scenes drawn with
streamed textures (`load_gltf`, `GltfScene`). Everything else is internal
and may change between versions; the programs built on the library (command line, demo, benchmarks)
live in ``texstream.apps``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports
from .version import __version__

# Each public name -> the module that defines it, imported on first use (PEP 562): the command
# line's bake imports neither GL, the streamer nor the telemetry (a third of its start-up time).
_EXPORTS = {
    ".config": (
        "BakeConfig",
        "BudgetConfig",
        "RedirectPolicy",
        "RemoteConfig",
        "StreamerConfig",
        "UploadPath",
        "cache_dir",
    ),
    ".errors": (
        "BudgetError",
        "EngineError",
        "GLError",
        "GltfError",
        "PackFormatError",
        "PackNotFoundError",
        "ShaderError",
        "SourceError",
        "TileCorruptError",
    ),
    ".gl.objects": ("FrameThrottle",),
    ".gl.shaders": ("ShaderFile", "preprocess", "program", "register_includes", "shader_file"),
    ".pack": ("AddressMode", "PackHeader", "PackReader", "PackWriter", "Supercompression", "TexelFormat"),
    ".remote": ("PackChangedError", "RemoteError", "SourceState", "SourceStatus"),
    ".runtime.frame_stats": ("FeedbackInfo", "FrameStats", "StreamerStats", "StreamTotals"),
    ".runtime.origin": ("Origin",),
    ".runtime.residency": ("Completeness",),
    ".runtime.streamer": ("IOStatus", "Streamer", "TextureSet", "VirtualTexture"),
    ".scene.gltf": ("GltfScene", "load_gltf"),
    ".telemetry": ("FrameRecord", "Overlay", "Telemetry"),
}

if TYPE_CHECKING:
    from .config import BakeConfig, BudgetConfig, RedirectPolicy, RemoteConfig, StreamerConfig, UploadPath, cache_dir
    from .errors import (
        BudgetError,
        EngineError,
        GLError,
        GltfError,
        PackFormatError,
        PackNotFoundError,
        ShaderError,
        SourceError,
        TileCorruptError,
    )
    from .gl.objects import FrameThrottle
    from .gl.shaders import ShaderFile, preprocess, program, register_includes, shader_file
    from .pack import AddressMode, PackHeader, PackReader, PackWriter, Supercompression, TexelFormat
    from .remote import PackChangedError, RemoteError, SourceState, SourceStatus
    from .runtime.frame_stats import FeedbackInfo, FrameStats, StreamerStats, StreamTotals
    from .runtime.origin import Origin
    from .runtime.residency import Completeness
    from .runtime.streamer import IOStatus, Streamer, TextureSet, VirtualTexture
    from .scene.gltf import GltfScene, load_gltf
    from .telemetry import FrameRecord, Overlay, Telemetry


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "AddressMode",
    "BakeConfig",
    "BudgetConfig",
    "BudgetError",
    "Completeness",
    "EngineError",
    "FeedbackInfo",
    "FrameRecord",
    "FrameStats",
    "FrameThrottle",
    "GLError",
    "GltfError",
    "GltfScene",
    "IOStatus",
    "Origin",
    "Overlay",
    "PackChangedError",
    "PackFormatError",
    "PackNotFoundError",
    "PackHeader",
    "PackReader",
    "PackWriter",
    "RedirectPolicy",
    "RemoteConfig",
    "RemoteError",
    "ShaderError",
    "ShaderFile",
    "SourceError",
    "SourceState",
    "SourceStatus",
    "Streamer",
    "StreamerConfig",
    "StreamerStats",
    "StreamTotals",
    "Supercompression",
    "Telemetry",
    "TexelFormat",
    "TextureSet",
    "TileCorruptError",
    "UploadPath",
    "VirtualTexture",
    "__version__",
    "cache_dir",
    "load_gltf",
    "preprocess",
    "program",
    "register_includes",
    "shader_file",
]
