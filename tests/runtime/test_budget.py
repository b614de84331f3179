"""BudgetManager: budget sources, the allocation registry, pool sizing and the mip-bias controller."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.config import BudgetConfig
from texstream.errors import BudgetError
from texstream.runtime.budget import MIB, BudgetManager


def test_explicit_budget_wins_over_driver() -> None:
    b = BudgetManager(BudgetConfig(budget_mb=100), driver_free_bytes=8 << 30)
    assert b.budget == 100 * MIB and b.source == "config"


def test_auto_budget_from_driver_less_headroom() -> None:
    b = BudgetManager(BudgetConfig(headroom=0.25), driver_free_bytes=4000 * MIB)
    assert b.budget == 3000 * MIB and b.source == "driver"


@pytest.mark.parametrize("driver", [None, 0])
def test_auto_budget_falls_back_when_driver_reports_nothing(driver: int | None) -> None:
    b = BudgetManager(BudgetConfig(fallback_mb=64), driver_free_bytes=driver)
    assert b.budget == 64 * MIB and b.source == "fallback"


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="driver free memory"):
        BudgetManager(BudgetConfig(), driver_free_bytes=-1)
    with pytest.raises(ValueError, match="fallback"):
        BudgetManager(BudgetConfig(fallback_mb=0))
    with pytest.raises(ValueError, match="bias_step"):
        BudgetManager(BudgetConfig(bias_step=0))
    b = BudgetManager(BudgetConfig(budget_mb=1))
    with pytest.raises(ValueError, match="non-empty"):
        b.reserve("", 1)
    with pytest.raises(ValueError, match="'ring' size"):
        b.reserve("ring", -5)
    with pytest.raises(TypeError, match="integer"):
        b.reserve("ring", 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        b.set_budget(0)


def test_reserve_release_and_breakdown() -> None:
    b = BudgetManager(BudgetConfig(budget_mb=10))
    b.reserve("pool/bc1", 6 * MIB)
    b.reserve("ring", 2 * MIB)
    b.reserve("page_table/0", np.int64(1000))
    assert b.usage == 8 * MIB + 1000 and b.available == 2 * MIB - 1000
    assert list(b.breakdown()) == ["pool/bc1", "ring", "page_table/0"]
    b.reserve("pool/bc1", 7 * MIB)  # resize replaces
    assert b.usage == 9 * MIB + 1000 and b.reserved("pool/bc1") == 7 * MIB
    assert b.release("ring") == 2 * MIB and b.release("ring") == 0
    assert b.usage == 7 * MIB + 1000 and b.peak == 9 * MIB + 1000


def test_reserve_refusal_is_one_line_with_numbers_and_changes_nothing() -> None:
    b = BudgetManager(BudgetConfig(budget_mb=10))
    b.reserve("pool/bc1", 8 * MIB)
    with pytest.raises(BudgetError) as exc:
        b.reserve("ring", 3 * MIB)
    msg = str(exc.value)
    assert "\n" not in msg and "ring (3.0 MiB)" in msg and "8.0 MiB already held" in msg and "10.0 MiB" in msg
    assert msg.endswith("set BudgetConfig.budget_mb to at least 11") and exc.value.minimum_bytes == 11 * MIB
    assert exc.value.advice("--budget-mb", None).endswith("pass --budget-mb 11 or more")
    assert b.usage == 8 * MIB and b.reserved("ring") == 0
    with pytest.raises(BudgetError):
        b.reserve("pool/bc1", 10 * MIB + 1)  # growing an existing one is checked too
    assert b.reserved("pool/bc1") == 8 * MIB


def test_usage_never_exceeds_budget_under_random_traffic() -> None:
    rng = np.random.default_rng(11)
    b = BudgetManager(BudgetConfig(budget_mb=32))
    names = [f"a{i}" for i in range(8)]
    refused = 0
    for _ in range(2000):
        name = str(rng.choice(names))
        if rng.random() < 0.2:
            b.release(name)
        else:
            try:
                b.reserve(name, int(rng.integers(0, 12 * MIB)))
            except BudgetError:
                refused += 1
        if rng.random() < 0.05:
            try:
                b.set_budget(int(rng.integers(16, 64)) * MIB)
            except BudgetError:
                refused += 1
        assert b.usage <= b.budget
        assert b.usage == sum(b.breakdown().values())
    assert refused > 0


def test_set_budget_at_run_time() -> None:
    b = BudgetManager(BudgetConfig(budget_mb=10))
    b.reserve("pool/bc1", 6 * MIB)
    b.set_budget(20 * MIB)
    assert b.budget == 20 * MIB and b.source == "runtime"
    b.reserve("pool/bc7", 12 * MIB)
    with pytest.raises(BudgetError, match="shrink the cache first"):
        b.set_budget(15 * MIB)
    assert b.budget == 20 * MIB
    b.reserve("pool/bc7", 2 * MIB)
    b.set_budget(8 * MIB)
    assert b.budget == 8 * MIB


def test_bias_rises_when_oversubscribed_and_falls_back() -> None:
    cfg = BudgetConfig(budget_mb=1, high_water=0.9, low_water=0.5, bias_step=0.5, max_bias=2.0)
    b = BudgetManager(cfg)
    assert b.bias == 0.0 and b.bias_levels == 0
    assert b.update_bias(80, 100) == 0.0  # inside the band
    assert b.update_bias(95, 100) == 0.5
    assert b.update_bias(200, 100) == 1.0 and b.bias_levels == 1
    for _ in range(10):
        b.update_bias(500, 100)
    assert b.bias == 2.0  # clamped at max_bias
    assert b.update_bias(70, 100) == 2.0  # hysteresis: between the water marks nothing moves
    assert b.update_bias(40, 100) == 1.5 and b.bias_levels == 1
    for _ in range(10):
        b.update_bias(0, 100)
    assert b.bias == 0.0  # clamped at 0


def test_bias_with_no_available_slots() -> None:
    b = BudgetManager(BudgetConfig(budget_mb=1))
    assert b.update_bias(5, 0) == BudgetConfig().bias_step
    assert b.update_bias(0, 0) == 0.0
    with pytest.raises(ValueError, match="slot counts"):
        b.update_bias(-1, 10)


def test_describe() -> None:
    b = BudgetManager(BudgetConfig(budget_mb=2))
    b.reserve("ring", 100)
    d = b.describe()
    assert d["budget"] == 2 * MIB and d["usage"] == 100 and d["allocations"] == {"ring": 100}


def test_refusals_speak_of_the_library_not_its_allocation_names() -> None:
    b = BudgetManager(BudgetConfig(budget_mb=1))
    for name, words in [
        ("pool/bc1-srgb/136", "the tile cache of BC1 sRGB textures"),
        ("feedback", "the feedback buffers"),
        ("staging-ring", "the staging ring"),
        ("page-tables", "the page tables"),
    ]:
        with pytest.raises(BudgetError) as exc:
            b.reserve(name, 2 * MIB)
        assert words in str(exc.value) and f"'{name}'" not in str(exc.value) and "pool/" not in str(exc.value)
