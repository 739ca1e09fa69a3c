"""The export rate limit: rows are spaced to the rate across callers, idle time is not
banked into a burst, what a turn did not deliver (or a caller that gave up never
started) is given back, and orgs take turns."""

from __future__ import annotations

import asyncio

import pytest
from ibex_context.memory_api.throttle import RowRateLimit

from tests.memory_api.clock import FakeClock


async def test_rows_are_spaced_to_the_rate_across_callers() -> None:
    clock = FakeClock()
    limit = RowRateLimit(1000, clock=clock, sleep=clock.sleep)

    await limit.acquire("org", 500)  # the first page goes at once
    await limit.acquire("org", 500)  # then each waits for the previous page's share of a second
    await limit.acquire("org", 1000)

    assert clock.slept == pytest.approx([0.5, 0.5])
    assert clock.now == pytest.approx(101.0)
    assert limit.reserved_seconds() == pytest.approx(1.0)


async def test_idle_time_is_not_banked_into_a_burst() -> None:
    clock = FakeClock()
    limit = RowRateLimit(100, clock=clock, sleep=clock.sleep)
    await limit.acquire("org", 100)
    clock.now += 60.0
    await limit.acquire("org", 100)  # at once: the timeline was free
    await limit.acquire("org", 100)  # but the next waits its second
    assert clock.slept == pytest.approx([1.0])


async def test_a_turn_gives_back_the_rows_it_did_not_deliver() -> None:
    clock = FakeClock()
    limit = RowRateLimit(500, clock=clock, sleep=clock.sleep)
    async with limit.turn("org", 500) as turn:
        turn.used(60)  # a page of 60 of the 500 asked for
    assert limit.reserved_seconds() == pytest.approx(60 / 500)

    with pytest.raises(OSError):
        async with limit.turn("org", 500):
            raise OSError("the query failed")  # delivered nothing: everything given back
    assert clock.slept == pytest.approx([60 / 500])  # it waited for the 60 rows only
    assert limit.reserved_seconds() == 0.0


async def test_exports_cancelled_while_waiting_reserve_nothing() -> None:
    """The attack: 2,000 exports with a 1 ms deadline. Before, each reserved its page on
    the shared timeline and kept it: about an hour at 500 rows a second."""
    limit = RowRateLimit(500)
    async with limit.turn("org-a", 500) as held:  # a page in progress: the others must wait
        held.used(500)
        results = await asyncio.gather(
            *(asyncio.wait_for(limit.acquire("org-a", 500), 0.001) for _ in range(2000)),
            return_exceptions=True,
        )
    assert all(isinstance(r, TimeoutError) for r in results)
    # The page in progress, nothing more (a second at 500 rows a second).
    assert limit.reserved_seconds() <= 1.0
    await asyncio.wait_for(limit.acquire("org-b", 60), 5.0)  # and the next caller gets a turn
    assert limit.waiting == 0


async def test_orgs_take_turns_so_one_orgs_queue_cannot_starve_another() -> None:
    clock = FakeClock()
    limit = RowRateLimit(100, clock=clock, sleep=clock.sleep)
    granted: list[str] = []

    async def export(org: str) -> None:
        async with limit.turn(org, 100) as turn:
            granted.append(org)
            turn.used(100)

    flood = [asyncio.ensure_future(export("a")) for _ in range(5)]  # queued first
    quiet = asyncio.ensure_future(export("b"))
    await asyncio.wait_for(asyncio.gather(*flood, quiet), 5.0)

    # b waits for one of a's pages, not for all five.
    assert granted == ["a", "b", "a", "a", "a", "a"]


def test_a_rate_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RowRateLimit(0)
