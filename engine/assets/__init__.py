"""Block-compressed files made elsewhere (DDS, KTX2): read them, re-tile them into packs without
re-encoding, and export packs back to KTX2."""

from .blocks import BlockLevel, BlockTexture, decode_blocks, decode_level
from .export import ExportReport, export_ktx2
from .load import is_block_file, read_block_file
from .retile import RetileConfig, RetileReport, retile_to_pack

__all__ = [
    "BlockLevel",
    "BlockTexture",
    "ExportReport",
    "RetileConfig",
    "RetileReport",
    "decode_blocks",
    "decode_level",
    "export_ktx2",
    "is_block_file",
    "read_block_file",
    "retile_to_pack",
]
