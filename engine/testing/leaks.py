"""Which GL objects a test left behind, and who made them: texstream, or the test itself.

The `streamer` fixture fails a test for the objects texstream made and did not release (a leak in
texstream, or a `Streamer`/`VirtualTexture` the test did not release). Objects the test made itself
through the moderngl context (framebuffers, their renderbuffers, programs, buffers) are the test's
business unless strict checking is asked for: moderngl's ``Framebuffer.release()`` leaves the
renderbuffers ``ctx.simple_framebuffer`` made, so a clean test would fail otherwise.

Who made an object is decided when it is made: while the check runs, the context's object-making
methods are wrapped (on that context object only, and put back afterwards), and an object belongs
to the test when the code that asked moderngl for it is outside the texstream package. Objects made
with raw GL calls of the test's own (PyOpenGL) cannot be told apart and count as texstream's; the
message says so.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..gl.gl_ext import GLExt

# moderngl's object-making methods and the kind of GL object each makes (as `GLExt.live_names`).
MAKERS = {
    "buffer": "buffers",
    "texture": "textures",
    "texture_array": "textures",
    "texture3d": "textures",
    "texture_cube": "textures",
    "depth_texture": "textures",
    "depth_texture_cube": "textures",
    "renderbuffer": "renderbuffers",
    "depth_renderbuffer": "renderbuffers",
    "framebuffer": "framebuffers",
    "vertex_array": "vertex_arrays",
    "program": "programs",
    "compute_shader": "programs",
}  # moderngl's queries have no name until first used: a test's leaked query counts as texstream's
_PACKAGE = str(Path(__file__).resolve().parents[1])  # texstream's own source folder


def _frame_is_texstream(filename: str) -> bool:
    return str(Path(filename).resolve()).startswith(_PACKAGE)


def _made_by_texstream(depth: int) -> bool:
    """Whether the first caller outside moderngl (and outside this wrapper) is texstream's code."""
    frame = sys._getframe(depth)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module != __name__ and module != "moderngl" and not module.startswith("moderngl."):
            return _frame_is_texstream(frame.f_code.co_filename)
        frame = frame.f_back  # type: ignore[assignment]
    return False


@dataclass
class Leaks:
    """The objects left behind, by kind: made by texstream, and made by the test."""

    texstream: dict[str, int]
    test: dict[str, int]

    def message(self, strict: bool) -> str | None:
        """The failure message, or None when nothing counts as left behind."""
        parts = []
        if self.texstream:
            parts.append(
                f"GL objects made by texstream left behind after the test: {self.texstream} "
                "(release every Streamer and VirtualTexture the test opened, and what texstream.program made"
                "; objects the test made with raw GL calls count here too)"
            )
        if strict and self.test:
            hint = ""
            if self.test.get("renderbuffers"):
                hint = (
                    "; moderngl's Framebuffer.release() leaves its attachments: release "
                    "fbo.color_attachments and fbo.depth_attachment too"
                )
            parts.append(f"GL objects made by the test left behind (strict check): {self.test}{hint}")
        return "\n".join(parts) or None


@dataclass
class ObjectOrigins:
    """Records the names of the GL objects the test makes through one moderngl context."""

    ctx: Any
    by_test: dict[str, set[int]] = field(default_factory=dict)

    @contextmanager
    def recording(self) -> Iterator[None]:
        originals: dict[str, Callable[..., Any]] = {}
        for method, kind in MAKERS.items():
            original = getattr(self.ctx, method, None)
            if original is None:
                continue
            originals[method] = original
            setattr(self.ctx, method, self._wrap(original, kind))
        try:
            yield
        finally:
            for method in originals:
                delattr(self.ctx, method)  # the class's method shows through again

    def _wrap(self, original: Callable[..., Any], kind: str) -> Callable[..., Any]:
        def make(*args: Any, **kwargs: Any) -> Any:
            obj = original(*args, **kwargs)
            name = getattr(obj, "glo", None)
            if isinstance(name, int) and name > 0 and not _made_by_texstream(2):
                self.by_test.setdefault(kind, set()).add(name)
            return obj

        make.__wrapped__ = original  # type: ignore[attr-defined]
        return make


@contextmanager
def leak_check(ctx: Any) -> Iterator[Callable[[], Leaks]]:
    """Within the block, record who makes GL objects on `ctx`; the yielded function, called after
    everything that should be released was, returns what was left behind since the block began."""
    gl = GLExt(ctx)
    before = gl.live_names()
    origins = ObjectOrigins(ctx)

    def left() -> Leaks:
        after = gl.live_names()
        texstream: dict[str, int] = {}
        test: dict[str, int] = {}
        for kind, names in after.items():
            new = names - before.get(kind, frozenset())
            mine = new & origins.by_test.get(kind, set())
            if mine:
                test[kind] = len(mine)
            if len(new) - len(mine):
                texstream[kind] = len(new) - len(mine)
        return Leaks(texstream, test)

    with origins.recording():
        yield left
