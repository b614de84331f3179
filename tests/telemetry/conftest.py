"""Fixtures of the telemetry tests: small packs baked once per session, a streaming-run helper."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import moderngl
import pytest

from texstream.apps.render import PlaneRenderer
from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig, BudgetConfig, StreamerConfig
from texstream.pack.format import TexelFormat


@dataclass(frozen=True)
class Packs:
    small: Path  # 512^2 BC1 terrain, 64-texel tiles (85 tiles)
    medium: Path  # 1024^2 BC1 terrain (341 tiles): room for evictions under a tight budget
    normals: Path  # 512^2 BC5: a second cache pool


@pytest.fixture(scope="session")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Packs:
    root = tmp_path_factory.mktemp("telemetry-packs")
    cfg = BakeConfig(tile_size=64, jobs=1, progress=False)
    bake_procedural(root / "x.tpk", 512, "terrain", 1, cfg)
    bake_procedural(root / "medium.tpk", 1024, "terrain", 2, cfg)
    bc5 = BakeConfig(texel_format=TexelFormat.BC5, tile_size=64, jobs=1, progress=False)
    bake_procedural(root / "normals.tpk", 512, "normals", 1, bc5)
    return Packs(root / "x.tpk", root / "medium.tpk", root / "normals.tpk")


def streamer_config(budget_mb: float = 32.0, **kw: object) -> StreamerConfig:
    kw.setdefault("io_threads", 2)
    kw.setdefault("ring_mb", 2)
    return StreamerConfig(budget=BudgetConfig(budget_mb=budget_mb), **kw)  # type: ignore[arg-type]


@pytest.fixture
def renderer(gl_context: moderngl.Context) -> Iterator[PlaneRenderer]:
    r = PlaneRenderer(gl_context, (256, 256))
    yield r
    r.release()
