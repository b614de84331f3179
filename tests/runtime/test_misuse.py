"""Misuse caught with one clear error: draws without update(), wrong configuration types, use after
release(), a missing pack."""

# ruff: noqa: F811 (the `packs` fixture, imported, is a parameter here)

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import moderngl
import pytest

from texstream import (
    BudgetConfig,
    EngineError,
    PackFormatError,
    PackNotFoundError,
    Streamer,
    StreamerConfig,
    StreamerStats,
    program,
    shader_file,
)
from texstream.runtime import update_watch

from .test_streamer import packs  # noqa: F401

pytestmark = pytest.mark.gl


def test_draws_without_update_warn_once_naming_the_fix(
    gl_context: moderngl.Context,
    packs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(update_watch, "NO_UPDATE_SECONDS", 0.0)
    prog = program(
        gl_context, vertex=shader_file("texstream/plane_vs.glsl"), fragment=shader_file("texstream/plane_fs.glsl")
    )
    with Streamer(gl_context, StreamerConfig(budget=BudgetConfig(budget_mb=32))) as s:
        vt = s.open(packs.colour)
        with pytest.warns(
            RuntimeWarning, match=r"without Streamer\.update\(\).*call streamer\.update\(\) once per frame"
        ):
            for _ in range(update_watch.NO_UPDATE_BINDS + 1):
                vt.bind(prog, "u_vt")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once only
            for _ in range(100):
                vt.bind(prog, "u_vt")
    prog.release()


def test_a_slow_frame_drawing_many_textures_once_does_not_warn(
    gl_context: moderngl.Context, packs, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Drawing many textures once each in a frame that takes long (llvmpipe, a loaded box) is not the
    forgotten update(): only a texture drawn again and again is."""
    monkeypatch.setattr(update_watch, "NO_UPDATE_SECONDS", 0.0)
    prog = program(
        gl_context, vertex=shader_file("texstream/plane_vs.glsl"), fragment=shader_file("texstream/plane_fs.glsl")
    )
    copies = []  # distinct files: the same pack opened again would be one shared texture
    for i in range(update_watch.NO_UPDATE_BINDS + 2):
        copies.append(tmp_path / f"normals-{i}.tpk")
        shutil.copyfile(packs.normals, copies[-1])
    with Streamer(gl_context, StreamerConfig(budget=BudgetConfig(budget_mb=64))) as s:
        textures = [s.open(p) for p in copies]
        s.update()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for vt in textures:
                vt.bind(prog, "u_vt")
    prog.release()


def test_updates_between_draws_never_warn(gl_context: moderngl.Context, packs) -> None:
    prog = program(
        gl_context, vertex=shader_file("texstream/plane_vs.glsl"), fragment=shader_file("texstream/plane_fs.glsl")
    )
    with Streamer(gl_context, StreamerConfig(budget=BudgetConfig(budget_mb=32))) as s:
        vt = s.open(packs.colour)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(3 * update_watch.NO_UPDATE_BINDS):
                s.update()
                vt.bind(prog, "u_vt")
        assert isinstance(s.stats(), StreamerStats) and s.stats().as_dict()["totals"]["uploads"] >= 0
    prog.release()


def test_wrong_config_types_name_the_expected_class(gl_context: moderngl.Context) -> None:
    with pytest.raises(TypeError, match="config must be a StreamerConfig, got BudgetConfig"):
        Streamer(gl_context, BudgetConfig())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="budget must be a BudgetConfig, got StreamerConfig"):
        StreamerConfig(budget=StreamerConfig())  # type: ignore[arg-type]


def test_use_after_release_is_an_engine_error(gl_context: moderngl.Context, packs) -> None:
    s = Streamer(gl_context, StreamerConfig(budget=BudgetConfig(budget_mb=32)))
    s.open(packs.colour)
    s.release()
    for call in (lambda: s.set_budget(64), s.memory_summary, s.update, lambda: s.open(packs.colour), s.validate):
        with pytest.raises(EngineError, match="released"):
            call()


def test_missing_pack_is_file_not_found(gl_context: moderngl.Context, tmp_path: Path) -> None:
    with Streamer(gl_context, StreamerConfig(budget=BudgetConfig(budget_mb=32))) as s:
        with pytest.raises(FileNotFoundError, match="does not exist") as err:
            s.open(tmp_path / "missing.tpk")
    assert isinstance(err.value, PackNotFoundError) and isinstance(err.value, PackFormatError)
