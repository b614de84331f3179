"""The upload time budget without GL: `UploadCost` learns seconds per call and per byte from measured
frames, and `within_budget` takes upload calls most urgent first while they fit (always one)."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.runtime.upload_budget import PRIOR_BYTE_S, PRIOR_CALL_S, UploadCost, within_budget

TILE = 9248


def test_before_any_measurement_the_prior_answers() -> None:
    cost = UploadCost()
    assert cost.predict(10, 10 * TILE) == pytest.approx(10 * PRIOR_CALL_S + 10 * TILE * PRIOR_BYTE_S)


@pytest.mark.parametrize(("per_call", "per_byte"), [(20e-6, 0.1e-9), (2e-6, 2e-9), (8e-6, 0.0)])
def test_the_fit_converges_to_the_driver_s_costs(per_call: float, per_byte: float) -> None:
    """Frames of varied calls and bytes (runs of different lengths) pin both coefficients down."""
    rng = np.random.default_rng(4)
    cost = UploadCost()
    for _ in range(60):
        calls = int(rng.integers(1, 64))
        nbytes = int(rng.integers(1, 512)) * TILE
        noise = 1.0 + 0.02 * rng.standard_normal()
        cost.observe(calls, nbytes, (calls * per_call + nbytes * per_byte) * noise)
    for calls, tiles in ((1, 256), (64, 64), (10, 100)):
        want = calls * per_call + tiles * TILE * per_byte
        assert cost.predict(calls, tiles * TILE) == pytest.approx(want, rel=0.1)


def test_a_driver_slower_than_the_prior_is_learnt_within_a_few_frames() -> None:
    cost = UploadCost()
    for _ in range(8):  # every frame the same shape: 16 calls of one tile
        cost.observe(16, 16 * TILE, 16 * 50e-6)
    assert cost.predict(16, 16 * TILE) == pytest.approx(16 * 50e-6, rel=0.15)


def test_bad_measurements_are_ignored() -> None:
    cost = UploadCost()
    for calls, seconds in ((0, 1.0), (4, float("nan")), (4, -1.0), (4, float("inf"))):
        cost.observe(calls, 4 * TILE, seconds)
    assert cost.frames == 0 and cost.per_call == PRIOR_CALL_S and cost.per_byte == PRIOR_BYTE_S
    with pytest.raises(ValueError, match="decay"):
        UploadCost(decay=1.0)
    with pytest.raises(ValueError, match="prior_weight"):
        UploadCost(prior_weight=0)


def test_within_budget_takes_the_most_urgent_calls_that_fit_and_always_one() -> None:
    cost = UploadCost()
    cost.per_call, cost.per_byte = 10e-6, 0.0
    priority = np.array([5, 1, 9, 3, 7])
    nbytes = np.full(5, TILE)
    np.testing.assert_array_equal(within_budget(priority, nbytes, cost, 35e-6), [True, True, False, True, False])
    np.testing.assert_array_equal(within_budget(priority, nbytes, cost, 1e-9), [False, True, False, False, False])
    assert within_budget(priority, nbytes, cost, 1.0).all()
    assert within_budget(np.zeros(0, np.int64), np.zeros(0, np.int64), cost, 1.0).size == 0
    # bytes count too: a long run costs more than a short one
    cost.per_call, cost.per_byte = 0.0, 1e-9
    big = np.array([256 * TILE, TILE, TILE])
    np.testing.assert_array_equal(within_budget(np.arange(3), big, cost, 256.5 * TILE * 1e-9), [True, False, False])
