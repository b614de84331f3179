"""What a bake reports: `BakeReport` (sizes, speed, the serial share of its CPU) and each job's
`JobTiming`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["BakeReport", "JobTiming"]


@dataclass(frozen=True, kw_only=True)
class JobTiming:
    """When one job of a bake was submitted, run in its worker and taken back, in seconds since the
    bake began (`time.perf_counter`: the system's monotonic clock, the same in every process of a
    machine), and the worker CPU it took: `BakeReport.timeline`, in the order the jobs were taken."""

    stage: int  # -1: a deferred tile row (wrap)
    band: int
    submitted: float
    started: float
    finished: float
    taken: float
    cpu_seconds: float


@dataclass(frozen=True)
class BakeReport:
    """What a bake produced and how fast."""

    path: Path
    width: int
    height: int
    levels: int
    tiles: int
    texel_format: str
    raw_bytes: int  # encoded tile bytes before supercompression
    file_bytes: int  # size of the pack file
    seconds: float
    jobs: int
    main_cpu_seconds: float = 0.0  # CPU time of the baking process (all its threads) during the bake
    worker_cpu_seconds: float = 0.0  # CPU time the jobs took in their workers, summed
    timeline: tuple[JobTiming, ...] = ()  # every job's timing (not in `as_dict`: one entry a band)

    @property
    def source_pixels(self) -> int:
        return self.width * self.height

    @property
    def serial_fraction(self) -> float:
        """The share of the bake's CPU time spent outside its jobs, in the baking process (what
        more cores cannot speed up): its own CPU time, less the jobs it ran itself in process."""
        serial = self.main_cpu_seconds - (self.worker_cpu_seconds if self.jobs == 1 else 0.0)
        return max(0.0, serial) / max(1e-9, max(0.0, serial) + self.worker_cpu_seconds)

    @property
    def mpixels_per_s(self) -> float:
        return self.source_pixels / 1e6 / max(self.seconds, 1e-9)

    def summary(self) -> str:
        ratio = self.raw_bytes / max(1, self.file_bytes)
        return (
            f"{self.path}: {self.width} x {self.height}, {self.levels} levels, {self.tiles:,} tiles "
            f"{self.texel_format}, {self.file_bytes / 2**20:,.1f} MiB (x{ratio:.2f}) in "
            f"{self.seconds:.2f} s, {self.mpixels_per_s:,.1f} MPixel/s on {self.jobs} jobs"
        )

    def as_dict(self) -> dict:
        return {
            "path": str(self.path),
            "width": self.width,
            "height": self.height,
            "levels": self.levels,
            "tiles": self.tiles,
            "format": self.texel_format,
            "raw_bytes": self.raw_bytes,
            "file_bytes": self.file_bytes,
            "seconds": self.seconds,
            "jobs": self.jobs,
            "main_cpu_seconds": self.main_cpu_seconds,
            "worker_cpu_seconds": self.worker_cpu_seconds,
            "serial_fraction": self.serial_fraction,
            "source_pixels": self.source_pixels,
            "mpixels_per_s": self.mpixels_per_s,
        }
