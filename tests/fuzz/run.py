"""Coverage-guided fuzzing of the targets in tests/fuzz/harness.py with atheris (libFuzzer for Python).

One target per process (atheris sets up once per process)::

    python -m tests.fuzz.run one TARGET [--runs N | --seconds S] [--crashes DIR] [--work DIR]
    python -m tests.fuzz.run all --seconds S [--crashes DIR]   # every target in turn, S split evenly
    python -m tests.fuzz.run replay [TARGET...]                # the seeds and saved crashes, no fuzzer
    python -m tests.fuzz.run one TARGET --merge-from DIR       # add DIR's inputs that reach new code
                                                               # to the seed corpus (libFuzzer -merge)

The seed corpus (tests/fuzz/corpus/TARGET) is read, never written: new inputs go to the work folder.
An input that breaks a target's contract is saved as ``DIR/TARGET/crash-<sha1>`` (a hang as
timeout-, a huge allocation as oom-) and fails the run; tests/fuzz/test_fuzz.py replays every file
saved there, so a crash found becomes a regression test once its file is committed.

Memory is bounded twice: libFuzzer's -rss_limit_mb, and an address-space limit set in the fuzz
process itself (RLIMIT_AS, a fixed margin above what the interpreter holds after start-up), so an
allocation a hostile size asks for fails at once as MemoryError, which the target reports as a crash.
"""

from __future__ import annotations

import argparse
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
CORPUS = HERE / "corpus"
CRASHES = HERE / "crashes"
TARGET_NAMES = ("header", "pack", "metadata", "tile", "content_range", "http", "cache", "hdr", "gltf")
# Modules whose code paths guide the fuzzer: the parsers and what they call. Importing texstream
# imports the whole package, and instrumenting all of it would cost seconds of start-up per target for
# code no target reaches, so these modules' functions are instrumented after the import.
INSTRUMENTED = (
    "texstream.pack.format",
    "texstream.pack.reader",
    "texstream.pack.codec",
    "texstream.remote.transport",
    "texstream.remote.cache",
    "texstream.assets.hdr",
    "texstream.errors",
    "texstream.scene.gltf_file",
    "tests.fuzz.harness",
)
ADDRESS_MARGIN = 512 << 20  # bytes of address space a fuzz process may take beyond its start-up size
INPUT_TIMEOUT_S = 10  # one input running longer is a hang
MAX_LEN = 64 << 10  # longest input the fuzzer makes (the pack seeds are a few KiB)


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _bound_memory() -> None:
    size = _vm_size()
    if size:
        limit = size + ADDRESS_MARGIN
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def replay(targets: list[str]) -> list[str]:
    """Run every seed and saved crash of `targets` through its target in this process, memory bounded
    as when fuzzing; one line per input that breaks the contract."""
    from tests.fuzz import harness

    if "cache" in targets:
        harness._cache_layout()
    _bound_memory()
    failures = []
    for target in targets:
        files = [
            p for folder in (CORPUS / target, CRASHES / target) if folder.is_dir() for p in sorted(folder.iterdir())
        ]
        for path in files:
            try:
                harness.run_one(target, path.read_bytes())
            except BaseException as exc:  # noqa: BLE001 (anything else is what this reports)
                text = str(exc).splitlines()[0] if str(exc) else ""
                failures.append(f"{path.relative_to(ROOT)}: {type(exc).__name__}: {text[:300]}")
    return failures


def _instrument(atheris: object) -> None:
    """Add coverage instrumentation to every function and method defined in INSTRUMENTED."""
    import inspect

    def functions(namespace: dict, module: str) -> list:
        found = []
        for value in namespace.values():
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__
            if isinstance(value, property):
                found += [f for f in (value.fget, value.fset) if f is not None]
            elif inspect.isfunction(value) and value.__module__ == module:
                found.append(value)
            elif inspect.isclass(value) and value.__module__ == module:
                found += functions(dict(vars(value)), module)
        return found

    for name in INSTRUMENTED:
        module = sys.modules[name]
        for func in functions(dict(vars(module)), name):
            atheris.instrument_func(func)


def _merge_child(target: str, work: Path) -> Path:
    """An executable that runs `target` with the libFuzzer arguments it is given: -merge runs its
    passes in child processes started from argv[0]."""
    script = work / "merge-child"
    script.write_text(
        f"#!/bin/sh\ncd {shlex.quote(str(ROOT))} && exec {shlex.quote(sys.executable)} -m tests.fuzz.run "
        f'child {target} "$@"\n'
    )
    script.chmod(0o755)
    return script


def fuzz_child(target: str, libfuzzer_args: list[str]) -> None:
    import atheris

    from tests.fuzz import harness

    _instrument(atheris)
    if target == "cache":
        harness._cache_layout()
    _bound_memory()
    atheris.Setup([sys.argv[0], *libfuzzer_args], harness.TARGETS[target])
    atheris.Fuzz()


def fuzz_one(
    target: str, runs: int | None, seconds: int | None, crashes: Path, work: Path, merge_from: Path | None = None
) -> None:
    """Fuzz `target` in this process, or merge `merge_from` into its seed corpus (does not return:
    libFuzzer exits when done)."""
    import atheris

    from tests.fuzz import harness

    _instrument(atheris)

    test_one = harness.TARGETS[target]
    if target == "cache":
        harness._cache_layout()  # learn the layout before memory is bounded and fuzzing starts
    work.mkdir(parents=True, exist_ok=True)
    (crashes / target).mkdir(parents=True, exist_ok=True)
    args = [
        sys.argv[0],
        str(work),
        str(CORPUS / target),
        f"-artifact_prefix={crashes / target}/",
        f"-timeout={INPUT_TIMEOUT_S}",
        "-rss_limit_mb=3072",
        f"-max_len={MAX_LEN}",
        "-print_final_stats=1",
    ]
    if merge_from is not None:
        args[1:3] = ["-merge=1", str(CORPUS / target), str(merge_from)]
        args[0] = str(_merge_child(target, work))
    if runs is not None:
        args += [f"-runs={runs}", "-seed=1"]
    if seconds is not None:
        args.append(f"-max_total_time={seconds}")
    _bound_memory()
    atheris.Setup(args, test_one)
    atheris.Fuzz()


