"""When the load test's users call: a Poisson process each, or a fixed phase each."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from loadtest.arrivals import Schedule, min_circular_gap


def starts(schedule: Schedule, calls: int, *, call_seconds: float = 0.0) -> list[float]:
    """The start times of ``calls`` calls of ``call_seconds`` each, the user waiting as told."""
    now = schedule.first_wait(0.0)
    times = []
    for _ in range(calls):
        times.append(now)
        now += call_seconds
        now += schedule.next_wait(now)
    return times


def test_a_poisson_user_waits_exponential_gaps_of_its_mean_rate() -> None:
    times = starts(Schedule("poisson", 10.0, random.Random(1), now=0.0), 20_000)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.03)
    # An exponential's standard deviation equals its mean: the gaps are not regular.
    assert statistics.pstdev(gaps) == pytest.approx(0.1, rel=0.05)


def test_a_poisson_user_whose_call_ran_late_calls_again_at_once_so_the_rate_holds() -> None:
    times = starts(Schedule("poisson", 10.0, random.Random(2), now=0.0), 2_000, call_seconds=0.06)
    # Calls of 60 ms against a mean gap of 100 ms: many start late, yet the rate is kept.
    assert len(times) / times[-1] == pytest.approx(10.0, rel=0.05)


def test_a_paced_user_calls_once_a_period_at_the_phase_it_drew() -> None:
    schedule = Schedule("paced", 10.0, random.Random(3), now=0.0)
    times = starts(schedule, 50, call_seconds=0.01)
    assert 0.0 <= schedule.phase < 0.1
    assert times[0] == pytest.approx(schedule.phase)
    assert all(b - a == pytest.approx(0.1) for a, b in itertools.pairwise(times))


def test_a_paced_user_whose_call_ran_past_its_period_shifts_its_phase() -> None:
    schedule = Schedule("paced", 10.0, random.Random(4), now=0.0)
    first = schedule.first_wait(0.0)
    # A call of 150 ms: the next starts when it ends, not at the missed period's start.
    assert schedule.next_wait(first + 0.15) == 0.0
    assert schedule.next_wait(first + 0.15) == pytest.approx(0.1)


def test_five_poisson_users_arrive_together_as_often_as_a_poisson_process_of_their_sum() -> None:
    """The run's arrivals: the share of calls with another call within 5 ms before them is
    1 - exp(-50 x 0.005) = 22 % for 50 RPS of independent arrivals."""
    rng = random.Random(5)
    times = sorted(t for _ in range(5) for t in starts(Schedule("poisson", 10.0, rng, now=0.0), 4_000))
    close = sum(1 for a, b in itertools.pairwise(times) if b - a < 0.005)
    assert close / len(times) == pytest.approx(0.221, abs=0.015)


def test_paced_users_collide_every_period_when_their_phases_are_close() -> None:
    """Paced users close in phase call close together in every period of the run."""
    rng = random.Random(6)
    users = [Schedule("paced", 10.0, rng, now=0.0) for _ in range(5)]
    gap = min_circular_gap([u.phase for u in users], 0.1)
    assert gap is not None
    times = sorted(t for u in users for t in starts(u, 100))
    close = sum(1 for a, b in itertools.pairwise(times) if b - a < gap + 1e-9)
    assert close >= 100  # at least one close pair in each of the 100 periods


def test_the_closest_phases_are_measured_around_the_period() -> None:
    assert min_circular_gap([0.001, 0.05, 0.099], 0.1) == pytest.approx(0.002)
    assert min_circular_gap([0.02, 0.07], 0.1) == pytest.approx(0.05)
    assert min_circular_gap([0.02], 0.1) is None


def test_a_rate_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="rate"):
        Schedule("poisson", 0.0, random.Random(7), now=0.0)
