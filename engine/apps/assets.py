"""Built-in assets: the default procedural demo texture, baked on first use into a cache folder.

The cache folder is $TEXSTREAM_CACHE, else $XDG_CACHE_HOME/texstream, else ~/.cache/texstream.
`make demo` points it at the repository's git-ignored .cache/.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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
        return BakeConfig(texel_format=self.texel_format, supercompression=self.supercompression,
                          tile_size=self.tile_size, progress=progress, jobs=jobs)  # fmt: skip


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
