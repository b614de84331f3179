"""Which packs a streamer has open, and the handles on each (`OpenPacks`). No GL.

Opening a pack that is already open gives a second `VirtualTexture` handle on the same texture id:
the same tiles, one page table, one share of the cache and of the I/O. A pack is "the same" when it
is the same file (device, inode, size and modification time: a pack rewritten in place since is a
new pack) or the same URL. The residency goes when its last handle closes.
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from .tiles import MAX_TEXTURES


class Handle(Protocol):
    """What `OpenPacks` needs of a texture handle (`texture.VirtualTexture` is one)."""

    id: int
    closed: bool


class PackFile(Protocol):
    """What `pack_identity` needs of a pack reader: where it was opened from."""

    @property
    def path(self) -> Path | str: ...


VirtualTexture = TypeVar("VirtualTexture", bound=Handle)

__all__ = ["OpenPacks", "pack_identity"]


def pack_identity(reader: PackFile) -> Hashable:
    """What makes two opens the same pack: the file's identity, or the URL."""
    if isinstance(reader.path, str):
        return ("url", reader.path)
    st = os.stat(reader.path)
    return ("file", st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class OpenPacks(Generic[VirtualTexture]):
    """Handles per texture id, in opening order, and the identity of each open pack."""

    def __init__(self) -> None:
        self._handles: dict[int, list[VirtualTexture]] = {}
        self._identity: dict[Hashable, int] = {}
        self._identity_of: dict[int, Hashable] = {}

    def __len__(self) -> int:
        return len(self._handles)

    def free_id(self) -> int:
        return next(i for i in range(MAX_TEXTURES) if i not in self._handles)

    def find(self, identity: Hashable) -> VirtualTexture | None:
        """An open handle on the pack of `identity`, or None."""
        tex = self._identity.get(identity)
        return self._handles[tex][0] if tex is not None else None

    def add(self, vt: VirtualTexture, identity: Hashable | None = None) -> VirtualTexture:
        """Record a handle (with `identity` for the first handle of a pack)."""
        self._handles.setdefault(vt.id, []).append(vt)
        if identity is not None:
            self._identity[identity] = vt.id
            self._identity_of[vt.id] = identity
        return vt

    def handles(self, tex: int) -> list[VirtualTexture]:
        return list(self._handles.get(tex, ()))

    def remove(self, vt: VirtualTexture) -> bool:
        """Forget a handle; False if it was not open. The pack is forgotten with its last handle."""
        handles = self._handles.get(vt.id)
        if not handles or not any(h is vt for h in handles):
            return False
        handles[:] = [h for h in handles if h is not vt]
        if not handles:
            del self._handles[vt.id]
            identity = self._identity_of.pop(vt.id, None)
            if identity is not None:
                del self._identity[identity]
        return True

    def primaries(self) -> list[VirtualTexture]:
        """One handle per open pack (its oldest open one)."""
        return [hs[0] for hs in self._handles.values()]

    def close_all(self) -> list[VirtualTexture]:
        """Mark every handle closed and forget them; returns one handle per pack (to close readers)."""
        out = self.primaries()
        for hs in self._handles.values():
            for h in hs:
                h.closed = True
        self._handles.clear()
        self._identity.clear()
        self._identity_of.clear()
        return out
