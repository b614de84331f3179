"""The VRAM budget: how many bytes the engine may hold on the GPU, and who holds them.

Every GPU allocation the engine makes (cache pools, page tables, the staging ring, feedback targets)
is registered here under a name *before* it is made; `reserve` refuses, with `BudgetError`, any
registration that would take the total past the budget, so engine usage <= budget at every frame.

Budget sources, in order:

1. ``BudgetConfig.budget_mb`` when set (explicit);
2. the driver's free-memory figure (NVX_gpu_memory_info / ATI_meminfo, queried by the GL layer)
   less ``headroom`` (a fraction left to the rest of the system);
3. ``BudgetConfig.fallback_mb`` when the driver reports nothing (llvmpipe, most non-NVIDIA/AMD).

The manager also runs the feedback mip-bias controller: when the screen wants more distinct pages
than the cache can hold, the feedback is coarsened one `bias_step` per update until the working set
fits again (hysteresis between `low_water` and `high_water`).
"""

from __future__ import annotations

import logging
import math
import operator

from ..config import BudgetConfig
from ..errors import BudgetError
from ..units import MIB

__all__ = ["BudgetManager", "MIB", "budget_bytes"]

log = logging.getLogger(__name__)


def describe_allocation(name: str, nbytes: int) -> str:
    """An allocation in the library's words, with its size ('pool/bc1-srgb/136' -> 'the tile cache
    of BC1 sRGB textures (3.0 MiB)'), for messages."""
    size = _mib(nbytes)
    if name.startswith("pool/"):
        parts = name.split("/")
        kind = parts[1].upper().replace("-SRGB", " sRGB") if len(parts) > 1 else "its"
        return f"the tile cache of {kind} textures ({size})"
    return {
        "feedback": f"the feedback buffers ({size}, sized by the viewport)",
        "staging-ring": f"the staging ring ({size}, a quarter of the budget up to StreamerConfig.ring_mb)",
        "page-tables": f"the page tables ({size})",
    }.get(name, f"{name} ({size})")


def _mib(nbytes: float) -> str:
    return f"{nbytes / MIB:.1f} MiB"


def budget_bytes(megabytes: object) -> int:
    """Bytes of a budget given in MiB; ValueError unless a finite positive number."""
    if isinstance(megabytes, bool) or not isinstance(megabytes, int | float) or not math.isfinite(megabytes):
        raise ValueError(f"budget must be a finite number of MiB, got {megabytes!r}")
    nbytes = int(megabytes * MIB)
    if nbytes <= 0:
        raise ValueError(f"budget must be positive, got {megabytes!r} MiB")
    return nbytes


def _as_int(value: object, what: str) -> int:
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an integer number of bytes, got {value!r}") from None


