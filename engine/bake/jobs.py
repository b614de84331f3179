"""The bake's job records and its stage plan: what the main process, its worker processes and a Dask
cluster's workers exchange.

A *stage* tiles levels ``level .. level+count-1`` from bands of level ``level``'s rows (see
`pipeline` for how the pyramid is split); a `BandJob` is one band of a stage, a `CutJob` one deferred
tile row (wrap address mode), a `JobResult` what a worker hands back. `Settings` is everything a worker
needs besides the job. These records pickle small: band inputs travel through the shared ring
(`RingRef`) where the bake has one. Both the local pool (`pipeline`) and the cluster executor
(`cluster`) import this module; neither imports the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..pack.format import PackHeader
from ..pack.writer import EncodedTiles, PackedTiles
from .mips import Transfer
from .source import Source

__all__ = [
    "BAND_BYTES",
    "FINAL_BYTES",
    "BandJob",
    "CutJob",
    "JobResult",
    "LevelRing",
    "RingRef",
    "RingWindow",
    "Settings",
    "Stage",
    "plan_stages",
]

BAND_BYTES = 32 << 20  # input bytes of one band: bounds worker memory (~4x this) and the ring
FINAL_BYTES = 4 << 20  # a level this small (as float32 RGBA) is finished by one job


# ---- stage plan -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """Levels ``level .. level+count-1`` tiled from bands of level ``level``'s rows."""

    index: int
    level: int
    count: int
    final: bool
    width: int
    height: int
    band: int  # rows of level `level` per band
    margin: int  # extra rows each side

    @property
    def bands(self) -> int:
        return -(-self.height // self.band)

    def content(self, i: int) -> tuple[int, int]:
        return i * self.band, min(self.height, (i + 1) * self.band)

    def window(self, i: int) -> tuple[int, int]:
        a, b = self.content(i)
        return max(0, a - self.margin), min(self.height, b + self.margin)


def plan_stages(
    header: PackHeader,
    band_bytes: int | None = None,
    final_bytes: int | None = None,
    min_bands: int = 1,
    context: int = 0,
) -> list[Stage]:
    """Split the pyramid into stages whose bands stay within `band_bytes` (at least one tile row)
    and, where the level is tall enough, number at least `min_bands` (work for every worker, and a
    short wait for the last band); a level of at most `final_bytes` (as float32 RGBA) is finished
    in one job. `context`: rows each band reads past its border at every level it tiles (bleeding
    colour into transparent texels reads `mips.BLEED_ROWS`)."""
    band_bytes = BAND_BYTES if band_bytes is None else band_bytes
    final_bytes = FINAL_BYTES if final_bytes is None else final_bytes
    t, b = header.tile_size, header.border
    stages: list[Stage] = []
    s = 0
    while s < header.level_count:
        w, h = header.level_dims(s)
        remaining = header.level_count - s
        texel = 4 if s == 0 else 16  # uint8 RGBA source rows, float32 RGBA after
        if remaining == 1 or w * h * 16 <= final_bytes:
            stages.append(Stage(len(stages), s, remaining, True, w, h, h, 0))
            break
        k = 1
        while (
            k + 1 < remaining
            # Two levels per band are worth 4x the memory: a band's float output for the next
            # stage (16 bytes a texel) shrinks 4x with every level, and it travels between processes.
            and (t << k) * w * texel <= (band_bytes if k > 1 else 4 * band_bytes)
            and -(-h // (t << k)) >= min_bands
        ):
            k += 1
        stages.append(Stage(len(stages), s, k, False, w, h, t << (k - 1), (b + context) << (k - 1)))
        s += k
    return stages


# ---- jobs (pickled to workers) ---------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """Everything a worker needs besides the job itself."""

    header: PackHeader
    transfer: Transfer
    bc7_quality: str
    zstd_level: int
    alpha: bool = True  # the source may have real alpha (steers the BC7 encoder)


@dataclass(frozen=True)
class RingRef:
    """A band's rows in the shared ring: byte offset, row count, width, dtype (uint8 or float32)."""

    offset: int
    rows: int
    width: int
    dtype: str


@dataclass(frozen=True)
class LevelRing:
    """One level's float32 RGBA rows in the shared ring, row ``r`` at ring row ``r % rows``: the
    stage that makes the level writes its bands' output rows there, and the next stage's bands
    read their windows from there (the main process passes only row numbers)."""

    offset: int  # byte offset in the shared memory
    rows: int
    width: int

    @property
    def row_bytes(self) -> int:
        return self.width * 16

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    def pieces(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """Level rows [lo, hi) as (first ring row, count, index in [lo, hi)) runs: one, or two
        where the rows pass the ring's end."""
        if hi - lo > self.rows:
            raise ValueError(f"{hi - lo} rows do not fit a ring of {self.rows}")
        out, r = [], lo
        while r < hi:
            at = r % self.rows
            n = min(hi - r, self.rows - at)
            out.append((at, n, r - lo))
            r += n
        return out

    def view(self, buffer: object) -> np.ndarray:
        """The whole ring as an (rows, width, 4) float32 array over `buffer` (the shared memory)."""
        a = np.frombuffer(buffer, np.float32, self.rows * self.width * 4, self.offset)  # type: ignore[call-overload]
        return a.reshape(self.rows, self.width, 4)


@dataclass(frozen=True)
class RingWindow:
    """A band's input rows [lo, hi) of a level held in a `LevelRing`."""

    ring: LevelRing
    lo: int
    hi: int


@dataclass
class BandJob:
    """Band `band` of `stage`: where its input rows are, the other end's rows wrap needs, and where its
    output goes."""

    stage: Stage
    band: int
    data: RingRef | RingWindow | np.ndarray | None  # None: the worker reads the source itself
    source: Source | None = None  # a picklable source (procedural); else see `data`
    top_rows: dict[int, np.ndarray] = field(default_factory=dict)  # level -> uint8 rows [0, n)
    top_row0: dict[int, np.ndarray] = field(default_factory=dict)  # level -> row 0 as filtered
    bottom_rows: dict[int, np.ndarray] = field(default_factory=dict)  # level -> uint8 rows [h-n, h)
    skip_row0: bool = False  # leave each level's tile row 0 to a later CutJob (wrap)
    want_top: bool = False
    want_bottom: bool = False
    output_ring: LevelRing | None = None  # where the next stage's rows go (else `JobResult.output`)
    payload_at: tuple[int, int] | None = None  # (offset, bytes) in the shared memory for the tiles' payload


@dataclass
class CutJob:
    """Tile row `ty` of `level` cut from rows already gathered (wrap's deferred top tile row)."""

    level: int
    ty: int
    rows: np.ndarray  # (S, width, 4) uint8, already resolved by the address mode
    payload_at: tuple[int, int] | None = None  # as for `BandJob`


@dataclass
class JobResult:
    """What a worker hands back for one job: its tiles, the next stage's rows, and its timing."""

    tiles: EncodedTiles | PackedTiles = field(default_factory=EncodedTiles)
    output: np.ndarray | None = None
    top_rows: dict[int, np.ndarray] = field(default_factory=dict)
    top_row0: dict[int, np.ndarray] = field(default_factory=dict)
    bottom_rows: dict[int, np.ndarray] = field(default_factory=dict)
    alpha: bool = False  # a stage-0 band held alpha below 255
    cpu_seconds: float = 0.0  # CPU time the job took in its worker
    started: float = 0.0  # time.perf_counter() when the worker began it (the system's monotonic clock)
    finished: float = 0.0  # and when it had its result
