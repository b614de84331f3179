"""The compiled helper built with -fsanitize=address,undefined and fed the fuzz corpus (see
tests/fuzz/native_asan.py), and its reader pool built with -fsanitize=thread and stressed
(tests/fuzz/native_tsan.py). Skips without a compiler or sanitizer runtime; where TEXSTREAM_REQUIRE
lists "native" (CI) it must run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.require import skip_unless_required

from .native_asan import ROOT, SOURCE, build, compiler, sanitized_env


def _run(module: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _replay(lib: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    cc = compiler()
    assert cc is not None
    return _run("tests.fuzz.native_asan", ["replay", str(lib), *targets], sanitized_env(cc))


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lib, why = build(tmp_path_factory.mktemp("asan"))
    if lib is None:
        skip_unless_required("native", why)
    return lib


def _assert_planted_overflow_caught(tmp_path: Path, old: str, new: str, target: str) -> None:
    """A copy of the helper with `old` replaced by `new` (a planted bug) must fail the `target` replay
    with an AddressSanitizer report: the replay really runs the instrumented code on exact-size buffers."""
    source = SOURCE.read_text()
    planted = source.replace(old, new)
    assert planted != source
    copy = tmp_path / "src" / "_native.c"
    copy.parent.mkdir()
    copy.write_text(planted)
    lib, why = build(tmp_path / "out", source=copy)
    assert lib is not None, why
    proc = _replay(lib, target)
    assert proc.returncode == 86, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "AddressSanitizer: heap-buffer-overflow" in proc.stderr


def test_the_corpus_through_the_sanitized_helper(sanitized: Path) -> None:
    proc = _replay(sanitized)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    assert "no report" in proc.stdout


def test_the_sanitizer_catches_a_planted_overflow(sanitized: Path, tmp_path: Path) -> None:
    """The same replay on a copy of the helper that copies one byte too many must fail with an
    AddressSanitizer report: the replay really runs the instrumented code on exact-size buffers."""
    copy_tile = "memcpy(dst, src, (size_t)raw);"  # the uncompressed tile copy
    _assert_planted_overflow_caught(tmp_path, copy_tile, "memcpy(dst, src, (size_t)raw + 1);", "tile")


def test_the_sanitizer_catches_a_run_past_a_scanline(sanitized: Path, tmp_path: Path) -> None:
    """A copy of the helper whose Radiance decoder trusts a repeat run's count (no check against the
    scanline's end) must fail the hdr replay with an AddressSanitizer report (the corpus has a picture
    whose last scanline holds such a run)."""
    check = "if (filled + count > width) {\n                        result[0] = TS_HDR_RUN_PAST;"
    _assert_planted_overflow_caught(
        tmp_path, check, "if (0) {\n                        result[0] = TS_HDR_RUN_PAST;", "hdr"
    )


def test_the_sanitizer_catches_a_planted_overflow_in_the_procedural_loops(sanitized: Path, tmp_path: Path) -> None:
    """A terrain row gather that writes each texel one texel on: past the end of a band's last row."""
    _assert_planted_overflow_caught(
        tmp_path, "memcpy(o + 4 * x, table + index[x], 4);", "memcpy(o + 4 * x + 4, table + index[x], 4);", "procedural"
    )


def test_the_sanitizer_catches_a_planted_overflow_in_the_mip_loops(sanitized: Path, tmp_path: Path) -> None:
    """A reduction that writes an odd width's extra texel whatever the width: one texel past the end
    of an even-width level's last row."""
    _assert_planted_overflow_caught(
        tmp_path, "    if (width % 2) {\n        const int64_t c1", "    if (1) {\n        const int64_t c1", "mips"
    )


def test_the_sanitizer_catches_a_planted_overflow_in_the_scheduler_chains(sanitized: Path, tmp_path: Path) -> None:
    """A missing-chains walk that clears each page's resident flag one entry on: past the end of the
    exact-size flag buffer at the last page."""
    _assert_planted_overflow_caught(
        tmp_path,
        "        gap[i] = 0;\n        resident[i] = 0;",
        "        gap[i] = 0;\n        resident[i + 1] = 0;",
        "deciders",
    )


