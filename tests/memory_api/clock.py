"""A clock the tests advance themselves: rate limits and deadlines without waiting."""

from __future__ import annotations


class FakeClock:
    """Reads ``now``; ``sleep`` records the wait and moves ``now`` past it at once."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
