"""The staging share: how many bytes of the budget the staging memory takes, and how they split between
the host ring (persistent-mapped, filled by the I/O threads) and the device side of the upload path:
the device-local buffer the uploads read on `UploadPath.DEVICE_BUFFER`, or the staging texture arrays
of `UploadPath.STAGING_TEXTURE` (`texture_staging`). Budget names: "staging-ring" and "staging-device".
"""

from __future__ import annotations

import logging

from ..config import StreamerConfig, UploadPath
from ..gl.gl_ext import GLExt
from .budget import BudgetManager
from .budget_advice import ring_bytes
from .staging import SLOT_ALIGNMENT
from .upload_plan import choose_upload_path, device_slots

log = logging.getLogger(__name__)

STAGING_NAMES = ("staging-ring", "staging-device")  # the budget's names of the host ring and the device buffer


def staging_bytes(config: StreamerConfig, budget: BudgetManager, tile_bytes: int) -> int:
    """Staging bytes (host ring and device buffer together): `config.ring_mb`, but at most a
    quarter of the budget (small budgets would otherwise be all ring) and at least 16 tiles."""
    return ring_bytes(config.ring_mb, budget.budget, tile_bytes)


def staging_split(config: StreamerConfig, gl: GLExt, total: int, tile_bytes: int) -> tuple[int, int, UploadPath]:
    """(host ring bytes, device-side bytes, path) of a `total`-byte staging share: the device side
    (`upload_plan.device_slots` ring slots' worth) only where `choose_upload_path` picks a device path."""
    stride = -(-tile_bytes // SLOT_ALIGNMENT) * SLOT_ALIGNMENT
    slots = max(1, total // stride)
    dev = device_slots(slots, stride, config)
    path = choose_upload_path(
        config.upload_path,
        buffer_storage=gl.has_buffer_storage,
        video_memory=gl.reports_video_memory,
        device_slots=dev,
        staging_texture=gl.has_staging_texture,
    )
    if config.upload_path not in (path, UploadPath.AUTO):
        log.warning("upload_path=%s cannot run on this context: %s", config.upload_path.value, path.value)
    if path is UploadPath.HOST_RING or slots < 2:
        return total, 0, UploadPath.HOST_RING
    return total - dev * stride, dev * stride, path


def staging_reserved(budget: BudgetManager) -> int:
    """Bytes the budget holds for staging (the host ring and the device buffer)."""
    return sum(budget.reserved(name) for name in STAGING_NAMES)


def release_staging(budget: BudgetManager) -> None:
    """Give the staging bytes back to the budget (after `release`)."""
    for name in STAGING_NAMES:
        budget.release(name)


def reserve_staging(
    config: StreamerConfig, gl: GLExt, budget: BudgetManager, tile_bytes: int
) -> tuple[int, int, UploadPath]:
    """Reserve the staging share in `budget` (BudgetError: nothing reserved); (host, device) bytes
    and the upload path that takes them."""
    host, device, path = staging_split(config, gl, staging_bytes(config, budget, tile_bytes), tile_bytes)
    budget.reserve("staging-ring", host)
    if device:
        try:
            budget.reserve("staging-device", device)
        except BaseException:
            release_staging(budget)
            raise
    return host, device, path


def all_to_ring(budget: BudgetManager) -> int:
    """Give the device buffer's share to the host ring (the driver refused the buffer); the ring's bytes."""
    total = staging_reserved(budget)
    release_staging(budget)
    budget.reserve("staging-ring", total)
    return total
