"""The one rule by which orgs share a process's scarce work: each org's items in order,
the next from the org served longest ago."""

from __future__ import annotations

from ibex_context.org_turns import OrgTurns


def _take_all(turns: OrgTurns[str]) -> list[tuple[str, str]]:
    taken = []
    while (turn := turns.take()) is not None:
        taken.append(turn)
    return taken


def test_an_orgs_items_are_taken_in_the_order_it_queued_them() -> None:
    turns: OrgTurns[str] = OrgTurns()
    for item in ("c", "a", "b"):
        turns.add("org-a", item)
    assert _take_all(turns) == [("org-a", "c"), ("org-a", "a"), ("org-a", "b")]


def test_an_org_queued_behind_anothers_flood_is_served_next() -> None:
    turns: OrgTurns[str] = OrgTurns()
    for i in range(100):
        turns.add("flood", f"f{i}")
    assert turns.take() == ("flood", "f0")
    turns.add("quiet", "q0")
    assert turns.take() == ("quiet", "q0")
    assert turns.take() == ("flood", "f1")


def test_orgs_waiting_together_alternate_one_item_each() -> None:
    turns: OrgTurns[str] = OrgTurns()
    for i in range(3):
        turns.add("a", f"a{i}")
    for i in range(2):
        turns.add("b", f"b{i}")
    assert [org for org, _ in _take_all(turns)] == ["a", "b", "a", "b", "a"]


def test_an_org_never_served_goes_before_one_served_lately() -> None:
    turns: OrgTurns[str] = OrgTurns()
    turns.add("a", "a0")
    turns.add("a", "a1")
    assert turns.take() == ("a", "a0")
    turns.add("newcomer", "n0")
    assert turns.take() == ("newcomer", "n0")


def test_an_org_that_queues_again_at_once_keeps_its_place_in_the_turns() -> None:
    turns: OrgTurns[str] = OrgTurns()
    turns.add("flood", "f0")
    turns.add("quiet", "q0")
    turns.add("quiet", "q1")
    assert turns.take() == ("flood", "f0")  # the flood's queue empties...
    turns.add("flood", "f1")  # ...and fills again at once: served lately, not never
    assert turns.take() == ("quiet", "q0")
    assert turns.take() == ("flood", "f1")


def test_an_org_forgotten_among_many_counts_as_never_served() -> None:
    turns: OrgTurns[str] = OrgTurns(remembered=2)
    turns.add("old", "o0")
    assert turns.take() == ("old", "o0")
    for org in ("x", "y"):  # two orgs emptied after it: "old" is no longer remembered
        turns.add(org, "i")
        turns.take()
    turns.add("waiting", "w0")
    turns.add("waiting", "w1")
    assert turns.take() == ("waiting", "w0")
    turns.add("old", "o1")
    assert turns.take() == ("old", "o1")


def test_first_skips_orgs_whose_first_item_does_not_fit_and_counts_no_turn() -> None:
    turns: OrgTurns[str] = OrgTurns()
    turns.add("big", "a long item")
    turns.add("small", "short")
    assert turns.first(lambda item: len(item) <= 5) == ("small", "short")
    assert turns.first(lambda item: len(item) > 50) is None
    assert turns.first() == ("big", "a long item")  # nothing served: still big's turn
    turns.served("big")
    assert turns.first() == ("small", "short")
    assert len(turns) == 2


def test_an_item_is_queued_once_per_org() -> None:
    turns: OrgTurns[str] = OrgTurns()
    assert turns.add("a", "x")
    assert not turns.add("a", "x")
    assert turns.add("b", "x")
    assert len(turns) == 2
    assert turns.holds("a") == 1
    assert turns.has("b", "x") and not turns.has("c", "x")


def test_an_item_removed_or_dropped_leaves_the_queue() -> None:
    turns: OrgTurns[str] = OrgTurns()
    for item in ("x", "y", "z"):
        turns.add("a", item)
    turns.add("b", "w")
    assert turns.largest() == "a"
    assert turns.remove("a", "x")
    assert not turns.remove("a", "x")
    assert not turns.remove("nobody", "x")
    assert turns.drop_newest("a") == "z"
    assert turns.drop_newest("nobody") is None
    assert sorted(turns) == ["w", "y"]
    assert _take_all(turns) == [("a", "y"), ("b", "w")]
    assert not turns and turns.largest() is None


def test_clearing_forgets_every_item_and_every_turn() -> None:
    turns: OrgTurns[str] = OrgTurns()
    turns.add("a", "a0")
    turns.add("a", "a1")
    turns.take()
    turns.clear()
    assert len(turns) == 0 and turns.first() is None
    turns.add("a", "a2")  # "a" was served before the clear: forgotten with it, so it
    turns.add("b", "b0")  # ties with "b" as never served and goes first, having queued first
    assert turns.take() == ("a", "a2")
