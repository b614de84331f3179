"""Assets a project already has, streamed without a separate bake step.

`pack_for_image` turns an image file (PNG, JPEG, TIFF, WebP, ...) into a pack once, in a
content-addressed cache (`PackCache`) bounded in size, and hands back the cached pack's path.
"""

from .image_packs import (
    ImagePackProgress,
    ImagePackStage,
    default_pack_cache,
    file_digest,
    image_pack_key,
    is_pack_file,
    looks_like_image,
    pack_for_image,
    resolve_pack,
)
from .image_settings import ContentKind, ImageBakeSettings, ImageContent, classify, settings_for
from .pack_cache import CacheEntry, PackCache, PackCacheConfig, VerifyPolicy

__all__ = [
    "CacheEntry",
    "ContentKind",
    "ImageBakeSettings",
    "ImageContent",
    "ImagePackProgress",
    "ImagePackStage",
    "PackCache",
    "PackCacheConfig",
    "VerifyPolicy",
    "classify",
    "default_pack_cache",
    "file_digest",
    "image_pack_key",
    "is_pack_file",
    "looks_like_image",
    "pack_for_image",
    "resolve_pack",
    "settings_for",
]
