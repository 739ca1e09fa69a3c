"""The queue of agents waiting for their graph builds (``stores.postgres.build_queue``):
each queued once, orgs taking turns, a full queue making room for the org with the fewest."""

from __future__ import annotations

import pytest
from ibex_context.stores.postgres.build_queue import GraphBuildQueue


def _drain(queue: GraphBuildQueue) -> list[tuple[str, str]]:
    taken = []
    while (key := queue.pop()) is not None:
        taken.append(key)
    return taken


def test_an_agent_is_queued_once_until_it_is_taken() -> None:
    queue = GraphBuildQueue(10)
    assert queue.add("o", "a") and not queue.add("o", "a")
    assert ("o", "a") in queue and len(queue) == 1
    assert queue.pop() == ("o", "a")
    assert ("o", "a") not in queue and queue.pop() is None
    assert queue.add("o", "a")  # a write after its check queues it again


def test_within_an_org_agents_are_taken_in_the_order_they_were_queued() -> None:
    queue = GraphBuildQueue(10)
    for agent in ("big", "mid", "small"):
        queue.add("o", agent)
    assert _drain(queue) == [("o", "big"), ("o", "mid"), ("o", "small")]


def test_an_org_queued_behind_anothers_flood_is_served_next_not_after_it() -> None:
    """Org A's bulk import queues 100 agents, each a build of seconds; org B's one agent,
    queued after them, used to wait for all 100."""
    queue = GraphBuildQueue(1_000)
    for i in range(100):
        queue.add("A", f"a{i}")
    assert queue.pop() == ("A", "a0")  # the builder is busy with A's first
    queue.add("B", "b0")
    assert queue.pop() == ("B", "b0")
    assert queue.pop() == ("A", "a1")


def test_orgs_waiting_together_alternate_one_agent_each() -> None:
    queue = GraphBuildQueue(100)
    for i in range(3):
        queue.add("A", f"a{i}")
    for i in range(2):
        queue.add("B", f"b{i}")
    queue.add("C", "c0")
    assert _drain(queue) == [
        ("A", "a0"), ("B", "b0"), ("C", "c0"), ("A", "a1"), ("B", "b1"), ("A", "a2"),
    ]  # fmt: skip


def test_an_org_that_queues_again_at_once_does_not_jump_ahead_as_never_served() -> None:
    """A's queue empties with each turn and a write queues its next agent at once: it
    keeps its place in the rotation instead of counting as new (and going first forever)."""
    queue = GraphBuildQueue(100)
    queue.add("A", "a0")
    queue.add("B", "b0")
    queue.add("B", "b1")
    assert queue.pop() == ("A", "a0")
    queue.add("A", "a1")  # A's queue had emptied
    assert queue.pop() == ("B", "b0")
    assert queue.pop() == ("A", "a1")


def test_a_full_queue_takes_another_orgs_agent_in_place_of_the_largest_holders_newest() -> None:
    queue = GraphBuildQueue(4)
    for i in range(4):
        assert queue.add("A", f"a{i}")
    assert not queue.add("A", "a4")  # the flooding org's own next agent waits for its next write
    assert queue.add("B", "b0")  # in place of A's newest
    assert queue.add("C", "c0")
    assert len(queue) == 4
    assert not queue.add("B", "b1")  # B would hold as many as A: no swap between equals
    assert sorted(_drain(queue)) == [("A", "a0"), ("A", "a1"), ("B", "b0"), ("C", "c0")]


def test_clearing_forgets_every_agent() -> None:
    queue = GraphBuildQueue(4)
    queue.add("A", "a0")
    queue.clear()
    assert len(queue) == 0 and queue.pop() is None


def test_a_queue_holds_at_least_one_agent() -> None:
    with pytest.raises(ValueError, match="capacity"):
        GraphBuildQueue(0)
