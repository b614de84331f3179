"""Bakes on a Dask cluster (`BakeConfig.cluster`, `--cluster`): a real LocalCluster of two worker
processes; the pack equals a local bake's with as many jobs, byte for byte, even when a worker is
killed mid-bake; failures and interrupts are one line, a non-zero exit and nothing written."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from texstream.bake import bake, bake_file, bake_procedural, jobs
from texstream.bake.source import ArraySource, open_source
from texstream.config import BakeConfig
from texstream.errors import EngineError
from texstream.pack import AddressMode, PackReader, TexelFormat

from .require import skip_unless_required

WORKERS = 2  # the cluster's worker processes, one thread each: local bakes compared use as many jobs


def require_dask() -> None:
    """Skip without dask[distributed] (the cluster extra), or fail when TEXSTREAM_REQUIRE lists cluster."""
    try:
        import distributed  # noqa: F401
    except ImportError as exc:
        skip_unless_required("cluster", f"dask[distributed] is not installed ({exc}): pip install '.[cluster]'")


@pytest.fixture(scope="module")
def dask_cluster() -> Iterator[object]:
    """A LocalCluster of 2 worker processes and a client of it (to find and kill workers)."""
    require_dask()
    import logging

    from distributed import Client, LocalCluster

    options = dict(threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)
    cluster = LocalCluster(n_workers=WORKERS, silence_logs=logging.ERROR, **options)
    client = Client(cluster, set_as_default=False)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture
def address(dask_cluster: object) -> str:
    return dask_cluster.scheduler.address  # type: ignore[attr-defined]


@pytest.fixture
def small_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small bands (planned in this process): many tasks per stage, several stages, on small images."""
    monkeypatch.setattr(jobs, "BAND_BYTES", 1 << 18)
    monkeypatch.setattr(jobs, "FINAL_BYTES", 1 << 14)


def assert_same_pack(local: Path, clustered: Path) -> None:
    """Index (offsets, sizes, checksums) and every tile equal, then the whole file."""
    with PackReader(local) as a, PackReader(clustered) as b:
        assert a.header == b.header
        np.testing.assert_array_equal(a.index["checksum"], b.index["checksum"])
        h = a.header
        for level in range(h.level_count):
            tx, ty = h.tiles_in_level(level)
            for y in range(ty):
                for x in range(tx):
                    assert a.read_stored(level, x, y) == b.read_stored(level, x, y), (level, x, y)
    assert local.read_bytes() == clustered.read_bytes()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "texstream", *args], capture_output=True, text=True, timeout=120)


