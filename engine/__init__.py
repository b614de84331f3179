"""texstream: stream huge block-compressed textures into a moderngl program inside a VRAM budget."""

from __future__ import annotations

from .config import BakeConfig, BudgetConfig, RemoteConfig, StreamerConfig
from .errors import (
    BudgetError,
    EngineError,
    GLError,
    PackFormatError,
    ShaderError,
    SourceError,
    TileCorruptError,
)
from .pack import AddressMode, PackHeader, PackReader, PackWriter, Supercompression, TexelFormat
from .remote import PackChangedError, RemoteError
from .runtime.streamer import Streamer, VirtualTexture

__version__ = "0.1.0"

__all__ = [
    "AddressMode",
    "BakeConfig",
    "BudgetConfig",
    "StreamerConfig",
    "RemoteConfig",
    "RemoteError",
    "PackChangedError",
    "Streamer",
    "VirtualTexture",
    "BudgetError",
    "EngineError",
    "GLError",
    "PackFormatError",
    "PackHeader",
    "PackReader",
    "PackWriter",
    "ShaderError",
    "SourceError",
    "Supercompression",
    "TexelFormat",
    "TileCorruptError",
    "__version__",
]
