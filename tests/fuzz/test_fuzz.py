"""The fuzz targets as tests: the seed corpus and every saved crash replay through each target's
contract in-process, and a short coverage-guided run of each target (atheris, a fixed number of
inputs from a fixed seed) must find no crash. `make fuzz` runs the same targets for longer."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.require import skip_unless_required

from . import harness
from .run import CORPUS, ROOT, TARGET_NAMES, Summary, run_target

# Inputs per target in the short run, about 2 s of CPU each after ~1.5 s of start-up (the pack and
# cache targets write and open files: ~1,000 and ~300 inputs/s; the parsers run at 5,000-40,000/s).
SHORT_RUNS = {
    "header": 20_000,
    "pack": 2_000,
    "metadata": 10_000,
    "tile": 40_000,
    "content_range": 30_000,
    "http": 8_000,
    "cache": 600,
    "hdr": 4_000,
    "gltf": 300,  # ~10 ms an input: pygltflib decodes the JSON into its dataclasses
}
MAX_CORPUS_BYTES = 2 << 20


def _inputs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*") if p.is_file()) if folder.is_dir() else []


def test_every_target_has_seeds_and_a_short_run() -> None:
    assert set(harness.TARGETS) == set(TARGET_NAMES) == set(SHORT_RUNS)
    for target in TARGET_NAMES:
        assert _inputs(CORPUS / target), f"no seed inputs for {target}"


def test_the_seed_corpus_stays_small() -> None:
    total = sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file())
    assert total < MAX_CORPUS_BYTES, total


def test_seeds_and_saved_crashes_keep_the_contract() -> None:
    """Every committed input (seeds, and crashes found before and fixed) parses or raises the
    documented error, replayed in a child process whose memory is bounded as when fuzzing (a huge
    allocation fails there as MemoryError); a crash file that fails here is a regression."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.run", "replay"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "replay: 0 input(s)" in proc.stdout


def test_the_pack_seeds_open_and_read() -> None:
    """The valid seeds must reach past the header checks, or the fuzzer starts from nothing."""
    from texstream.pack.reader import PackReader

    opened = 0
    for path in _inputs(CORPUS / "pack"):
        if not re.fullmatch(r".+-c\d-[0-9a-f]{8}", path.name):  # the writer's packs, whole (make_corpus)
            continue
        body = harness.pack_bytes(path.read_bytes())
        tmp = harness._scratch_dir() / "seed.tpk"
        tmp.write_bytes(body)
        with PackReader(tmp) as r:
            assert r.verify() == []
            opened += 1
    assert opened >= 4


def test_a_contract_break_is_reported_as_a_crash() -> None:
    """The targets do not swallow what they must report: an undocumented exception escapes."""
    assert harness.pack_bytes(bytes([harness.FIX_HEADER]) + b"x" * 10) == b"x" * 10
    with pytest.raises(harness.ContractViolation):
        harness._one_line(ValueError("two\nlines"))


def test_short_fuzz_run_finds_no_crash(tmp_path: Path) -> None:
    """Every target fuzzed for SHORT_RUNS inputs from a fixed seed, two at a time (the box's cores)."""
    try:
        import atheris  # noqa: F401
    except ImportError:
        skip_unless_required("fuzz", "atheris is not installed (pip install -e '.[fuzz]')")

    def fuzz(target: str) -> Summary:
        return run_target(target, runs=SHORT_RUNS[target], crashes=tmp_path / "crashes", timeout_s=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        summaries = list(pool.map(fuzz, TARGET_NAMES))
    report = "\n".join(s.line() for s in summaries)
    for s in summaries:
        saved = [p.read_bytes()[:200] for p in s.crashes]
        assert s.ok, f"{s.target} crashed on {saved}\n{report}\n{s.tail}"
        assert s.runs >= SHORT_RUNS[s.target] and s.coverage > 0, report


def test_the_fuzz_driver_reports_an_undocumented_exception(tmp_path: Path) -> None:
    """A target that raises something else fails the run and leaves its input as a crash file (the
    driver is what `make test` and `make fuzz` trust)."""
    try:
        import atheris  # noqa: F401
    except ImportError:
        skip_unless_required("fuzz", "atheris is not installed (pip install -e '.[fuzz]')")
    script = (
        "import sys\n"
        "from tests.fuzz import harness, run\n"
        "def broken(data):\n"
        "    if b'[[[' in data:\n"
        "        raise KeyError('undocumented')\n"
        "harness.TARGETS['metadata'] = broken\n"
        f"run.fuzz_one('metadata', 200000, None, __import__('pathlib').Path({str(tmp_path)!r}), "
        f"__import__('pathlib').Path({str(tmp_path / 'work')!r}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert "KeyError: 'undocumented'" in proc.stdout + proc.stderr
    crashes = list((tmp_path / "metadata").glob("crash-*"))
    assert len(crashes) == 1 and b"[[[" in crashes[0].read_bytes()


def test_a_huge_allocation_is_a_crash_in_the_bounded_child() -> None:
    """The address-space bound the fuzz and replay processes set turns an allocation a hostile size
    asks for into a reported failure, not a machine swapping (the cache's 4 GiB read was one)."""
    script = (
        "from tests.fuzz import harness, run\n"
        "def greedy(data):\n"
        "    if b'[[[' in data:\n"
        "        bytearray(run.ADDRESS_MARGIN * 2)\n"
        "harness.TARGETS['metadata'] = greedy\n"
        "print('\\n'.join(run.replay(['metadata'])))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "MemoryError" in proc.stdout and "corpus/metadata/deep-" in proc.stdout, proc.stdout