class BudgetManager:
    """Budget, allocation registry and feedback mip-bias controller.

    Parameters
    ----------
    config
        The budget configuration.
    driver_free_bytes
        Free GPU memory the driver reports, or None when it reports nothing.
    """

    def __init__(self, config: BudgetConfig, driver_free_bytes: int | None = None) -> None:
        if driver_free_bytes is not None and driver_free_bytes < 0:
            raise ValueError(f"driver free memory must be >= 0 bytes, got {driver_free_bytes!r}")
        if config.fallback_mb <= 0:
            raise ValueError(f"fallback budget must be positive, got {config.fallback_mb!r} MiB")
        if config.bias_step <= 0 or config.max_bias < 0:
            raise ValueError(f"need bias_step > 0 and max_bias >= 0, got {config.bias_step!r}, {config.max_bias!r}")
        self.config = config
        self.driver_free_bytes = driver_free_bytes
        if config.budget_mb is not None:
            self._budget = int(config.budget_mb * MIB)
            self.source = "config"
        elif driver_free_bytes:
            self._budget = int(driver_free_bytes * (1.0 - config.headroom))
            self.source = "driver"
        else:
            self._budget = int(config.fallback_mb * MIB)
            self.source = "fallback"
        self._allocations: dict[str, int] = {}
        self._usage = 0
        self._peak = 0
        self._bias = 0.0
        log.info("VRAM budget %s (%s)", _mib(self._budget), self.source)

    # ---- budget --------------------------------------------------------------------------------
    @property
    def budget(self) -> int:
        """Bytes the engine may hold on the GPU."""
        return self._budget

    @property
    def usage(self) -> int:
        """Bytes registered now."""
        return self._usage

    @property
    def peak(self) -> int:
        """Highest usage seen."""
        return self._peak

    @property
    def available(self) -> int:
        return self._budget - self._usage

    def set_budget(self, nbytes: int) -> None:
        """Change the budget at run time.

        Shrinking below current usage is refused with BudgetError: shrink the pools first (their
        new sizes from `pool_sizing.plan_capacities` against the new budget), then lower the budget.
        """
        nbytes = _as_int(nbytes, "budget")
        if nbytes <= 0:
            raise ValueError(f"budget must be a positive number of bytes, got {nbytes!r}")
        if nbytes < self._usage:
            raise BudgetError(
                f"cannot lower the budget to {_mib(nbytes)}: {_mib(self._usage)} are allocated "
                f"(largest: {self._largest()}); shrink the cache first"
            )
        log.info("VRAM budget %s -> %s", _mib(self._budget), _mib(nbytes))
        self._budget = nbytes
        self.source = "runtime"

    # ---- registry ------------------------------------------------------------------------------
    def reserve(self, name: str, nbytes: int) -> None:
        """Register (or resize) allocation `name` to `nbytes`; BudgetError if the total would exceed.

        Call before creating or resizing the GPU object; on refusal nothing changes.
        """
        if not name:
            raise ValueError("allocation name must be a non-empty string")
        nbytes = _as_int(nbytes, f"allocation {name!r} size")
        if nbytes < 0:
            raise ValueError(f"allocation {name!r} size must be a non-negative int, got {nbytes!r}")
        old = self._allocations.get(name, 0)
        new_usage = self._usage - old + nbytes
        if new_usage > self._budget:
            held = self._usage - old
            beside = f" beside the {_mib(held)} already held" if held else ""
            raise BudgetError(
                f"the VRAM budget ({_mib(self._budget)}) is too small for {describe_allocation(name, nbytes)}{beside}",
                minimum_bytes=new_usage,
            )
        self._allocations[name] = nbytes
        self._usage = new_usage
        self._peak = max(self._peak, new_usage)
        log.debug("reserve %s: %d bytes (usage %s / %s)", name, nbytes, _mib(new_usage), _mib(self._budget))

    def release(self, name: str) -> int:
        """Unregister allocation `name` after the GPU object is freed; returns its size (0 if unknown)."""
        nbytes = self._allocations.pop(name, 0)
        self._usage -= nbytes
        return nbytes

    def reserved(self, name: str) -> int:
        return self._allocations.get(name, 0)

    def breakdown(self) -> dict[str, int]:
        """Bytes per allocation name, largest first."""
        return dict(sorted(self._allocations.items(), key=lambda kv: (-kv[1], kv[0])))

    def _largest(self) -> str:
        items = list(self.breakdown().items())[:3]
        return ", ".join(f"{n} {_mib(b)}" for n, b in items) or "none"

    # ---- feedback mip bias ---------------------------------------------------------------------
    @property
    def bias(self) -> float:
        """Current feedback mip bias in levels (0 .. max_bias)."""
        return self._bias

    @property
    def bias_levels(self) -> int:
        """Whole levels by which feedback is coarsened: floor(bias)."""
        return math.floor(self._bias)

    def update_bias(self, wanted_slots: int, available_slots: int) -> float:
        """One controller step: compare the wanted working set with the slots it may use.

        Raises the bias by `bias_step` while wanted/available > high_water, lowers it while the ratio
        < low_water, clamps to [0, max_bias]; returns the new bias.
        """
        if wanted_slots < 0 or available_slots < 0:
            raise ValueError(f"slot counts must be >= 0, got {wanted_slots!r}, {available_slots!r}")
        c = self.config
        ratio = wanted_slots / available_slots if available_slots else (math.inf if wanted_slots else 0.0)
        old = self._bias
        if ratio > c.high_water:
            self._bias = min(c.max_bias, self._bias + c.bias_step)
        elif ratio < c.low_water:
            self._bias = max(0.0, self._bias - c.bias_step)
        if self._bias != old:
            log.debug(
                "mip bias %.2f -> %.2f (wanted %d / available %d)", old, self._bias, wanted_slots, available_slots
            )
        return self._bias

    def describe(self) -> dict:
        """Plain dict for telemetry and `texstream info`."""
        return {
            "budget": self._budget,
            "source": self.source,
            "usage": self._usage,
            "peak": self._peak,
            "bias": self._bias,
            "allocations": self.breakdown(),
        }
