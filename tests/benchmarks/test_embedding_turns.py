"""``benchmarks.embedding_turns``: the same calls go through every turn size, and each call's
wait and the worker's CPU are reported."""

from __future__ import annotations

import random

from benchmarks.embedding_turns import arrivals, measure, parse, question, report
from loadtest import corpus


def test_a_rounds_calls_are_fixed_by_its_seed_and_arrive_at_the_rate_asked() -> None:
    calls = arrivals(random.Random(7), rate=50.0, seconds=20.0)
    assert calls == arrivals(random.Random(7), rate=50.0, seconds=20.0)
    assert 850 <= len(calls) <= 1150  # a Poisson count of mean 1,000 (seeded: always the same)
    offsets = [at for at, _ in calls]
    assert offsets == sorted(offsets) and offsets[0] > 0 and offsets[-1] < 20.0
    # Questions as the load test asks them: unique, about a memory.
    assert len({text for _, text in calls}) == len(calls)
    assert all(text.rsplit(" ", 3)[0].endswith("?") for _, text in calls)


def test_questions_are_made_as_the_load_test_makes_them() -> None:
    text = question(random.Random(3))
    openers = ("What do we know about", "Remind me about", "Can you check", "What was", "Any notes")
    assert text.startswith(openers)
    assert all(word in corpus.TAG_WORDS for word in text.split()[-3:])


async def test_every_call_goes_through_every_turn_size_and_is_reported() -> None:
    args = parse(["--turns", "2,1", "--rate", "40", "--seconds", "0.5", "--rounds", "2", "--nice", "0"])
    arms = await measure(args)
    assert [arm.queries_per_turn for arm in arms] == [2, 1]
    calls = sum(len(arrivals(random.Random(args.seed + r), args.rate, args.seconds)) for r in range(2))
    for arm in arms:
        assert len(arm.waits_ms) == calls and min(arm.waits_ms) > 0
        assert sum(turn.texts for turn in arm.turns) == calls and arm.cpu_ms_a_query > 0
    # One a turn: an inference a query.
    assert len(arms[1].turns) == calls
    table = report(arms, args, "cmd")
    assert "| 2 | " in table and "| 1 | " in table and "nice 0" in table
