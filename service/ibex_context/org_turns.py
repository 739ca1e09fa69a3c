"""Work queued per org, taken from the org served longest ago: the one rule by which orgs
share what a process has one or few of.

Four places queue work that orgs compete for: the embedding worker (queries, texts to
store), the writes' connections (``stores.postgres.write_slots``), the graph builds
(``stores.postgres.build_queue``) and the export rate (``memory_api.throttle``). A
first-come queue lets one org's flood hold everyone else behind all of it; this one
holds them behind one item of it:

* each org's items wait in the order they were queued;
* the next item is the first of the org **served longest ago**: an org never served,
  or not lately, goes first; ties go in the order the orgs started waiting;
* an org whose queue empties is remembered for a while (``remembered`` orgs), so a flood
  whose next item arrives just after its last was taken does not count as never served
  and jump ahead of the orgs it was taking turns with.

Items are hashable by identity or value and queued once per org (a second ``add`` of the
same item is refused). Pure bookkeeping, no I/O, no locking: each user guards it as it
guards the rest of its state (an asyncio task, or a condition's lock).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)

# Orgs remembered after their queue emptied: far more than wait at once in any use.
REMEMBERED_ORGS = 64


@dataclass(slots=True)
class _OrgQueue(Generic[T]):
    items: OrderedDict[T, None] = field(default_factory=OrderedDict)
    served: int = -1  # the turn it was last served in; -1: never (or not lately)


class OrgTurns(Generic[T]):
    """Items queued per org; ``take`` (or ``first`` then ``served``) serves the orgs in turn."""

    def __init__(self, remembered: int = REMEMBERED_ORGS) -> None:
        self._orgs: dict[str, _OrgQueue[T]] = {}
        self._size = 0
        self._turn = 0
        self._remembered = remembered
        self._recently_served: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[T]:
        """Every queued item, org by org (in no fair order: for sweeps, not turns)."""
        for queue in self._orgs.values():
            yield from queue.items

    def holds(self, org_id: str) -> int:
        """How many items ``org_id`` has queued."""
        queue = self._orgs.get(org_id)
        return 0 if queue is None else len(queue.items)

    def has(self, org_id: str, item: T) -> bool:
        queue = self._orgs.get(org_id)
        return queue is not None and item in queue.items

    def largest(self) -> str | None:
        """The org holding the most items (the first to start waiting among equals)."""
        if not self._orgs:
            return None
        return max(self._orgs, key=lambda org_id: len(self._orgs[org_id].items))

    def add(self, org_id: str, item: T) -> bool:
        """Queues ``item`` last in ``org_id``'s queue; False if it is queued already."""
        queue = self._orgs.get(org_id)
        if queue is None:
            queue = self._orgs[org_id] = _OrgQueue(served=self._recently_served.pop(org_id, -1))
        elif item in queue.items:
            return False
        queue.items[item] = None
        self._size += 1
        return True

    def first(self, fits: Callable[[T], bool] | None = None) -> tuple[str, T] | None:
        """The first item of the org served longest ago, of the orgs whose first item
        ``fits``; left queued, and no turn counted (``served`` counts it)."""
        chosen: str | None = None
        for org_id, queue in self._orgs.items():
            head = next(iter(queue.items))
            if (fits is None or fits(head)) and (chosen is None or queue.served < self._orgs[chosen].served):
                chosen = org_id
        if chosen is None:
            return None
        return chosen, next(iter(self._orgs[chosen].items))

    def served(self, org_id: str) -> None:
        """``org_id`` had a turn: it goes behind every org waiting."""
        self._turn += 1
        queue = self._orgs.get(org_id)
        if queue is not None:
            queue.served = self._turn

    def take(self, fits: Callable[[T], bool] | None = None) -> tuple[str, T] | None:
        """The first item of the org served longest ago (of the orgs whose first item
        ``fits``), taken off the queue: a turn."""
        head = self.first(fits)
        if head is not None:
            self.served(head[0])
            self.remove(*head)
        return head

    def remove(self, org_id: str, item: T) -> bool:
        """Takes ``item`` out of ``org_id``'s queue; False if it was not there."""
        queue = self._orgs.get(org_id)
        if queue is None or item not in queue.items:
            return False
        del queue.items[item]
        self._size -= 1
        if not queue.items:
            self._forget(org_id)
        return True

    def drop_newest(self, org_id: str) -> T | None:
        """Takes the item ``org_id`` queued last off the queue, and returns it."""
        queue = self._orgs.get(org_id)
        if queue is None:
            return None
        item, _ = queue.items.popitem(last=True)
        self._size -= 1
        if not queue.items:
            self._forget(org_id)
        return item

    def clear(self) -> None:
        self._orgs.clear()
        self._recently_served.clear()
        self._size = 0

    def _forget(self, org_id: str) -> None:
        queue = self._orgs.pop(org_id)
        self._recently_served[org_id] = queue.served
        if len(self._recently_served) > self._remembered:
            self._recently_served.popitem(last=False)
