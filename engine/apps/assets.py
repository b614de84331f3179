"""Built-in assets: the default procedural demo textures and the gallery's, baked on first use into a
cache folder and reused afterwards.

The cache folder is $TEXSTREAM_CACHE, else $XDG_CACHE_HOME/texstream, else ~/.cache/texstream.
`make demo` points it at the repository's git-ignored .cache/.
"""

from __future__ import annotations

import logging
import os
import sys
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from ..config import BakeConfig, cache_dir
from ..pack.format import Supercompression, TexelFormat

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class AssetRecipe:
    """A procedural pack: what to generate and how to encode it."""

    name: str
    pattern: str
    size: int
    seed: int
    texel_format: TexelFormat
    supercompression: Supercompression = Supercompression.ZSTD
    tile_size: int = 128

    @property
    def filename(self) -> str:
        fmt = self.texel_format.name.lower()
        return f"{self.name}-{self.pattern}-{self.size}-{fmt}-t{self.tile_size}-s{self.seed}.tpk"

    def bake_config(self, progress: bool = True, jobs: int = 0) -> BakeConfig:
        return BakeConfig(
            texel_format=self.texel_format,
            supercompression=self.supercompression,
            tile_size=self.tile_size,
            progress=progress,
            jobs=jobs,
        )


# The default demo asset: 32768^2 terrain colour (1 Gtexel; 512 MiB as BC1 on the GPU if all resident).
DEFAULT_TERRAIN = AssetRecipe(name="default", pattern="terrain", size=32768, seed=1, texel_format=TexelFormat.BC1)
# Its normal map (same terrain, half the resolution: lighting needs less detail), BC5, 128 MiB if all resident.
DEFAULT_NORMALS = AssetRecipe(name="default", pattern="normals", size=16384, seed=1, texel_format=TexelFormat.BC5)


def ensure_asset(recipe: AssetRecipe = DEFAULT_TERRAIN, progress: bool = True, folder: Path | None = None) -> Path:
    """Path of the recipe's pack, baking it first if the cache does not hold it yet."""
    from ..bake.pipeline import bake_procedural

    folder = folder or cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / recipe.filename
    if not path.exists():
        log.warning("baking %s (first use; cached in %s)", recipe.filename, folder)
        bake_procedural(path, recipe.size, recipe.pattern, recipe.seed, recipe.bake_config(progress=progress))
    return path


# The gallery's textures: one per object, each its own pattern and seed (terrain, its normal map read
# as colour, the labelled checker), all BC1 with 128-texel tiles, so they share one cache pool.
GALLERY_PATTERNS = ("terrain", "checker", "normals")
GALLERY_SEED = 1000
GALLERY_FOLDER = "gallery"


def gallery_recipes(count: int, size: int) -> list[AssetRecipe]:
    """The recipes of a gallery of `count` objects with `size`^2 textures."""
    return [
        AssetRecipe(
            name=f"gallery{i:03d}",
            pattern=GALLERY_PATTERNS[i % len(GALLERY_PATTERNS)],
            size=size,
            seed=GALLERY_SEED + i,
            texel_format=TexelFormat.BC1,
        )
        for i in range(count)
    ]


def _bake_recipe(recipe: AssetRecipe, path: Path) -> None:
    from ..bake.pipeline import bake_procedural

    bake_procedural(path, recipe.size, recipe.pattern, recipe.seed, recipe.bake_config(progress=False, jobs=1))


def ensure_gallery(
    count: int, size: int, progress: bool = True, folder: Path | None = None, jobs: int = 0
) -> list[Path]:
    """Paths of the gallery's packs, baking those the cache lacks (one texture per process, `jobs`
    processes, default every core: many small bakes keep every core busier than one at a time)."""
    folder = (folder or cache_dir()) / GALLERY_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    recipes = gallery_recipes(count, size)
    paths = [folder / r.filename for r in recipes]
    todo = [(r, p) for r, p in zip(recipes, paths, strict=True) if not p.exists()]
    if not todo:
        return paths
    log.warning("baking %d gallery textures of %d^2 (first use; cached in %s)", len(todo), size, folder)
    workers = min(len(todo), jobs or os.cpu_count() or 1)
    from ..bake.workers import forget_start_environment, worker_start_environment

    # Processes start (multiprocessing's resource tracker with the pool's queues, the bakers as tasks
    # are submitted) with the bake workers' start environment: nothing imported from the working
    # folder (see texstream.bake.workers).
    with worker_start_environment():
        pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=forget_start_environment)
    with pool:
        with worker_start_environment():
            futures = [pool.submit(_bake_recipe, r, p) for r, p in todo]
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=1.0, return_when=FIRST_EXCEPTION)
                for f in done:
                    f.result()  # a failed bake ends the run with its error
                if progress:
                    count_done = len(futures) - len(pending)
                    print(f"\rbaking gallery textures: {count_done}/{len(futures)}", end="", file=sys.stderr)
        except BaseException:
            pool.shutdown(cancel_futures=True)  # the bakes not started yet; each bake writes atomically
            raise
        finally:
            if progress:
                print(file=sys.stderr)
    return paths
