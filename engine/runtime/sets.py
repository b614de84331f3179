"""`TextureSet`: the textures of one material streamed as one, and the streamer's verbs for sets.

A set's members are ordinary `VirtualTexture` handles (declared with ``VT_DECLARE``, sampled with
``VT_SAMPLE``, bound with ``member.bind`` or `TextureSet.bind`), opened by `Streamer.open_set`. Only
the set's lead writes feedback; the residency core maps the lead's wanted pages onto the other
members (`texture_sets.SetTable`), so a four-texture material costs one texture's feedback. The
lead must therefore be sampled by every draw that samples the set (a material shader samples all its
textures; one that samples only the normal map should open it on its own).

This module holds the set handle and `SetVerbs`, the part of `Streamer` that opens sets and keeps
each pack's priority (a mixin, like `views.StreamerViews`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import moderngl

from ..errors import EngineError
from .origin import Origin
from .texture import VirtualTexture
from .texture_sets import check_priority, choose_lead

if TYPE_CHECKING:
    from .residency import Residency
    from .sharing import OpenPacks

__all__ = ["SetVerbs", "TextureSet"]

log = logging.getLogger(__name__)


class TextureSet(Mapping[str, VirtualTexture]):
    """The textures of one material, made by `Streamer.open_set`: one feedback write per fragment
    and one request stream for all of them (docs/priorities.md).

    A mapping of member names to `VirtualTexture` handles (``tset["normal"]``); members may differ
    in size, tile size and format. A member closed on its own leaves the set (the set names a new
    lead if it was the lead).

    Attributes
    ----------
    members : Mapping[str, VirtualTexture]
        The open members by name (read-only view).
    lead : str
        The member whose feedback stands for the set (the one with the finest texels).
    closed : bool
        True once the set or its streamer is closed.
    """

    def __init__(
        self,
        members: dict[str, VirtualTexture],
        priority: float,
        *,
        on_close: Callable[[TextureSet], None],
    ) -> None:
        self._members = dict(members)
        self._priority = priority
        self._on_close = on_close
        self.key = -1  # the residency core's set number (SetVerbs keeps it)
        self.closed = False
        self.lead = ""
        self.elect()

    # ---- the mapping ----------------------------------------------------------------------------
    def __getitem__(self, name: str) -> VirtualTexture:
        try:
            return self._members[name]
        except KeyError:
            raise KeyError(f"texture set has no member {name!r}; members: {', '.join(self._members)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    @property
    def members(self) -> Mapping[str, VirtualTexture]:
        return MappingProxyType(self._members)

    # ---- state ----------------------------------------------------------------------------------
    def elect(self) -> None:
        """Name the lead (the finest member) and set every member's feedback bit accordingly."""
        names = list(self._members)
        self.lead = names[choose_lead([self._members[n].header for n in names])] if names else ""
        for name, vt in self._members.items():
            vt.writes_feedback = name == self.lead

    def drop(self, vt: VirtualTexture) -> bool:
        """Forget a member closed on its own; True if it was one."""
        names = [n for n, m in self._members.items() if m is vt]
        for n in names:
            del self._members[n]
        if names:
            vt.writes_feedback = True
            self.elect()
        return bool(names)

    @property
    def priority(self) -> float:
        """The set's priority, every member's (default 1; > 1 keeps the set sharper under pressure,
        < 1 lets it give way first). Setting it sets each member's `VirtualTexture.priority`."""
        return self._priority

    @priority.setter
    def priority(self, value: float) -> None:
        self._priority = check_priority(value)
        for vt in self._members.values():
            vt.priority = self._priority

    def bind(self, program: moderngl.Program, names: Mapping[str, str] | str = "") -> None:
        """Bind members for the next draws with `program` (each as `VirtualTexture.bind` does).

        Parameters
        ----------
        program : moderngl.Program
            A program whose shaders declare the members with ``VT_DECLARE``.
        names : Mapping[str, str] or str, optional
            Member name -> ``VT_DECLARE`` name for the members to bind (others are left alone); or a
            prefix: every member bound as prefix + its member name (default: the member names).

        Raises
        ------
        EngineError
            The set is closed, or the program lacks a member's ``VT_DECLARE``.
        KeyError
            `names` names a member the set does not have.
        """
        if self.closed:
            raise EngineError("texture set is closed")
        if isinstance(names, str):
            pairs = [(n, names + n) for n in self._members]
        else:
            pairs = [(n, names[n]) for n in names]
        for member, uniform in pairs:
            self[member].bind(program, uniform)

    def close(self) -> None:
        """Close every member (same as ``streamer.close(tset)``); closing twice does nothing."""
        if not self.closed:
            self._on_close(self)

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={vt.header.width}x{vt.header.height}" for n, vt in self._members.items())
        return f"TextureSet(lead={self.lead!r}, {inner}{', closed' if self.closed else ''})"


