"""When each load-test user calls: the arrival process of a run.

``poisson`` (the default): each user's calls start at the events of a Poisson process of
its rate, independently of the other users', so the run's calls arrive as a Poisson
process of the offered rate, as the calls of a fleet of independent agents do. A user
whose call ran past its next start calls again at once, so the offered rate holds.

``paced``: each user calls every ``1 / rate`` seconds from a random phase drawn when it
starts, and its phase stays for the whole run (locust's ``constant_throughput``), so the
gaps between calls are the same pattern in every period. That is gentler than independent
calls: on 2026-12-05 at 50 RPS with MiniLM, three paced runs gave p99 20-21 ms and no
fallback where Poisson runs of the same command gave 28-31 ms and 0.13-0.24 %
(`benchmarks/results/rates-2026-12-05.md`, section 4). It is kept to compare with runs measured
with it; ``min_circular_gap`` says how close its users came.

Pure: the schedule is a function of the random stream and the clock readings it is
given, so the tests drive it without locust.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Literal

Arrivals = Literal["poisson", "paced"]
ARRIVALS: tuple[Arrivals, ...] = ("poisson", "paced")


class Schedule:
    """One user's call start times (seconds on the caller's monotonic clock)."""

    def __init__(self, arrivals: Arrivals, rate: float, rng: random.Random, now: float) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self._arrivals = arrivals
        self._rate = rate
        self._rng = rng
        # The first call: an exponential wait (poisson) or a uniform phase in the period (paced).
        first = rng.expovariate(rate) if arrivals == "poisson" else rng.random() / rate
        self.phase = first  # paced: where in each period this user calls
        self._next = now + first

    def first_wait(self, now: float) -> float:
        """Seconds from ``now`` to the user's first call."""
        return max(0.0, self._next - now)

    def next_wait(self, now: float) -> float:
        """After a call: seconds from ``now`` to the next call's start (0: at once)."""
        gap = self._rng.expovariate(self._rate) if self._arrivals == "poisson" else 1.0 / self._rate
        self._next += gap
        if self._arrivals == "paced" and self._next < now:
            # As constant_throughput: a late call shifts the user's phase, it does not catch up.
            self._next = now
        return max(0.0, self._next - now)


def min_circular_gap(phases: Sequence[float], period: float) -> float | None:
    """The smallest distance between two users' phases on a circle of ``period`` seconds
    (None with fewer than two users): paced users this close call together every period."""
    if len(phases) < 2:
        return None
    ordered = sorted(p % period for p in phases)
    gaps = [b - a for a, b in itertools.pairwise(ordered)]
    gaps.append(period - ordered[-1] + ordered[0])
    return min(gaps)
