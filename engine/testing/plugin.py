"""The pytest plugin of `texstream.testing` (entry point ``pytest11``: ``texstream``).

Fixtures
--------
gl_context
    A headless OpenGL 4.5 core context through EGL, one per session. Without one the test is
    skipped with the reason, or fails with ``--texstream-require-gl`` (or ``TEXSTREAM_REQUIRE=gl``,
    for CI that must not pass by testing less). Every test using it starts and ends with no GL error
    pending.
streamer
    A `Streamer` on `gl_context` with a 64 MiB budget, released after the test; the test fails if
    GL objects texstream made during it are left behind (an unreleased `Streamer`, `VirtualTexture`
    or `texstream.program`). Objects the test made through the context are its own business, unless
    strict checking is asked for (the ``texstream_strict_gl`` marker or ``--texstream-strict-gl``):
    then every object left in the context fails the test.
golden
    ``golden(image)`` compares `image` with ``golden/<test name>.png`` beside the test file (the
    ``texstream_golden(name=None, min_psnr=45.0, folder=None)`` marker changes either; a relative
    `folder` is relative to the test file's folder, and it must lie inside the pytest rootdir);
    ``--texstream-update-golden`` writes the file instead. A mismatch writes actual, expected and
    difference images under ``texstream-artifacts/<test>/`` (``--texstream-artifacts DIR``) and names them.
texstream_artifacts
    That per-test folder, for `assert_image_close(..., out_dir=texstream_artifacts)`.

A test that failed gets no second error from these fixtures (no leak check, no "never called
golden"): its own failure says what went wrong. The plugin changes nothing for tests that use none
of these; ``-p no:texstream`` turns it off.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from .images import assert_image_close, read_png, safe_name, write_png

__all__ = ["GoldenImage"]

DEFAULT_BUDGET_MB = 64.0
GOLDEN_MARKER = "texstream_golden"
STRICT_MARKER = "texstream_strict_gl"
_CALL_FAILED = pytest.StashKey[bool]()  # set on a test item whose setup or call failed


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("texstream", "texstream rendering tests")
    group.addoption(
        "--texstream-require-gl",
        action="store_true",
        help="fail, instead of skipping, tests that need a GL 4.5 context when there is none",
    )
    group.addoption(
        "--texstream-update-golden",
        action="store_true",
        help="write the golden images of texstream_golden tests instead of comparing with them",
    )
    group.addoption(
        "--texstream-strict-gl",
        action="store_true",
        help="the streamer fixture fails a test for every GL object left in the context, not only those texstream made",
    )
    group.addoption(
        "--texstream-artifacts",
        default=None,
        metavar="DIR",
        help="folder for the actual/expected/diff images of failed comparisons "
        "(default: texstream-artifacts under the rootdir)",
    )


def pytest_configure(config: pytest.Config) -> None:
    from .._shadow import shadow_message, shadowing_folder

    if (folder := shadowing_folder()) is not None:  # texstream's own tests would fail without saying why
        config.issue_config_time_warning(pytest.PytestConfigWarning(shadow_message(folder)), stacklevel=2)
    config.addinivalue_line(
        "markers",
        f"{GOLDEN_MARKER}(name=None, min_psnr=45.0, folder=None): the image given to the `golden` fixture is "
        "compared with golden/<name>.png (beside the test file, or in `folder`, relative to the test file's "
        "folder and inside the rootdir)",
    )
    config.addinivalue_line(
        "markers",
        f"{STRICT_MARKER}: the streamer fixture fails the test for every GL object left in the context, "
        "including those the test made itself",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    report = yield
    if report.when in ("setup", "call") and report.failed:
        item.stash[_CALL_FAILED] = True
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    return request.node.stash.get(_CALL_FAILED, False)


def _required(config: pytest.Config) -> bool:
    listed = {r.strip() for r in os.environ.get("TEXSTREAM_REQUIRE", "").split(",")}
    return bool(config.getoption("--texstream-require-gl")) or "gl" in listed


def _gl_errors(ctx: object, limit: int = 16) -> list[str]:
    errors = []
    for _ in range(limit):
        err = ctx.error  # type: ignore[attr-defined]
        if err == "GL_NO_ERROR":
            break
        errors.append(err)
    return errors


@pytest.fixture(scope="session")
def gl_context(request: pytest.FixtureRequest) -> Iterator[object]:
    """A standalone OpenGL 4.5 core context through EGL (see the module docstring)."""
    from .._shadow import shadow_message, shadowing_folder

    if (folder := shadowing_folder()) is not None:
        pytest.fail(shadow_message(folder), pytrace=False)
    from ..errors import GLError
    from ..gl.context import headless_context

    try:
        ctx = headless_context()
    except GLError as exc:
        if _required(request.config):
            pytest.fail(
                f"a GL context is required (--texstream-require-gl / TEXSTREAM_REQUIRE=gl): {exc}", pytrace=False
            )
        pytest.skip(f"no headless OpenGL 4.5 context through EGL: {exc}")
    try:
        yield ctx
    finally:
        ctx.release()


@pytest.fixture(autouse=True)
def _texstream_gl_errors(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests using `gl_context` start and end with no GL error pending."""
    if "gl_context" not in request.fixturenames:
        yield
        return
    ctx = request.getfixturevalue("gl_context")
    before = _gl_errors(ctx)
    if before:
        pytest.fail(f"GL errors pending before the test (left by a fixture or an earlier test): {before}")
    yield
    after = _gl_errors(ctx)
    assert not after, f"the test left GL errors behind: {after}"