class SetVerbs:
    """`Streamer.open_set` and the bookkeeping of sets and priorities (a mixin of `Streamer`)."""

    _core: Residency
    _packs: OpenPacks[VirtualTexture]
    _sets: list[TextureSet]
    _check_open: Callable[[], None]
    open: Callable[..., VirtualTexture]
    close: Callable[..., None]

    def open_set(
        self,
        sources: Mapping[str, str | os.PathLike[str]],
        *,
        priority: float = 1.0,
        origin: Origin | str | None = None,
        **open_kw: object,
    ) -> TextureSet:
        """Open the textures of one material as a `TextureSet`: they share one feedback write per
        fragment (the lead's) and one request stream, and carry one priority.

        Parameters
        ----------
        sources : Mapping[str, str or os.PathLike]
            Member name -> anything `open` takes (pack, image, DDS/KTX2 file, URL). Members may differ
            in size and format.
        priority : float, optional
            The set's priority (default 1; docs/priorities.md).
        origin : Origin or str, optional
            Every member's texture-coordinate origin (default: `open`'s).
        **open_kw
            Passed to `open` for every member (``progress=``).

        Returns
        -------
        TextureSet
            Members by name; the lead is the member with the finest texels.

        Raises
        ------
        ValueError, TypeError
            No members, a member name that is not a non-empty string, or a bad priority.
        Any error of `open`
            For the first member that cannot be opened; the members opened before it are closed again.
        """
        self._check_open()
        priority = check_priority(priority)
        if not isinstance(sources, Mapping) or not sources:
            raise ValueError("a texture set needs a mapping of at least one member name to its source")
        bad = [n for n in sources if not isinstance(n, str) or not n]
        if bad:
            raise ValueError(f"texture set member names must be non-empty strings, got {bad[0]!r}")
        kw = dict(open_kw) | ({"origin": origin} if origin is not None else {})
        opened: dict[str, VirtualTexture] = {}
        try:
            for name, src in sources.items():
                opened[name] = self.open(src, priority=priority, **kw)
        except BaseException:
            for vt in opened.values():
                self.close(vt)
            raise
        tset = TextureSet(opened, priority, on_close=self._close_set)
        self._sets.append(tset)
        self._register_set(tset)
        log.info("opened texture set %s", tset)
        return tset

    def _register_set(self, tset: TextureSet) -> None:
        """(Re)tell the residency core who leads the set and who follows."""
        core = self._core
        if tset.key >= 0:
            core.sets.remove(tset.key)
            tset.key = -1
        if tset.lead:
            members = [vt.id for vt in tset.members.values()]
            tset.key = core.sets.add(tset[tset.lead].id, members, core.headers)

    def _close_set(self, tset: TextureSet) -> None:
        if tset.key >= 0:
            self._core.sets.remove(tset.key)
            tset.key = -1
        tset.closed = True
        self._sets = [s for s in self._sets if s is not tset]
        for vt in list(tset.members.values()):
            self.close(vt)

    def _member_closed(self, vt: VirtualTexture) -> None:
        """A handle closed: it leaves any set it belonged to; its pack's priority follows the others."""
        for tset in self._sets:
            if tset.drop(vt):
                self._register_set(tset)
        self._on_priority(vt.id)

    def _on_priority(self, tex: int) -> None:
        """Stream a pack at the highest priority any of its handles has."""
        handles = self._packs.handles(tex)
        if handles:
            self._core.priority.set(tex, max(h.priority for h in handles))