# ---- equal packs ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fmt, mode", [(TexelFormat.BC1, AddressMode.CLAMP), (TexelFormat.BC7, AddressMode.WRAP)], ids=["bc1", "bc7-wrap"]
)
def test_procedural_bake_on_the_cluster_equals_the_local_one(
    address: str, tmp_path: Path, small_bands: None, fmt: TexelFormat, mode: AddressMode
) -> None:
    size = 2048 if fmt is TexelFormat.BC1 else 1024
    settings = dict(texel_format=fmt, address_mode=mode, bc7_quality="fast", progress=False)
    local = bake_procedural(tmp_path / "local.tpk", size, config=BakeConfig(jobs=WORKERS, **settings))
    clustered = bake_procedural(tmp_path / "cluster.tpk", size, config=BakeConfig(cluster=address, **settings))
    assert clustered.jobs == WORKERS and clustered.tiles == local.tiles
    assert_same_pack(tmp_path / "local.tpk", tmp_path / "cluster.tpk")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One image saved as a tiled TIFF (libvips reads it region by region: the workers read it) and
    as a PNG (read top to bottom: this process reads it and ships the rows), both over Pillow's
    threshold so that they stream through libvips."""
    import pyvips

    xy = pyvips.Image.xyz(4160, 4104)
    img = (xy[0] * 7 + xy[1] * 3).bandjoin([xy[0] ^ xy[1], xy[1] * 2, (xy[0] + xy[1]) | 96]).cast("uchar")
    folder = tmp_path_factory.mktemp("images")
    paths = {"tiff": folder / "src.tif", "png": folder / "src.png"}
    img.tiffsave(str(paths["tiff"]), tile=True, compression="deflate")
    img.pngsave(str(paths["png"]), compression=1)
    return paths


def test_who_reads_an_image_on_the_cluster(images: dict[str, Path], dask_cluster: object) -> None:
    from texstream.bake.cluster import WorkerFileSource, worker_source

    assert isinstance(worker_source(open_source(images["tiff"])), WorkerFileSource)
    assert worker_source(open_source(images["png"])) is None


@pytest.mark.parametrize("kind", ["tiff", "png"])
def test_image_bake_on_the_cluster_equals_the_local_one(
    address: str, images: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    settings = dict(texel_format=TexelFormat.BC3, progress=False)
    bake_file(images[kind], tmp_path / "local.tpk", BakeConfig(jobs=WORKERS, **settings))
    bake_file(images[kind], tmp_path / "cluster.tpk", BakeConfig(cluster=address, **settings))
    assert_same_pack(tmp_path / "local.tpk", tmp_path / "cluster.tpk")


def test_a_changed_source_file_is_refused_by_the_workers(address: str, tmp_path: Path) -> None:
    """A worker never bakes another version of the file than the one the bake opened."""
    import pyvips

    path = tmp_path / "src.tif"
    pyvips.Image.xyz(1024, 1024).cast("uchar").tiffsave(str(path), tile=True)
    source = open_source(path, vips_threshold=0)
    os.utime(path, ns=(0, 0))  # "rewritten" after the bake opened it
    out = tmp_path / "out.tpk"
    with pytest.raises(EngineError, match="not the file the bake opened"):
        bake(source, out, BakeConfig(cluster=address, progress=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.tif"]


# ---- a worker lost ---------------------------------------------------------------------------------
def test_a_worker_killed_mid_bake_is_replaced_and_the_pack_is_the_same(
    dask_cluster: object, address: str, tmp_path: Path, small_bands: None
) -> None:
    client = dask_cluster
    settings = dict(texel_format=TexelFormat.BC7, bc7_quality="fast", progress=False)
    bake_procedural(tmp_path / "local.tpk", 1024, config=BakeConfig(jobs=WORKERS, **settings))
    pids = client.run(os.getpid)  # type: ignore[attr-defined]
    killed: list[int] = []

    def kill_a_busy_worker() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not killed:
            for worker, keys in client.processing().items():  # type: ignore[attr-defined]
                if any(str(k).startswith("texstream-band") for k in keys) and worker in pids:
                    os.kill(pids[worker], signal.SIGKILL)
                    killed.append(pids[worker])
                    return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_a_busy_worker)
    killer.start()
    try:
        bake_procedural(tmp_path / "cluster.tpk", 1024, config=BakeConfig(cluster=address, **settings))
    finally:
        killer.join()
    assert killed, "no band task was seen running: nothing was killed"
    client.wait_for_workers(WORKERS, timeout=30)  # type: ignore[attr-defined]
    assert killed[0] not in client.run(os.getpid).values()  # type: ignore[attr-defined]
    assert_same_pack(tmp_path / "local.tpk", tmp_path / "cluster.tpk")


def test_a_scheduler_gone_mid_bake_fails_the_bake_and_leaves_nothing(tmp_path: Path) -> None:
    require_dask()
    import logging
    import warnings

    from distributed import LocalCluster

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the module's cluster holds the default HTTP port
        cluster = LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            silence_logs=logging.ERROR,
        )
    stopper = threading.Timer(1.5, cluster.close)
    stopper.start()
    try:
        source = ArraySource(np.random.default_rng(1).integers(0, 256, (2048, 2048, 4), np.uint8))
        config = BakeConfig(cluster=cluster.scheduler_address, texel_format=TexelFormat.BC7, progress=False)
        with pytest.raises(EngineError, match="lost the Dask scheduler at tcp://"):
            bake(source, tmp_path / "out.tpk", config)
    finally:
        stopper.join()
        cluster.close()
    assert list(tmp_path.iterdir()) == []


# ---- the command line ------------------------------------------------------------------------------
def test_cli_generate_on_a_local_cluster_equals_the_local_bake(tmp_path: Path) -> None:
    require_dask()
    local, clustered = tmp_path / "local.tpk", tmp_path / "cluster.tpk"
    common = ("--size", "1536", "--height", "1024", "--address", "wrap", "--no-progress")
    done = run_cli("generate", str(local), "--jobs", str(WORKERS), *common)
    assert done.returncode == 0, done.stderr
    done = run_cli("generate", str(clustered), "--cluster", f"local:{WORKERS}", *common)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no Dask chatter
    assert f"on {WORKERS} jobs" in done.stdout
    assert_same_pack(local, clustered)


def test_cli_unreachable_scheduler_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    require_dask()  # the error is about the scheduler, not the missing package
    out = tmp_path / "out.tpk"
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    done = run_cli("generate", str(out), "--size", "512", "--cluster", address, "--no-progress")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and address in lines[0] and "cannot reach" in lines[0], done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", ["local:0", "local:two", "http://host:80", "host"])
def test_cli_bad_cluster_address_is_a_usage_error(tmp_path: Path, bad: str) -> None:
    done = run_cli("generate", str(tmp_path / "out.tpk"), "--size", "512", "--cluster", bad)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and repr(bad) in done.stderr
    assert list(tmp_path.iterdir()) == []


def _descendants(pid: int) -> set[int]:
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if rest[0] not in "ZX":
                parents.setdefault(int(rest[1]), []).append(int(name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_cli_cluster_bake_interrupted_exits_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C reaches the whole process group (workers included); SIGTERM only the bake. Either way:
    exit 128 + signal, one line, no pack and no temporary file, no worker process left."""
    require_dask()
    out = tmp_path / "out.tpk"
    cmd = [sys.executable, "-m", "texstream", "generate", str(out), "--size", "16384", "--no-progress"]
    cmd += ["--cluster", f"local:{WORKERS}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(_descendants(proc.pid)) < 3 and time.monotonic() < deadline:  # two workers and a tracker
            time.sleep(0.05)
        time.sleep(1.0)  # bands running
        assert proc.poll() is None, proc.communicate()
        children = _descendants(proc.pid)
        os.killpg(proc.pid, sig) if sig == signal.SIGINT else proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err
    assert err.strip().splitlines() == ["texstream generate: interrupted"]
    assert list(tmp_path.iterdir()) == []
    deadline = time.monotonic() + 5
    while alive := [p for p in children if _alive(p)]:
        assert time.monotonic() < deadline, f"processes {alive} outlived the bake"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False
