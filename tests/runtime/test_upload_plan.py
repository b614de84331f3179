"""A frame's upload calls without GL: runs of consecutive layers at one cell, the time budget, and the
device path's choice, buffer size and copies."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.config import StreamerConfig, UploadPath
from texstream.runtime.upload_budget import UploadCost
from texstream.runtime.upload_plan import (
    DEVICE_MIN_SLOTS,
    PoolUploads,
    choose_upload_path,
    copy_spans,
    device_slots,
    keep_within_budget,
    upload_runs,
)


def runs_of(cache: list[int], ring: list[int], layers: int, max_run: int = 0) -> list[tuple[int, int]]:
    r = upload_runs(np.array(cache), np.array(ring), layers, max_run)
    return [(int(a), int(b)) for a, b in zip(r["start"], r["count"], strict=True)]


def test_a_run_is_consecutive_in_the_cache_and_in_the_ring() -> None:
    assert runs_of([0, 1, 2, 3], [10, 11, 12, 13], layers=8) == [(0, 4)]
    assert runs_of([0, 1, 3, 4], [10, 11, 12, 13], layers=8) == [(0, 2), (2, 2)]  # a cache gap
    assert runs_of([0, 1, 2, 3], [10, 11, 20, 21], layers=8) == [(0, 2), (2, 2)]  # a ring gap
    assert runs_of([], [], layers=8) == []


def test_a_run_never_crosses_a_cell() -> None:
    # slots 6, 7 are the last layers of cell 0; 8, 9 the first of cell 1 (8 layers a cell)
    assert runs_of([6, 7, 8, 9], [0, 1, 2, 3], layers=8) == [(0, 2), (2, 2)]


def test_max_run_cuts_long_runs_and_one_is_the_per_tile_path() -> None:
    assert runs_of(list(range(7)), list(range(7)), layers=64, max_run=3) == [(0, 3), (3, 3), (6, 1)]
    assert runs_of([0, 1, 2], [5, 6, 7], layers=64, max_run=1) == [(0, 1), (1, 1), (2, 1)]


def test_the_budget_keeps_the_most_urgent_calls_and_at_least_one() -> None:
    ring = np.arange(6)
    plan = [PoolUploads(0, ring, upload_runs(np.arange(6), ring, 2))]  # three calls of two layers
    seq = np.array([5, 6, 0, 1, 9, 9])  # the middle call was submitted first
    nbytes = np.full(6, 10_000)
    cost = UploadCost()
    tiny = keep_within_budget(plan, seq, nbytes, cost, budget_s=1e-9)
    assert len(tiny) == 1 and tiny[0].ring_slots.tolist() == [2, 3]  # at least one: the most urgent
    everything = keep_within_budget(plan, seq, nbytes, cost, budget_s=1.0)
    assert everything[0].ring_slots.tolist() == ring.tolist() and everything[0].runs.size == 3


# ---- the device path ------------------------------------------------------------------------------
def spans_of(ring: list[int], device: list[int], counts: list[int]) -> list[tuple[int, int, int]]:
    s = copy_spans(np.array(ring), np.array(device), np.array(counts))
    return [(int(a), int(b), int(c)) for a, b, c in zip(s["ring"], s["device"], s["count"], strict=True)]


def test_runs_contiguous_in_both_buffers_share_one_copy() -> None:
    assert spans_of([10, 14, 20], [0, 4, 10], [4, 6, 2]) == [(10, 0, 12)]  # one span of the ring
    assert spans_of([10, 15], [0, 4], [4, 2]) == [(10, 0, 4), (15, 4, 2)]  # a ring gap (a cancelled load)
    assert spans_of([10, 14], [30, 0], [4, 2]) == [(10, 30, 4), (14, 0, 2)]  # the device buffer wrapped
    assert spans_of([], [], []) == []


def test_the_device_path_runs_only_with_buffer_storage_and_auto_only_on_video_memory() -> None:
    def pick(requested: UploadPath, storage: bool = True, vram: bool = True, slots: int = 1024) -> UploadPath:
        return choose_upload_path(requested, buffer_storage=storage, video_memory=vram, device_slots=slots)

    assert pick(UploadPath.HOST_RING) is UploadPath.HOST_RING
    assert pick(UploadPath.DEVICE_BUFFER) is UploadPath.DEVICE_BUFFER
    assert pick(UploadPath.DEVICE_BUFFER, vram=False, slots=1) is UploadPath.DEVICE_BUFFER  # asked for: kept
    assert pick(UploadPath.DEVICE_BUFFER, storage=False) is UploadPath.HOST_RING  # cannot run: fallback
    assert pick(UploadPath.AUTO) is UploadPath.DEVICE_BUFFER
    assert pick(UploadPath.AUTO, vram=False) is UploadPath.HOST_RING  # shared memory (llvmpipe)
    assert pick(UploadPath.AUTO, storage=False) is UploadPath.HOST_RING
    assert pick(UploadPath.AUTO, slots=DEVICE_MIN_SLOTS - 1) is UploadPath.HOST_RING  # tiny budget


def test_auto_takes_the_device_buffer_and_the_staging_texture_only_when_asked_for_and_runnable() -> None:
    def pick(requested: UploadPath, storage: bool = True, vram: bool = True, compute: bool = True) -> UploadPath:
        return choose_upload_path(
            requested, buffer_storage=storage, video_memory=vram, device_slots=1024, staging_texture=compute
        )

    assert pick(UploadPath.AUTO) is UploadPath.DEVICE_BUFFER  # its calls cost the render thread less
    assert pick(UploadPath.AUTO, compute=False) is UploadPath.DEVICE_BUFFER
    assert pick(UploadPath.AUTO, vram=False) is UploadPath.HOST_RING  # shared memory (llvmpipe): as before
    assert pick(UploadPath.AUTO, storage=False) is UploadPath.HOST_RING
    assert (
        choose_upload_path(
            UploadPath.AUTO,
            buffer_storage=True,
            video_memory=True,
            device_slots=DEVICE_MIN_SLOTS - 1,
            staging_texture=True,
        )
        is UploadPath.HOST_RING
    )  # tiny budget
    assert pick(UploadPath.STAGING_TEXTURE, vram=False) is UploadPath.STAGING_TEXTURE  # asked for: kept
    assert pick(UploadPath.STAGING_TEXTURE, compute=False) is UploadPath.DEVICE_BUFFER  # cannot run: the device buffer
    assert pick(UploadPath.STAGING_TEXTURE, storage=False) is UploadPath.HOST_RING
    assert pick(UploadPath.DEVICE_BUFFER) is UploadPath.DEVICE_BUFFER  # asked for: kept
    assert StreamerConfig(upload_path="staging-texture").upload_path is UploadPath.STAGING_TEXTURE  # type: ignore[arg-type]


def test_the_device_buffer_holds_two_frames_at_the_caps_and_at_most_a_quarter_of_the_staging() -> None:
    cfg = StreamerConfig(upload_tiles_per_frame=512, upload_bytes_per_frame=32 << 20)
    assert device_slots(7256, 9248, cfg) == 1024  # two frames of 512 tiles
    assert device_slots(2000, 9248, cfg) == 500  # a quarter of a small ring
    assert device_slots(3, 9248, cfg) == 1  # never none
    by_bytes = StreamerConfig(upload_tiles_per_frame=512, upload_bytes_per_frame=10 * 9248)
    assert device_slots(7256, 9248, by_bytes) == 20  # the byte cap binds first


def test_upload_path_names_are_accepted_and_others_refused() -> None:
    assert StreamerConfig(upload_path="device-buffer").upload_path is UploadPath.DEVICE_BUFFER  # type: ignore[arg-type]
    assert StreamerConfig().upload_path is UploadPath.AUTO
    with pytest.raises(ValueError, match="upload_path must be one of auto, host-ring, device-buffer"):
        StreamerConfig(upload_path="vram")  # type: ignore[arg-type]
