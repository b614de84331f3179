"""The fault sweep: run a job once for every file operation it does, that operation failing each time.

`sweep` counts the job's operations with a dry run, then for every n makes the n-th fail (once,
then again as a fault that persists: a disk that stays full) and checks after each run:

- the job raised one clear error (the caller's `check_error`), or absorbed the fault and still
  wrote exactly the good output;
- the fault met the operation the dry run said would be n-th (the job is deterministic);
- the output folder holds what it held before (no temporary file, no half-written file) and the
  good output written before the sweep is byte for byte untouched;
- no file descriptor was left open;
- the next run, with no fault, succeeds and writes what it should.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from texstream.testing.faults import Fault, inject, record

# Kinds a full disk (or quota) fails; the rest fail as a dying disk does, with EIO.
SPACE_KINDS = frozenset({"open", "write", "pwrite", "truncate", "fallocate", "mkdir"})


@dataclass
class SweepReport:
    """What one sweep did."""

    operations: int = 0  # in the dry run
    runs: int = 0  # runs with a fault armed
    injected: int = 0  # faults that were met
    failed: int = 0  # runs that ended in a clear error
    absorbed: int = 0  # runs that met their fault and still wrote the good output
    kinds: Counter[str] = field(default_factory=Counter)  # faults injected, by operation kind

    def __str__(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.kinds.items()))
        return (
            f"{self.operations} operations, {self.injected} faults injected in {self.runs} runs "
            f"({self.failed} failed cleanly, {self.absorbed} absorbed); by kind: {kinds}"
        )


def error_code(kind: str, n: int) -> int:
    """The errno the n-th operation fails with: ENOSPC or EDQUOT (alternately) where space runs
    out, EIO elsewhere."""
    if kind in SPACE_KINDS:
        return errno.ENOSPC if n % 2 else errno.EDQUOT
    return errno.EIO


def open_descriptors() -> set[str]:
    """The descriptors this process has open (Linux: /proc/self/fd)."""
    return set(os.listdir("/proc/self/fd"))


def listing(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (recursively) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def sweep(
    job: Callable[[], None],
    *,
    folder: Path,
    check_error: Callable[[BaseException, Fault], None],
    check_output: Callable[[], None],
    reset: Callable[[], None] = lambda: None,
    after_failure: Callable[[], None] = lambda: None,
    kinds: frozenset[str] | None = None,
) -> SweepReport:
    """Sweep `job` (which writes inside `folder`) over its operations of `kinds` (None: all).

    `job` raises on failure; `check_error(exc, fault)` asserts the error is clear; `check_output()`
    asserts what a run that succeeded wrote; `reset()` returns the folder to its state before such
    a run (nothing to do for a job that rewrites the same bytes); `after_failure()` checks and
    removes what a failed run may rightly keep (a job of two steps keeps the first one's finished
    output). Whatever `folder` holds when the sweep starts (the good output of an earlier run) must
    stay byte for byte as it is.
    """
    before = listing(folder)
    assert before, "write the good output once before the sweep"
    with record() as dry:
        job()
    check_output()
    reset()
    assert listing(folder) == before, "a run without faults must leave the same files after reset()"
    plan = [op for op in dry.operations if kinds is None or op.kind in kinds]
    report = SweepReport(operations=len(plan))
    assert plan, "the job did no file operation of the swept kinds"
    for n, op in enumerate(plan, 1):
        faults = [Fault(at=n, errno=error_code(op.kind, n), kinds=kinds)]
        if op.kind in SPACE_KINDS:  # and a disk that stays full from there on
            faults.append(Fault(at=n, errno=errno.ENOSPC, kinds=kinds, persistent=True))
        for fault in faults:
            report.runs += 1
            error: BaseException | None = None
            descriptors = open_descriptors()
            with inject(fault) as log:
                try:
                    job()
                except Exception as exc:  # noqa: BLE001 - checked right below
                    error = exc
            where = f"fault {fault} (operation {n}: {op.kind} {op.target})"
            leaked = open_descriptors() - descriptors
            assert not leaked, f"{where} left descriptors {sorted(leaked)} open"
            met = log.injected
            assert met, f"{where} was never met: the job's operations are not deterministic"
            assert met[0].kind == op.kind, f"{where} met a {met[0].kind} instead"
            report.injected += len(met)
            report.kinds.update(m.kind for m in met)
            if error is None:
                report.absorbed += 1
                check_output()
                reset()
            else:
                report.failed += 1
                check_error(error, fault)
                after_failure()
            after = listing(folder)
            assert after.keys() == before.keys(), f"{where} left {sorted(after.keys() ^ before.keys())}"
            assert after == before, f"{where} changed files: the good output must be untouched"
            job()  # the next run, with no fault, succeeds
            check_output()
            reset()
            assert listing(folder) == before, f"the run after {where} left other files"
    return report


def same_bytes(output: Path) -> Callable[[], None]:
    """A `check_output` for a job that rewrites `output` with the bytes it holds now."""
    good = output.read_bytes()

    def check() -> None:
        assert output.read_bytes() == good, f"{output} was rewritten with other bytes"

    return check
