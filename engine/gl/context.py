"""GL context creation for headless runs: EGL, with one clear error when there is none."""

from __future__ import annotations

import moderngl

from ..errors import GLError

REQUIRED_VERSION = 450


def headless_context() -> moderngl.Context:
    """A standalone GL 4.5 core context through EGL (no display needed)."""
    try:
        ctx = moderngl.create_context(standalone=True, backend="egl", require=REQUIRED_VERSION)
    except Exception as exc:  # moderngl/glcontext raise plain Exceptions with multi-line text
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GLError(f"no GL context: EGL could not create an OpenGL 4.5 context ({first})") from None
    return ctx
