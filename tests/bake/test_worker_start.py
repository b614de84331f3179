"""How bake worker processes start: they import only what the bake process would (nothing from the
folder a bake runs from), and a worker that dies says why in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from texstream.bake import workers
from texstream.errors import EngineError

ASSETS = Path(__file__).resolve().parents[2] / "assets"


def _run_script(script: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """Run a script (whose own folder, not `cwd`, is its sys.path[0], as for an installed command)."""
    env = {**os.environ, "TEXSTREAM_CACHE": str(cwd / ".cache")}
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _bake_script(folder: Path, body: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "run_bake.py"
    script.write_text(
        textwrap.dedent(
            """\
            import sys
            {body}
            from texstream.apps.cli import main

            if __name__ == "__main__":
                sys.exit(main(sys.argv[1:]))
            """
        ).format(body=body)
    )
    return script


def test_a_bake_runs_no_code_from_its_working_folder(tmp_path: Path) -> None:
    """A planted `zstandard.py`, a planted `multiprocessing` package and a `texstream/` clone (a
    namespace-package decoy) in the folder a `--jobs 2` bake runs from: none is imported by any
    process of the bake, and the bake works."""
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "planted-module-ran"
    (work / "zstandard.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (work / "texstream").mkdir()
    (work / "texstream" / "README.md").write_text("a clone of the project, not the installed package\n")
    (work / "multiprocessing").mkdir()  # what the fork server and the resource tracker import first
    (work / "multiprocessing" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    script = _bake_script(tmp_path / "bin")
    done = _run_script(script, work, "bake", str(ASSETS / "coffee.png"), "out.tpk", "--jobs", "2", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    assert (work / "out.tpk").is_file()


def test_spawned_gallery_bakers_run_no_code_from_the_working_folder(tmp_path: Path) -> None:
    """The gallery's bakes run in spawned processes, whose start imports `multiprocessing` before
    it takes the parent's sys.path: a planted one in the working folder is not imported."""
    work = tmp_path / "work"
    (work / "multiprocessing").mkdir(parents=True)
    marker = tmp_path / "planted-package-ran"
    (work / "multiprocessing" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    script = tmp_path / "bin" / "gallery.py"
    script.parent.mkdir()
    script.write_text(
        "import sys\nfrom pathlib import Path\nfrom texstream.apps.assets import ensure_gallery\n\n"
        "if __name__ == '__main__':\n"
        "    print(len(ensure_gallery(2, 256, progress=False, folder=Path(sys.argv[1]), jobs=2)))\n"
    )
    done = _run_script(script, work, str(tmp_path / "packs"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "2\n" and not marker.exists()
    assert len(list((tmp_path / "packs").rglob("*.tpk"))) == 2


def test_a_worker_whose_start_fails_reports_its_first_error_line(tmp_path: Path) -> None:
    """The worker cannot import the bake's main module: the one line on stderr is the worker's own
    first error line (no traceback from each worker, no guess about memory); nothing is left."""
    work = tmp_path / "work"
    work.mkdir()
    script = _bake_script(
        tmp_path / "bin",
        'if __name__ == "__mp_main__":\n    raise RuntimeError("this module refuses worker processes")',
    )
    done = _run_script(script, work, "bake", str(ASSETS / "coffee.png"), "out.tpk", "--jobs", "2", "--no-progress")
    assert done.returncode == 1
    assert (
        done.stderr
        == "texstream bake: a bake worker process died: RuntimeError: this module refuses worker processes\n"
    )
    assert sorted(p.name for p in work.iterdir()) == []


def _sys_path(job: object) -> list[str]:
    return list(sys.path)


def _nothing() -> None:
    pass


def _refuse_to_start() -> None:
    raise LookupError("no table for this format\nsecond line")


def _hang(job: object) -> None:
    signal.pause()


def test_a_worker_has_exactly_the_bake_process_sys_path() -> None:
    pool = workers.WorkerPool(1, _nothing, (), _sys_path)
    try:
        assert pool.result(pool.submit("job")) == sys.path
    finally:
        pool.close()


def test_a_worker_whose_init_raises_reports_its_first_error_line() -> None:
    with pytest.raises(EngineError) as info:
        pool = workers.WorkerPool(1, _refuse_to_start, (), _sys_path)
        try:
            pool.result(pool.submit("job"))
        finally:
            pool.kill()
    assert str(info.value) == "a bake worker process died: LookupError: no table for this format"


def test_a_killed_worker_is_reported_as_killed() -> None:
    pool = workers.WorkerPool(1, _nothing, (), _hang)
    try:
        task = pool.submit("job")
        os.kill(pool.pids[0], signal.SIGKILL)
        with pytest.raises(EngineError) as info:
            pool.result(task)
    finally:
        pool.kill()
    assert str(info.value) == (
        "a bake worker process died: killed by SIGKILL (out of memory, or stopped by another program)"
    )