@dataclass(frozen=True, kw_only=True)
class Summary:
    target: str
    ok: bool
    runs: int
    seconds: float
    coverage: int
    features: int
    corpus: int
    crashes: list[Path]
    tail: str

    def line(self) -> str:
        rate = self.runs / self.seconds if self.seconds else 0.0
        found = ", ".join(p.name for p in self.crashes) or "none"
        state = "ok" if self.ok else "FAILED"
        return (
            f"{self.target:<14} {state:<6} {self.runs:>10,} inputs {rate:>8,.0f}/s  cov {self.coverage:>5}"
            f"  ft {self.features:>6}  corpus {self.corpus:>5}  crashes: {found}"
        )


def _last_int(pattern: str, text: str) -> int:
    hits = re.findall(pattern, text)
    return int(hits[-1]) if hits else 0


def run_target(
    target: str,
    *,
    runs: int | None = None,
    seconds: int | None = None,
    crashes: Path = CRASHES,
    work: Path | None = None,
    timeout_s: float | None = None,
) -> Summary:
    """Fuzz one target in a child process; its libFuzzer statistics and the crash files it wrote."""
    crashes = crashes.absolute()
    before = set((crashes / target).glob("*")) if (crashes / target).is_dir() else set()
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{target}-") as tmp:
        command = [sys.executable, "-m", "tests.fuzz.run", "one", target, "--crashes", str(crashes)]
        command += ["--work", str(work or Path(tmp) / "work")]
        if runs is not None:
            command += ["--runs", str(runs)]
        if seconds is not None:
            command += ["--seconds", str(seconds)]
        started = time.monotonic()
        proc = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False
        )
        elapsed = time.monotonic() - started
    out = proc.stdout + proc.stderr
    found = sorted(set((crashes / target).glob("*")) - before) if (crashes / target).is_dir() else []
    return Summary(
        target=target,
        ok=proc.returncode == 0 and not found,
        runs=_last_int(r"stat::number_of_executed_units:\s*(\d+)", out) or _last_int(r"Done (\d+) runs", out),
        seconds=elapsed,
        coverage=_last_int(r"cov: (\d+)", out),
        features=_last_int(r"ft: (\d+)", out),
        corpus=_last_int(r"corp: (\d+)", out),
        crashes=found,
        tail=out[-6000:],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.run", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("one", help="fuzz one target in this process")
    one.add_argument("target", choices=TARGET_NAMES)
    one.add_argument("--runs", type=int)
    one.add_argument("--seconds", type=int)
    one.add_argument("--crashes", type=Path, default=CRASHES)
    one.add_argument("--work", type=Path)
    one.add_argument("--merge-from", type=Path, help="merge this folder's new-coverage inputs into the seeds")
    every = sub.add_parser("all", help="fuzz every target in turn and summarize")
    every.add_argument("--seconds", type=int, default=600, help="total time, split evenly (default 600)")
    every.add_argument("--crashes", type=Path, default=CRASHES)
    every.add_argument("--targets", default=",".join(TARGET_NAMES), help="comma-separated subset")
    child = sub.add_parser("child", help=argparse.SUPPRESS)
    child.add_argument("target", choices=TARGET_NAMES)
    child.add_argument("libfuzzer_args", nargs=argparse.REMAINDER)
    again = sub.add_parser("replay", help="replay the seeds and saved crashes (no fuzzer needed)")
    again.add_argument("targets", nargs="*", metavar="TARGET", help=f"any of {', '.join(TARGET_NAMES)} (default: all)")
    args = parser.parse_args(argv)
    if args.command == "child":
        fuzz_child(args.target, args.libfuzzer_args)
        return 0
    if args.command == "replay":
        unknown = sorted(set(args.targets) - set(TARGET_NAMES))
        if unknown:
            parser.error(f"unknown target(s) {', '.join(unknown)} (choose from {', '.join(TARGET_NAMES)})")
        failures = replay(args.targets or list(TARGET_NAMES))
        for line in failures:
            print(line)
        print(f"replay: {len(failures)} input(s) broke their target's contract")
        return 1 if failures else 0
    if args.command == "one":
        work = args.work or Path(tempfile.mkdtemp(prefix=f"fuzz-{args.target}-"))
        fuzz_one(args.target, args.runs, args.seconds, args.crashes, work, args.merge_from)
        return 0
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("make fuzz needs atheris: pip install -e '.[fuzz]'", file=sys.stderr)
        return 2
    targets = [t for t in args.targets.split(",") if t]
    each = max(1, args.seconds // len(targets))
    work_root = ROOT / ".cache" / "fuzz"  # kept between runs: the next run starts from what this one found
    print(f"fuzzing {len(targets)} targets for {each} s each; crashes go to {args.crashes}/<target>/")
    summaries = []
    for target in targets:
        s = run_target(target, seconds=each, crashes=args.crashes, work=work_root / target)
        summaries.append(s)
        print(s.line(), flush=True)
        if not s.ok:
            print(s.tail, file=sys.stderr)
    total = sum(s.runs for s in summaries)
    crashed = sum(len(s.crashes) for s in summaries)
    print(f"total: {total:,} inputs in {sum(s.seconds for s in summaries):.0f} s, {crashed} crash file(s)")
    return 0 if all(s.ok for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
