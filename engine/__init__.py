"""texstream: stream huge block-compressed textures into a moderngl program inside a VRAM budget.

The public API is what this module exports (``import texstream as ts``): the `Streamer` and its
`VirtualTexture`, the configurations, the errors, the shader loader (`program`, `preprocess`: they
resolve ``#include "texstream/vt.glsl"``), per-frame `Telemetry` and its `Overlay`, and the pack
reader and writer. Everything else is internal and may change between versions; the programs built
on the library (command line, demo, benchmarks) live in ``texstream.apps``.
"""

from __future__ import annotations

from .config import BakeConfig, BudgetConfig, RemoteConfig, StreamerConfig, cache_dir
from .errors import (
    BudgetError,
    EngineError,
    GLError,
    PackFormatError,
    PackNotFoundError,
    ShaderError,
    SourceError,
    TileCorruptError,
)
from .gl.shaders import preprocess, program
from .pack import AddressMode, PackHeader, PackReader, PackWriter, Supercompression, TexelFormat
from .remote import PackChangedError, RemoteError
from .runtime.frame_stats import FeedbackInfo, StreamerStats, StreamTotals
from .runtime.residency import Completeness
from .runtime.streamer import IOStatus, Streamer, VirtualTexture
from .telemetry import Overlay, Telemetry

__version__ = "0.1.0"

__all__ = [
    "AddressMode",
    "BakeConfig",
    "BudgetConfig",
    "BudgetError",
    "Completeness",
    "EngineError",
    "FeedbackInfo",
    "GLError",
    "IOStatus",
    "Overlay",
    "PackChangedError",
    "PackFormatError",
    "PackNotFoundError",
    "PackHeader",
    "PackReader",
    "PackWriter",
    "RemoteConfig",
    "RemoteError",
    "ShaderError",
    "SourceError",
    "Streamer",
    "StreamerConfig",
    "StreamerStats",
    "StreamTotals",
    "Supercompression",
    "Telemetry",
    "TexelFormat",
    "TileCorruptError",
    "VirtualTexture",
    "__version__",
    "cache_dir",
    "preprocess",
    "program",
]