def test_the_sanitizer_catches_a_planted_overflow_in_the_upload_plan(sanitized: Path, tmp_path: Path) -> None:
    """An upload plan that files each chosen load one place on: past the end of the exact-size
    ordered-loads array at the last load."""
    _assert_planted_overflow_caught(
        tmp_path,
        "    for (int64_t k = 0; k < n; k++) ordered[k] = order[k].value;",
        "    for (int64_t k = 0; k < n; k++) ordered[k + 1] = order[k].value;",
        "deciders",
    )


def test_the_sanitizer_catches_a_planted_overflow_in_the_widening(sanitized: Path, tmp_path: Path) -> None:
    """A widening that reads each page's coverage one entry on: past the end of the exact-size
    coverage buffer at the last page."""
    _assert_planted_overflow_caught(
        tmp_path, "        scratch[ids[i]] = counts[i];", "        scratch[ids[i]] = counts[i + 1];", "deciders"
    )


def test_the_sanitizer_catches_a_planted_overflow_in_the_reader_pool(sanitized: Path, tmp_path: Path) -> None:
    """A reader pool that points each job's errnum one tile on: the last batch's reads write past the
    end of the exact-size outcome array (the pack replay reads every pack through the pool)."""
    _assert_planted_overflow_caught(
        tmp_path, "        j->errnum = errnum + at;", "        j->errnum = errnum + at + 1;", "pack"
    )


# ---- the reader pool under ThreadSanitizer ---------------------------------------------------------
@pytest.fixture(scope="module")
def tsan_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A ThreadSanitizer build of the helper and a small zstd pack for it to read."""
    from texstream.bake.pipeline import bake_procedural
    from texstream.config import BakeConfig
    from texstream.pack.format import Supercompression

    from .native_tsan import build as build_tsan

    root = tmp_path_factory.mktemp("tsan")
    lib, why = build_tsan(root / "lib")
    if lib is None:
        skip_unless_required("native", why)
    pack = root / "stress.tpk"
    cfg = BakeConfig(tile_size=64, jobs=1, progress=False, supercompression=Supercompression.ZSTD)
    bake_procedural(pack, 512, "terrain", 1, cfg)
    return lib, pack


def _stress(lib: Path, pack: Path) -> subprocess.CompletedProcess[str]:
    from .native_tsan import tsan_env

    cc = compiler()
    assert cc is not None
    return _run("tests.fuzz.native_tsan", ["stress", str(lib), str(pack)], tsan_env(cc))


def test_the_reader_pool_has_no_data_race(tsan_build: tuple[Path, Path]) -> None:
    proc = _stress(*tsan_build)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    assert "no report" in proc.stdout


def test_thread_sanitizer_catches_a_planted_race_in_the_reader_pool(
    tsan_build: tuple[Path, Path], tmp_path: Path
) -> None:
    """A copy of the helper whose drain takes finished jobs without the pool's lock must fail the
    stress run with a data race report: the run really exercises the threads against each other."""
    from .native_tsan import build as build_tsan

    source = SOURCE.read_text()
    locked = "        free(j);\n    }\n    pthread_mutex_unlock(&p->lock);\n    return k;"
    planted = source.replace(locked, "        free(j);\n    }\n    return k;")
    locked = "    int64_t k = 0;\n    pthread_mutex_lock(&p->lock);\n    while (k < cap && p->done) {"
    planted = planted.replace(locked, "    int64_t k = 0;\n    while (k < cap && p->done) {")
    assert planted.count("pthread_mutex_lock") == source.count("pthread_mutex_lock") - 1
    assert planted.count("pthread_mutex_unlock") == source.count("pthread_mutex_unlock") - 1
    copy = tmp_path / "src" / "_native.c"
    copy.parent.mkdir()
    copy.write_text(planted)
    lib, why = build_tsan(tmp_path / "out", source=copy)
    assert lib is not None, why
    proc = _stress(lib, tsan_build[1])
    assert proc.returncode == 66 and "ThreadSanitizer: data race" in proc.stderr, proc.stderr[-3000:]
