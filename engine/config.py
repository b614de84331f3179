"""Configuration: frozen, keyword-only dataclasses, each field documented in its class docstring."""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .pack.format import MAX_BORDER, TILE_SIZES, AddressMode, Supercompression, TexelFormat

# BC7 quality levels, fastest first (`BakeConfig.bc7_quality`; `bake.encoders` maps each to its encoder settings).
BC7_QUALITIES = ("fast", "balanced", "normal", "slow")

__all__ = ["BakeConfig", "BudgetConfig", "RedirectPolicy", "RemoteConfig", "StreamerConfig", "UploadPath", "cache_dir"]


def cache_dir() -> Path:
    """The folder for generated assets, downloaded sources and the remote-pack cache:
    $TEXSTREAM_CACHE, else $XDG_CACHE_HOME/texstream, else ~/.cache/texstream."""
    env = os.environ.get("TEXSTREAM_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "texstream"


@dataclass(frozen=True, kw_only=True)
class BakeConfig:
    """How a source becomes a pack.

    Attributes
    ----------
    texel_format : TexelFormat | None
        None: chosen per source (`format_for`): bc1 for opaque colour, bc7 when the source has real alpha. Else
        bc1 opaque colour; bc3/bc7 alpha; bc4 one channel; bc5 normals; rgba8 uncompressed.
    srgb : bool | None
        None: sRGB for colour formats (bc1/bc3/bc7/rgba8), linear for bc4/bc5
    tile_size : int
        content texels a side: 64, 128 or 256
    border : int
        texels copied from neighbours on each side; multiple of 4
    address_mode : AddressMode
        what filtering sees past the image edge
    supercompression : Supercompression
        none, zstd or lz4, per tile
    zstd_level : int
        1..19; 2 (the default) compresses texstream's block data as small as 3 (zstd's own default)
        within half a percent, with 13-30 % less CPU (docs/BENCHMARKS.md)
    bc7_quality : str
        fast | balanced | normal | slow: ispc-texcomp's ultrafast | ultrafast, then veryfast on the blocks
        one colour line fits badly | veryfast | basic profiles (alpha_* ones for slots with alpha: balanced
        takes normal's); one core, 136² slots: 26 | 8.2 | 1.7 | 0.47 MPixel/s at 39.9 | 43.1 | 43.8 | 44.4 dB
        PSNR on assets/astronaut.png (`texstream bench bake` measures them again)
    jobs : int
        worker processes; 0: every core
    progress : bool
        tqdm progress bar on stderr
    cluster : str | None
        None: bands run in local worker processes. "local:N": a Dask LocalCluster of N worker processes started
        for the bake; else a Dask scheduler's address ("tcp://host:8786", "host:8786") whose workers run the
        bands (they need texstream installed and the source on storage they can read).
    """

    texel_format: TexelFormat | None = None
    srgb: bool | None = None
    tile_size: int = 128
    border: int = 4
    address_mode: AddressMode = AddressMode.CLAMP
    supercompression: Supercompression = Supercompression.ZSTD
    zstd_level: int = 2
    bc7_quality: str = "normal"
    jobs: int = 0
    progress: bool = True
    cluster: str | None = None

    def __post_init__(self) -> None:
        if self.texel_format is not None:
            object.__setattr__(self, "texel_format", TexelFormat(self.texel_format))
        object.__setattr__(self, "address_mode", AddressMode(self.address_mode))
        object.__setattr__(self, "supercompression", Supercompression(self.supercompression))
        if self.tile_size not in TILE_SIZES:
            raise ValueError(f"tile size must be one of {', '.join(map(str, TILE_SIZES))}, got {self.tile_size!r}")
        if not (0 <= self.border <= MAX_BORDER and self.border % 4 == 0):
            raise ValueError(f"border must be a multiple of 4 in 0..{MAX_BORDER}, got {self.border!r}")
        if self.bc7_quality not in BC7_QUALITIES:
            raise ValueError(f"bc7 quality must be one of {', '.join(BC7_QUALITIES)}, got {self.bc7_quality!r}")
        if not 1 <= self.zstd_level <= 19:
            raise ValueError(f"zstd level must be in 1..19, got {self.zstd_level!r}")
        if self.jobs < 0:
            raise ValueError(f"jobs must be >= 0, got {self.jobs!r}")
        if self.srgb and self.texel_format is not None and not self.texel_format.colour:
            raise ValueError(f"{self.texel_format.name.lower()} holds linear data; it cannot be sRGB")
        if self.cluster is not None:
            _check_cluster_address(self.cluster)

    def format_for(self, alpha: bool) -> TexelFormat:
        """The texel format of a bake: the one given, else bc7 for a source with real alpha (the
        quality choice for alpha: bc3 is faster but bands and blocks its colour) and bc1 for the rest."""
        if self.texel_format is not None:
            return self.texel_format
        return TexelFormat.BC7 if alpha else TexelFormat.BC1

    @property
    def is_srgb(self) -> bool:
        """sRGB colour unless told otherwise; a chosen format (None) is always a colour one."""
        if self.srgb is not None:
            return self.srgb
        return self.texel_format is None or self.texel_format.colour

    @property
    def worker_count(self) -> int:
        """`jobs`, or the cores this process may run on (its CPU affinity: taskset, a container's
        cpuset), not every core of the machine."""
        return self.jobs or usable_cores()


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        try:
            return max(1, len(affinity(0)))
        except OSError:
            pass
    return os.cpu_count() or 1


_LOCAL_CLUSTER = re.compile(r"local:(\d+)")
# scheme://host:port or host:port; host a name, an IPv4 address or a bracketed IPv6 one
_SCHEDULER_ADDRESS = re.compile(r"(?:(?:tcp|tls|ws|wss)://)?(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})")


def _check_cluster_address(cluster: str) -> None:
    """`BakeConfig.cluster`: "local:N" with N >= 1, or a Dask scheduler's [scheme://]host:port."""
    if not isinstance(cluster, str):
        raise TypeError(f"cluster must be a string, got {type(cluster).__name__}")
    local = _LOCAL_CLUSTER.fullmatch(cluster)
    if local:
        if int(local.group(1)) < 1:
            raise ValueError(f"cluster {cluster!r}: a local cluster needs at least one worker (local:N, N >= 1)")
        return
    address = _SCHEDULER_ADDRESS.fullmatch(cluster)
    if address is None or not 1 <= int(address.group(1)) <= 65535:
        raise ValueError(
            f"cluster {cluster!r} is neither local:N nor a scheduler address like tcp://host:8786 or host:8786"
        )


@dataclass(frozen=True, kw_only=True)
class BudgetConfig:
    """The engine's VRAM budget.

    Attributes
    ----------
    budget_mb : float | None
        None: auto, the driver's free memory less `headroom`
    headroom : float
        fraction of the driver's free memory left to everything else
    fallback_mb : float
        auto budget when the driver reports no memory figure (llvmpipe, most non-NVIDIA)
    high_water : float
        wanted/available slot ratio above which the feedback mip bias rises
    low_water : float
        ratio below which the bias falls again
    bias_step : float
        bias change per update() while outside the water marks
    max_bias : float
        never coarser than this many levels above what the screen wants
    """

    budget_mb: float | None = None
    headroom: float = 0.10
    fallback_mb: float = 256.0
    high_water: float = 0.95
    low_water: float = 0.75
    bias_step: float = 0.25
    max_bias: float = 6.0

    def __post_init__(self) -> None:
        if self.budget_mb is not None and not (math.isfinite(self.budget_mb) and self.budget_mb > 0):
            raise ValueError(f"budget must be a positive number of MiB, got {self.budget_mb!r}")
        for name in ("fallback_mb", "bias_step", "max_bias"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.bias_step == 0:
            raise ValueError("bias_step must be > 0 (the mip bias could never rise under pressure)")
        if not 0.0 <= self.headroom < 1.0:
            raise ValueError(f"headroom must be in [0, 1), got {self.headroom!r}")
        if not 0.0 < self.low_water < self.high_water <= 1.0:
            raise ValueError(f"need 0 < low_water < high_water <= 1, got {self.low_water!r}, {self.high_water!r}")


class UploadPath(enum.Enum):
    """Where a frame's upload calls read tiles from (`StreamerConfig.upload_path`).

    I/O threads always write tiles into the persistent-mapped staging ring in host memory.
    """

    # with dedicated video memory DEVICE_BUFFER; on shared memory (llvmpipe, integrated GPUs) HOST_RING
    # (never STAGING_TEXTURE: the most tiles a second, but more render-thread time per call)
    AUTO = "auto"
    HOST_RING = "host-ring"  # upload straight from the host ring (the driver reads host memory per call)
    DEVICE_BUFFER = "device-buffer"  # copy ring spans into a device-local buffer, upload from there
    # a compute pass reads the ring's blocks into a 32-bit-integer staging array (one texel a block),
    # then one block-compatible glCopyImageSubData a run into the cache (needs GL 4.3 compute shaders):
    # the highest GPU upload rate (H200: 1.3-1.7x DEVICE_BUFFER), for programs the GPU's copies bind
    STAGING_TEXTURE = "staging-texture"


class RedirectPolicy(enum.Enum):
    """Which HTTP redirects a remote pack's requests follow (each hop is checked before it is sent).

    A redirect from a public address to a loopback, private or link-local one is refused whatever the
    policy, so a server on the internet cannot steer requests into the local network.
    """

    NONE = "none"  # follow no redirect
    SAME_ORIGIN = "same-origin"  # another path on the same scheme, host and port
    SAME_SITE = "same-site"  # also the host's parent or a subdomain of it, any port, http -> https upgrades

    @classmethod
    def _missing_(cls, value: object) -> object:
        if isinstance(value, str):  # "same_site", "SAME-SITE": as the CLI and configs spell them
            return next((m for m in cls if m.value == value.lower().replace("_", "-")), None)
        return None


@dataclass(frozen=True, kw_only=True)
class RemoteConfig:
    """How packs named by a URL (http(s)://, or any fsspec filesystem such as s3://) are read.

    Attributes
    ----------
    cache_dir : str | None
        Fetched ranges are kept on disk, shared by every remote pack: $TEXSTREAM_CACHE/remote by default (see
        `texstream.cache_dir`). The size bounds the cache file; 0 turns the cache off.
    cache_mb : float
    block_kb : int
        fetch and cache granularity: a request covers whole blocks of the pack
    max_requests : int
        requests in flight at once, per pack
    max_request_kb : int
        adjacent blocks are fetched with one request up to this size
    connect_timeout_s : float
    read_timeout_s : float
        between bytes of a response
    request_deadline_s : float
        one range, retries included (below StreamerConfig.read_timeout_s)
    retries : int
        a request failing transiently (connection refused, reset or closed, timeout, HTTP 429 or 5xx) is tried again
        this many times, with doubling jittered backoff or the server's Retry-After, all within request_deadline_s; a
        keep-alive connection the server had closed is retried at once, once, on top
    backoff_s : float
        the first retry's wait (jittered)
    offline_s : float
        after a range failed every retry because the server could not be reached, requests fail at once for this long
    retry_after_cap_s : float
        a Retry-After longer than the request's time left fails the request at once, and this pack's requests then
        wait min(Retry-After, this) before asking again
    stale_recheck_s : float
        after the pack changed on the server, one request this often asks whether the opened version is back
    redirects : RedirectPolicy
        which redirects are followed (same-origin by default; see RedirectPolicy)
    storage_options : dict
        passed to fsspec (credentials, endpoints)
    """

    cache_dir: str | None = None
    cache_mb: float = 1024.0
    block_kb: int = 64
    max_requests: int = 8
    max_request_kb: int = 4096
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 5.0
    request_deadline_s: float = 8.0
    retries: int = 2
    backoff_s: float = 0.1
    offline_s: float = 1.0
    retry_after_cap_s: float = 30.0
    stale_recheck_s: float = 5.0
    redirects: RedirectPolicy = RedirectPolicy.SAME_ORIGIN
    storage_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        finite = {
            "cache_mb": self.cache_mb >= 0,
            "connect_timeout_s": self.connect_timeout_s > 0,
            "read_timeout_s": self.read_timeout_s > 0,
            "request_deadline_s": self.request_deadline_s > 0,
            "backoff_s": self.backoff_s >= 0,
            "offline_s": self.offline_s >= 0,
            "retry_after_cap_s": self.retry_after_cap_s >= 0,
            "stale_recheck_s": self.stale_recheck_s >= 0,
        }
        for name, ok in finite.items():
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and ok):
                raise ValueError(f"remote {name} is out of range: {value!r}")
        if self.cache_mb > (1 << 20):  # 1 TiB: the cache index is one entry per block, kept in memory
            raise ValueError(f"remote cache_mb is at most {1 << 20}, got {self.cache_mb!r}")
        if self.block_kb not in (16, 32, 64, 128, 256, 512, 1024):
            raise ValueError(f"remote block_kb must be a power of two in 16..1024, got {self.block_kb!r}")
        if not 1 <= self.max_requests <= 64:
            raise ValueError(f"remote max_requests must be in 1..64, got {self.max_requests!r}")
        if not self.block_kb <= self.max_request_kb <= 65536:
            raise ValueError(f"remote max_request_kb must be in block_kb..65536, got {self.max_request_kb!r}")
        if not 0 <= self.retries <= 10:
            raise ValueError(f"remote retries must be in 0..10, got {self.retries!r}")
        if not isinstance(self.redirects, RedirectPolicy):
            try:  # a name ("same-site") is accepted; the field then holds the member
                object.__setattr__(self, "redirects", RedirectPolicy(self.redirects))
            except ValueError:
                names = ", ".join(m.value for m in RedirectPolicy)
                raise ValueError(f"remote redirects must be one of {names}, got {self.redirects!r}") from None
        if not isinstance(self.storage_options, dict):
            raise TypeError(f"storage_options must be a dict, got {type(self.storage_options).__name__}")

    @property
    def block_bytes(self) -> int:
        return self.block_kb << 10

    @property
    def cache_bytes(self) -> int:
        return int(self.cache_mb * (1 << 20)) // self.block_bytes * self.block_bytes


@dataclass(frozen=True, kw_only=True)
class StreamerConfig:
    """Runtime streaming behaviour.

    Attributes
    ----------
    budget : BudgetConfig
        the VRAM budget and its mip-bias controller
    budget_mb : float | None
        shortcut for ``budget=BudgetConfig(budget_mb=...)``: the budget in MiB; None: `budget` decides.
        An explicit `budget` whose own ``budget_mb`` differs is refused (ValueError)
    ring_mb : int
        persistent-mapped staging ring ("pinned" upload memory)
    io_threads : int
        pread + checksum + decompress workers
    frames_in_flight : int
        a tile is evicted only this many frames after its last use
    upload_bytes_per_frame : int
        upload cap per update(), bytes
    upload_tiles_per_frame : int
        upload cap per update(), tiles (and requests issued per update)
    upload_max_run : int
        most layers one upload call writes (0: no limit; 1: one call per tile). A frame's loads go up
        in runs of consecutive cache layers, one call each; some drivers copy long runs slower
    upload_path : UploadPath | str
        where the upload calls read from: ``auto`` (default), ``host-ring``, ``device-buffer`` or
        ``staging-texture`` (`UploadPath`); the device paths need buffer storage and fall back to the
        host ring without it; the staging texture also needs compute shaders, image load/store and
        shader storage buffers (GL 4.3), else it falls back to the device buffer.
        `Streamer.io_status().upload_path` says which one runs
    upload_staging_min_tiles : int
        on the staging-texture path, a pool's frame batch of fewer tiles uploads straight from the
        ring: a fill dispatch and a copy cost the render thread more than a few upload calls (on
        NVIDIA a copy call costs several times an upload call), and pay only on larger batches
    upload_time_budget_ms : float | None
        render-thread time per update() for upload calls, predicted from their measured cost on this
        driver (seconds per call and per byte); the calls that do not fit wait for the next frame
        (at least one goes out each frame). The tile and byte caps still bound it. None: no limit
    request_tiles_per_frame : int | None
        loads issued per update() when it should differ from the upload cap (None: the same);
        more than the upload cap lets read tiles wait for their upload
    feedback_divisor : int
        feedback buffer is the framebuffer size / this
    feedback_compaction : bool
        reduce the feedback to unique pages on the GPU before reading it back (compute shaders, GL
        4.3; where the context lacks them, or the budget lacks room, the CPU reduces the entries);
        while allowed, it runs only when it costs the render thread less than the CPU reduction
        (both ways are measured, `feedback_reduce.CompactionChoice`)
    feedback_burst_frames : int
        after the wanted pages jump (a camera cut), this many frames record feedback at half the
        divisor, four times the fragments, so pages covering a few pixels are found at once
        (`runtime.feedback_bursts`); then as many frames at the divisor before the next burst. The
        buffers are sized for it when that takes at most 1/16 of the budget, else dense frames need
        draws of at most half the sizing size. 0: never
    cut_neighbours : bool
        on the frame whose feedback shows the wanted pages jump (a camera cut), also request the
        eight same-level neighbours of every wanted page as demand: the pages the new view's first
        feedback missed lie next to those it found (`RequestScheduler.widened`); about a quarter
        more loads for that view, a round trip less before nothing is missing. Views wanting more
        pages than a frame's request cap are not widened
    cancel_after_frames : int
        a queued request not wanted again for this long is dropped
    prefetch : bool
        also request neighbours and the next finer level of what is wanted
    pinned_levels : int
        each texture's coarsest levels stay resident (never evicted)
    retry_frames : int
        a failed tile is retried after this many frames (doubling each time)
    debug_gl : bool
        glGetError after every raw GL call, GLError naming the call
    read_timeout_s : float
        a tile read hanging this long is given up (failed, retried later)
    shutdown_wait_s : float
        release() waits this long for reads in progress, then abandons them
    native : bool
        compiled I/O and upload loops when built (texstream.native); False: pure Python
    remote : RemoteConfig
        packs opened by URL
    """

    budget: BudgetConfig = field(default_factory=BudgetConfig)
    budget_mb: float | None = None
    ring_mb: int = 64
    io_threads: int = 4
    frames_in_flight: int = 3
    upload_bytes_per_frame: int = 32 << 20
    upload_tiles_per_frame: int = 512
    upload_max_run: int = 0
    upload_path: UploadPath = UploadPath.AUTO
    upload_staging_min_tiles: int = 64
    upload_time_budget_ms: float | None = None
    request_tiles_per_frame: int | None = None
    feedback_divisor: int = 8
    feedback_compaction: bool = True
    feedback_burst_frames: int = 4
    cut_neighbours: bool = True
    cancel_after_frames: int = 8
    prefetch: bool = True
    pinned_levels: int = 2
    retry_frames: int = 60
    debug_gl: bool = False
    read_timeout_s: float = 10.0
    shutdown_wait_s: float = 2.0
    native: bool = True
    remote: RemoteConfig = field(default_factory=RemoteConfig)

    def __post_init__(self) -> None:
        checks = {
            "ring_mb": self.ring_mb >= 1,
            "io_threads": self.io_threads >= 1,
            "frames_in_flight": self.frames_in_flight >= 1,
            "upload_bytes_per_frame": self.upload_bytes_per_frame >= 1,
            "upload_tiles_per_frame": self.upload_tiles_per_frame >= 1,
            "upload_max_run": self.upload_max_run >= 0,
            "upload_staging_min_tiles": self.upload_staging_min_tiles >= 1,
            "upload_time_budget_ms": self.upload_time_budget_ms is None
            or (math.isfinite(self.upload_time_budget_ms) and self.upload_time_budget_ms > 0),
            "request_tiles_per_frame": self.request_tiles_per_frame is None or self.request_tiles_per_frame >= 1,
            "feedback_divisor": self.feedback_divisor >= 1,
            "feedback_burst_frames": self.feedback_burst_frames >= 0,
            "cancel_after_frames": self.cancel_after_frames >= 1,
            "pinned_levels": self.pinned_levels >= 1,
            "retry_frames": self.retry_frames >= 1,
            "read_timeout_s": math.isfinite(self.read_timeout_s) and self.read_timeout_s > 0,
            "shutdown_wait_s": math.isfinite(self.shutdown_wait_s) and self.shutdown_wait_s >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name} is out of range: {getattr(self, name)!r}")
        if not isinstance(self.upload_path, UploadPath):
            try:  # a name ("device-buffer") is accepted; the field then holds the member
                object.__setattr__(self, "upload_path", UploadPath(self.upload_path))
            except ValueError:
                names = ", ".join(m.value for m in UploadPath)
                raise ValueError(f"upload_path must be one of {names}, got {self.upload_path!r}") from None
        if not isinstance(self.remote, RemoteConfig):
            raise TypeError(f"remote must be a RemoteConfig, got {type(self.remote).__name__}")
        if not isinstance(self.budget, BudgetConfig):
            raise TypeError(f"budget must be a BudgetConfig, got {type(self.budget).__name__}")
        if self.budget_mb is not None:
            mb = self.budget_mb
            if isinstance(mb, bool) or not isinstance(mb, int | float):
                raise TypeError(f"budget_mb must be a number of MiB, got {type(mb).__name__}")
            if self.budget.budget_mb is not None and self.budget.budget_mb != mb:
                raise ValueError(
                    f"budget_mb={mb!r} conflicts with budget=BudgetConfig(budget_mb={self.budget.budget_mb!r}): "
                    "give the budget once"
                )
            # the shortcut fills the nested config, so everything else reads config.budget only
            object.__setattr__(self, "budget", dataclasses.replace(self.budget, budget_mb=mb))
