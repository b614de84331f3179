"""Interrupting a bake: Ctrl-C and SIGTERM always win, leave nothing behind and end every worker,
within a bounded time; workers are not forked from the bake process and die with it."""

from __future__ import annotations

import ctypes
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from texstream.bake import bake, bands, jobs, workers
from texstream.bake.source import VipsSource
from texstream.config import BakeConfig
from texstream.pack import TexelFormat

from .conftest import leftovers

ABORT_S = 5.0  # an interrupted bake exits within this (it takes ~0.2 s)
GONE_S = 3.0  # its workers are gone within this after it exits or is killed


# ---- processes ------------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of a live process, None when gone (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(rest[1]), rest[0]) if rest[0] not in "ZX" else None


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            children.setdefault(st[0], []).append(int(name))
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def _alive(pids: set[int], within: float) -> set[int]:
    deadline = time.monotonic() + within
    while (alive := {p for p in pids if _stat(p) is not None}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


@pytest.fixture(scope="module")
def big_png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4608 x 4096 PNG: over Pillow's limit, so it streams through libvips (the path whose logging
    callback swallowed interrupts); BC7 makes its bake take a few seconds on two jobs."""
    import pyvips

    xy = pyvips.Image.xyz(4608, 4096)
    img = (xy[0] * 7 + xy[1] * 3).bandjoin([xy[0] ^ xy[1], xy[1] * 2, 255]).cast("uchar")
    path = tmp_path_factory.mktemp("src") / "big.png"
    img.pngsave(str(path), compression=1)
    return path


def _start_bake(src: Path, out: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "texstream",
        "bake",
        str(src),
        str(out),
        "--format",
        "bc7",
        "--bc7-quality",
        "normal",  # "fast" now finishes before the signal of a late trial
        "--jobs",
        "2",
        "--no-progress",
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_running(proc: subprocess.Popen, folder: Path, workers_at_least: int = 0) -> set[int]:
    """Wait until the bake writes its temporary pack (and has that many descendants); return them."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        family = _descendants(proc.pid)
        if list(folder.glob(".*.tmp")) and len(family) >= workers_at_least:
            return family
        time.sleep(0.02)
    raise AssertionError(f"the bake did not start (exit {proc.poll()}): {proc.stderr.read() if proc.stderr else ''}")


@pytest.mark.parametrize(("signum", "group", "code"), [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)])
def test_signals_abort_the_cli_bake_cleanly(
    big_png: Path, tmp_path: Path, signum: signal.Signals, group: bool, code: int
) -> None:
    """At random moments of the bake: exit 130 (Ctrl-C to the process group) or 143 (SIGTERM to the
    process), one line on stderr, no pack and no temporary file, no process of the bake left."""
    rng = random.Random(signum)
    for trial in range(4):
        folder = tmp_path / f"t{trial}"
        folder.mkdir()
        proc = _start_bake(big_png, folder / "out.tpk")
        try:
            _wait_running(proc, folder)
            time.sleep(rng.uniform(0.0, 1.5))
            family = _descendants(proc.pid)
            t0 = time.monotonic()
            os.killpg(proc.pid, signum) if group else proc.send_signal(signum)
            out, err = proc.communicate(timeout=60)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert proc.returncode == code, (trial, proc.returncode, err)
        assert err == "texstream bake: interrupted\n" and out == "", (trial, err)
        assert took < ABORT_S, (trial, took)
        assert leftovers(folder) == [], trial
        assert _alive(family, GONE_S) == set(), trial


def test_workers_die_with_a_killed_bake(big_png: Path, tmp_path: Path) -> None:
    proc = _start_bake(big_png, tmp_path / "out.tpk")
    try:
        family = _wait_running(proc, tmp_path, workers_at_least=4)  # fork server, tracker, 2 workers
        time.sleep(0.3)
        proc.kill()
        proc.wait(timeout=10)
        assert _alive(family, GONE_S) == set()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---- in this process -------------------------------------------------------------------------------
def _cfg(**kw: object) -> BakeConfig:
    base: dict = {"texel_format": TexelFormat.RGBA8, "tile_size": 64, "progress": False}
    base.update(kw)
    return BakeConfig(**base)


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


class InterruptedInCallback:
    """Read by the main process; on one band it gets Ctrl-C while Python runs inside a C library's
    callback (qsort's comparator, as pyvips' log handler is called from libvips): an exception a
    signal handler raised there would be printed and lost, and the bake would finish."""

    name, width, height, channels = "cb", 64, 2000, 4

    def read_rows(self, y0: int, y1: int) -> np.ndarray:
        if y0 <= 1000 < y1:

            def compare(a: int, b: int) -> int:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)  # the handler runs here, inside the callback
                return 0

            values = (ctypes.c_int * 2)(1, 2)
            ctypes.CDLL(None).qsort(values, 2, ctypes.sizeof(ctypes.c_int), _CALLBACK(compare))
        return np.zeros((y1 - y0, self.width, 4), np.uint8)


@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_inside_a_library_callback_still_interrupts(tmp_path: Path, small_bands: None, jobs: int) -> None:
    with pytest.raises(KeyboardInterrupt):
        bake(InterruptedInCallback(), tmp_path / "x.tpk", _cfg(jobs=jobs))
    assert leftovers(tmp_path) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_the_interrupt_wins_over_the_error_it_causes(tmp_path: Path) -> None:
    def handler(signum: int, frame: object) -> None:
        raise SystemExit(99)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(SystemExit) as info, workers.signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            raise RuntimeError("a worker died of the same signal")
    finally:
        signal.signal(signal.SIGTERM, old)
    assert info.value.code == 99


def test_workers_are_not_forked_from_the_bake_process() -> None:
    """Workers come from a single-threaded fork server (or are spawned), never from this process,
    which runs threads; and they stop at once when killed."""
    from texstream.bake.mips import Transfer
    from texstream.pack import PackHeader

    state = bands.WorkerState(jobs.Settings(PackHeader(width=64, height=64), Transfer(True, True), "fast", 3))
    pool = workers.WorkerPool(2, bands.init_worker, (state,), bands.run_job)
    try:
        for pid in pool.pids:
            st = _stat(pid)
            assert st is not None and st[0] != os.getpid()
            assert len(os.listdir(f"/proc/{st[0]}/task")) == 1  # the server runs no thread
    finally:
        t0 = time.monotonic()
        pool.kill()
        assert time.monotonic() - t0 < 1
    assert all(_stat(pid) is None for pid in pool.pids)


def test_libvips_reads_run_no_python_logging_callback(tmp_path: Path) -> None:
    """libvips' info messages (one per pixel read) no longer run Python code inside libvips."""
    import pyvips

    path = tmp_path / "s.png"
    pyvips.Image.black(300, 700, bands=3).pngsave(str(path))
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("pyvips")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        src = VipsSource(path)
        for y in range(0, 700, 100):
            src.read_rows(y, y + 100)
        assert [r.getMessage() for r in records if r.levelno >= logging.INFO] == []
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
