"""The export rate limit (on a fake clock: no timing) and page tokens."""

from __future__ import annotations

import pytest
from ibex_context.errors import InvalidRequest
from ibex_context.memory_api import page_tokens
from ibex_context.memory_api.reads import time_of_position
from ibex_context.memory_api.throttle import RowRateLimit


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


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


def test_a_token_round_trips_and_is_bound_to_its_query() -> None:
    mine = page_tokens.query_digest(["org", "agent", "CREATED_DESC"])
    theirs = page_tokens.query_digest(["other-org", "agent", "CREATED_DESC"])
    token = page_tokens.encode(mine, ["1700000000000000", "id-1"])

    assert page_tokens.decode(token, mine, 2) == ["1700000000000000", "id-1"]
    with pytest.raises(InvalidRequest) as caught:
        page_tokens.decode(token, theirs, 2)
    assert caught.value.field == "page_token"
    for garbage in ("", "!!!", "eyJ4IjoxfQ", page_tokens.encode(mine, ["only-one"])):
        with pytest.raises(InvalidRequest):
            page_tokens.decode(garbage, mine, 2)


async def test_a_forged_position_is_invalid_not_an_internal_error() -> None:
    for position in ("9" * 30, "-" + "9" * 30, "12x"):
        with pytest.raises(InvalidRequest) as caught:
            time_of_position(position)
        assert caught.value.field == "page_token"