@pytest.fixture
def streamer(request: pytest.FixtureRequest, gl_context: object) -> Iterator[object]:
    """A `Streamer` with a 64 MiB budget, released after the test, GL leaks checked."""
    from ..config import BudgetConfig, StreamerConfig
    from ..runtime.streamer import Streamer
    from .leaks import leak_check

    strict = bool(request.config.getoption("--texstream-strict-gl")) or (
        request.node.get_closest_marker(STRICT_MARKER) is not None
    )
    with leak_check(gl_context) as left_behind:
        s = Streamer(gl_context, StreamerConfig(budget=BudgetConfig(budget_mb=DEFAULT_BUDGET_MB)))  # type: ignore[arg-type]
        try:
            yield s
        finally:
            s.release()
    if _failed(request):
        return
    message = left_behind().message(strict)
    if message:
        pytest.fail(message, pytrace=False)


@pytest.fixture
def texstream_artifacts(request: pytest.FixtureRequest) -> Path:
    """This test's folder for images written by failed comparisons (created when first written)."""
    base = request.config.getoption("--texstream-artifacts")
    root = Path(base) if base else Path(request.config.rootpath) / "texstream-artifacts"
    return root / safe_name(request.node.nodeid)


@dataclass
class GoldenImage:
    """The `golden` fixture: call it with the image to compare (or to store, when updating)."""

    path: Path
    min_psnr: float
    update: bool
    artifacts: Path
    calls: int = field(default=0, init=False)

    def __call__(self, image: np.ndarray) -> float | None:
        """Compare `image` with the golden PNG (returns the PSNR), or write it with
        ``--texstream-update-golden`` (returns None)."""
        self.calls += 1
        image = np.asarray(image)
        if self.update:
            write_png(image, self.path)
            return None
        if not self.path.is_file():
            raise AssertionError(f"no golden image {self.path}: run pytest with --texstream-update-golden to write it")
        reference = read_png(self.path)
        return assert_image_close(image, reference, self.min_psnr, name=self.path.stem, out_dir=self.artifacts)


def _golden_folder(request: pytest.FixtureRequest, folder: object) -> Path:
    """The marker's `folder` resolved against the test file's folder; refused outside the rootdir
    (a golden image is part of the project, and `--texstream-update-golden` writes there)."""
    here = Path(request.node.path).parent
    if not folder:
        return here / "golden"
    resolved = (here / Path(str(folder))).resolve()
    root = Path(request.config.rootpath).resolve()
    if not resolved.is_relative_to(root):
        pytest.fail(
            f"{GOLDEN_MARKER}(folder={str(folder)!r}) resolves to {resolved}, outside the project's "
            f"rootdir {root}: keep golden images inside the project",
            pytrace=False,
        )
    return resolved


@pytest.fixture
def golden(request: pytest.FixtureRequest, texstream_artifacts: Path) -> Iterator[GoldenImage]:
    marker = request.node.get_closest_marker(GOLDEN_MARKER)
    kwargs = dict(marker.kwargs) if marker is not None else {}
    name = kwargs.get("name") or (marker.args[0] if marker is not None and marker.args else None)
    folder = _golden_folder(request, kwargs.get("folder"))
    check = GoldenImage(
        folder / f"{safe_name(name or request.node.name)}.png",
        float(kwargs.get("min_psnr", 45.0)),
        bool(request.config.getoption("--texstream-update-golden")),
        texstream_artifacts,
    )
    yield check
    if marker is not None and check.calls == 0 and not _failed(request):
        pytest.fail(f"{request.node.name} is marked {GOLDEN_MARKER} but never called golden(image)", pytrace=False)
