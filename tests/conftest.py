"""The suite's GL context and GL error checks come from texstream's own pytest plugin
(`texstream.testing.plugin`): the ``gl_context`` fixture (one headless EGL context per session) and,
for every test using it, GL_NO_ERROR before and after the test, so a test that leaves an error behind
fails itself instead of a later one. Mark GL tests with ``@pytest.mark.gl``.

Without a GL context or the compiled helper, the tests that need them skip, so `make test` passes
on any machine; ``TEXSTREAM_REQUIRE=gl,native`` (what `.ci/run` sets, with nginx, cluster, docs and
demos) turns those skips into failures, so CI cannot pass by silently testing less. The `xvfb` fixture
is a private X server for the windowed tests.
"""

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator

import pytest

# A shell starts a background job (`make test &`, a CI step run with `&`) with SIGINT ignored, and
# processes inherit that: the Ctrl-C tests would then see no interrupt at all. The suite restores
# Python's own handler, and the programs it starts get the default action back at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="module")
def xvfb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private Xvfb server (GLX through Mesa llvmpipe); yields its DISPLAY; stopped afterwards."""
    exe = shutil.which("Xvfb")
    if exe is None:
        pytest.skip("Xvfb is not installed (apt-get install xvfb): windowed tests need an X server")
    log = tmp_path_factory.mktemp("xvfb") / "xvfb.log"
    read_fd, write_fd = os.pipe()
    # -displayfd: the server picks a free display number and writes it once it accepts connections
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [exe, "-displayfd", str(write_fd), "-screen", "0", "1280x720x24", "-nolisten", "tcp"],
            pass_fds=(write_fd,),
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
        )
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as r:
            number = r.readline().strip()  # empty when the server exited first
        if not number:
            proc.wait(timeout=10)
            pytest.fail(f"Xvfb did not start (exit {proc.returncode}): {log.read_text(errors='replace')[-500:]}")
        yield f":{number.decode()}"
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
