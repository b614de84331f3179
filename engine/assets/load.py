"""Which reader a block file needs: told apart by its identifier, else by its suffix."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SourceError
from .blocks import BlockTexture
from .dds import read_dds
from .ktx2 import IDENTIFIER, read_ktx2


def sniff(path: Path) -> str | None:
    """The container a file's first bytes name, "dds" or "ktx2" (None: neither, or unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return None
    if head[:4] == b"DDS ":
        return "dds"
    if head == IDENTIFIER:
        return "ktx2"
    return None


def is_block_file(path: str | os.PathLike[str]) -> bool:
    """True for a path named .dds/.ktx2 or whose first bytes are a DDS or KTX2 identifier."""
    p = Path(path)
    if p.suffix.lower() in (".dds", ".ktx2"):
        return True
    return p.is_file() and sniff(p) is not None


def read_block_file(path: str | os.PathLike[str]) -> BlockTexture:
    """Parse a DDS or KTX2 file (told apart by its identifier, else by its suffix).

    Parameters
    ----------
    path
        a local file

    Returns
    -------
    BlockTexture
        its block format, sRGB flag (None when the file does not say) and levels

    Raises
    ------
    SourceError
        one line naming the file: malformed, truncated, or a format that cannot be re-tiled
        losslessly (then it says what to do instead)
    """
    if "://" in str(path):
        raise SourceError(f"{path}: DDS and KTX2 files are read from a local path; download it first")
    p = Path(path)
    kind = sniff(p) if p.is_file() else None
    if kind is None:
        kind = {".dds": "dds", ".ktx2": "ktx2"}.get(p.suffix.lower())
    if kind == "dds":
        return read_dds(p)
    if kind == "ktx2":
        return read_ktx2(p)
    raise SourceError(f"{p}: not a DDS or KTX2 file")
