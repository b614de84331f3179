"""Assets a project already has, streamed without a separate bake step.

- Images (PNG, JPEG, TIFF, WebP, ...): `pack_for_image` bakes an image file into a pack once, in a
  content-addressed cache (`PackCache`) bounded in size, and hands back the cached pack's path;
  `resolve_pack` does that for whatever a command is given, and `open_pack_reader` opens the result
  with a reader that keeps the cached pack leased only while it is open (`Streamer.open` uses it).
- Block-compressed files made elsewhere (DDS, KTX2): `read_block_file` reads them, `retile_to_pack`
  re-tiles their blocks into a pack without re-encoding, `export_ktx2` writes a pack back to KTX2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

# Names to the submodule that defines them, imported on first use (PEP 562): `texstream.assets.load`,
# which every command that takes a pack asks for, then starts without the exporter, the pack cache or
# the image bake.
_EXPORTS = {
    ".blocks": (
        "BlockLevel",
        "BlockTexture",
        "decode_blocks",
        "decode_level",
    ),
    ".export": (
        "ExportReport",
        "export_ktx2",
    ),
    ".image_packs": (
        "CachedPackReader",
        "ImagePackProgress",
        "ImagePackStage",
        "default_pack_cache",
        "file_digest",
        "image_pack_key",
        "is_pack_file",
        "looks_like_image",
        "open_pack_reader",
        "pack_for_block_file",
        "pack_for_image",
        "resolve_pack",
    ),
    ".image_settings": (
        "ContentKind",
        "ImageBakeSettings",
        "ImageContent",
        "classify",
        "settings_for",
    ),
    ".load": (
        "is_block_file",
        "read_block_file",
    ),
    ".pack_cache": (
        "CacheEntry",
        "PackCache",
        "PackCacheConfig",
        "VerifyPolicy",
    ),
    ".retile": (
        "RetileConfig",
        "RetileReport",
        "retile_to_pack",
    ),
}

if TYPE_CHECKING:
    from .blocks import BlockLevel, BlockTexture, decode_blocks, decode_level
    from .export import ExportReport, export_ktx2
    from .image_packs import (
        CachedPackReader,
        ImagePackProgress,
        ImagePackStage,
        default_pack_cache,
        file_digest,
        image_pack_key,
        is_pack_file,
        looks_like_image,
        open_pack_reader,
        pack_for_block_file,
        pack_for_image,
        resolve_pack,
    )
    from .image_settings import ContentKind, ImageBakeSettings, ImageContent, classify, settings_for
    from .load import is_block_file, read_block_file
    from .pack_cache import CacheEntry, PackCache, PackCacheConfig, VerifyPolicy
    from .retile import RetileConfig, RetileReport, retile_to_pack


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "BlockLevel",
    "BlockTexture",
    "CacheEntry",
    "CachedPackReader",
    "ContentKind",
    "ExportReport",
    "ImageBakeSettings",
    "ImageContent",
    "ImagePackProgress",
    "ImagePackStage",
    "PackCache",
    "PackCacheConfig",
    "RetileConfig",
    "RetileReport",
    "VerifyPolicy",
    "classify",
    "decode_blocks",
    "decode_level",
    "default_pack_cache",
    "export_ktx2",
    "file_digest",
    "image_pack_key",
    "is_block_file",
    "is_pack_file",
    "looks_like_image",
    "open_pack_reader",
    "pack_for_block_file",
    "pack_for_image",
    "read_block_file",
    "resolve_pack",
    "retile_to_pack",
    "settings_for",
]
