"""The export rate limit, on a fake clock: rows are spaced to the rate across callers,
and idle time is not banked into a burst."""

from __future__ import annotations

import pytest
from ibex_context.memory_api.throttle import RowRateLimit

from tests.memory_api.clock import FakeClock


async def test_rows_are_spaced_to_the_rate_across_callers() -> None:
    clock = FakeClock()
    limit = RowRateLimit(1000, clock=clock, sleep=clock.sleep)

    await limit.acquire(500)  # the first page goes at once
    await limit.acquire(500)  # then each waits for the previous page's share of a second
    await limit.acquire(1000)

    assert clock.slept == pytest.approx([0.5, 0.5])
    assert clock.now == pytest.approx(101.0)
    # Two callers reserving at the same instant queue one behind the other.
    assert limit.reserve(1000) == pytest.approx(1.0)
    assert limit.reserve(1000) == pytest.approx(2.0)


async def test_idle_time_is_not_banked_into_a_burst() -> None:
    clock = FakeClock()
    limit = RowRateLimit(100, clock=clock, sleep=clock.sleep)
    await limit.acquire(100)
    clock.now += 60.0
    assert limit.reserve(100) == 0.0
    assert limit.reserve(100) == pytest.approx(1.0)


def test_a_rate_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RowRateLimit(0)
