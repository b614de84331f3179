"""Shared fixtures: one headless EGL GL context per session, and a GL error check for `gl` tests.

Mark GL tests with ``@pytest.mark.gl`` (or ``pytestmark = pytest.mark.gl`` in the module) and take
the ``gl_ctx`` fixture. Every `gl` test starts and ends with no pending GL error (glGetError ==
GL_NO_ERROR), so a test that leaves an error behind fails itself instead of a later one.

Without a GL context or the compiled helper, the tests that need them skip, so `make test` passes
on any machine; ``TEXSTREAM_REQUIRE=gl,native`` (what `.ci/run` sets) turns those skips into failures,
so CI cannot pass by silently testing less.
"""

from __future__ import annotations

from collections.abc import Iterator

import moderngl
import pytest

from .require import skip_unless_required


@pytest.fixture(scope="session")
def gl_ctx() -> Iterator[moderngl.Context]:
    """A standalone OpenGL 4.5 core context through EGL; the tests are skipped without one."""
    from texstream.errors import GLError
    from texstream.gl.context import headless_context

    try:
        ctx = headless_context()
    except GLError as exc:
        skip_unless_required("gl", f"no headless OpenGL 4.5 context through EGL: {exc}")
    try:
        yield ctx
    finally:
        ctx.release()


def gl_errors(ctx: moderngl.Context, limit: int = 16) -> list[str]:
    """Drain and return every pending GL error name (empty when there is none)."""
    errors: list[str] = []
    for _ in range(limit):
        err = ctx.error
        if err == "GL_NO_ERROR":
            break
        errors.append(err)
    return errors


@pytest.fixture(autouse=True)
def _gl_error_check(request: pytest.FixtureRequest) -> Iterator[None]:
    """For tests marked `gl`: assert GL_NO_ERROR before and after the test."""
    if request.node.get_closest_marker("gl") is None:
        yield
        return
    ctx: moderngl.Context = request.getfixturevalue("gl_ctx")
    before = gl_errors(ctx)
    if before:
        pytest.fail(f"GL errors pending before the test (left by a fixture or an earlier test): {before}")
    yield
    after = gl_errors(ctx)
    assert not after, f"the test left GL errors behind: {after}"
