"""The agents waiting for their graph's size check and build, fair between orgs.

A process builds one graph at a time (``graphs``), seconds to a minute each, and an agent
waiting for its graph is searched exactly meanwhile, dearer at every call the larger it is.
In the order agents were queued, one org's bulk import of a thousand agents would hold
every other org's agent behind a thousand builds; and once the queue was full, nobody
else's agent was queued at all. So:

* **Orgs take turns.** The next agent is the first queued of the org served longest ago
  (an org never served, or not lately, first); within an org, agents go in the order
  they were queued (``queue_grown`` queues the largest first).
* **A full queue makes room for the org with the fewest.** At ``capacity`` an agent of
  an org holding fewer entries than the largest holder takes the place of that holder's
  newest entry; the largest holder's own agents are refused. An agent left out is queued
  by its next write or at the next start (``PostgresMemoryStore.queue_grown``), and is
  searched exactly until then.

Pure bookkeeping, no I/O: the store's one builder task takes from it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

# Orgs whose last turn is remembered after their queue emptied (an org that queues again
# at once does not count as never served): more than build at once by far.
_RECENTLY_SERVED = 64


@dataclass(slots=True)
class _OrgAgents:
    agents: OrderedDict[str, None] = field(default_factory=OrderedDict)
    served: int = -1  # the turn it was last served in; -1 never (or not lately)


class GraphBuildQueue:
    """(org_id, agent_id) pairs queued once each, taken one at a time org by org."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._orgs: dict[str, _OrgAgents] = {}
        self._size = 0
        self._turn = 0
        self._recently_served: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return self._size

    def __contains__(self, key: tuple[str, str]) -> bool:
        org = self._orgs.get(key[0])
        return org is not None and key[1] in org.agents

    def add(self, org_id: str, agent_id: str) -> bool:
        """Queues the agent; False when it is not queued (queued already, or the queue is
        full and its org holds the most)."""
        org = self._orgs.get(org_id)
        if org is not None and agent_id in org.agents:
            return False
        if self._size >= self._capacity and not self._make_room_for(org_id):
            return False
        if org is None:
            org = self._orgs[org_id] = _OrgAgents(served=self._recently_served.pop(org_id, -1))
        org.agents[agent_id] = None
        self._size += 1
        return True

    def pop(self) -> tuple[str, str] | None:
        """The first queued agent of the org served longest ago, taken off the queue."""
        if not self._orgs:
            return None
        org_id = min(self._orgs, key=lambda o: self._orgs[o].served)  # ties: queued first
        org = self._orgs[org_id]
        self._turn += 1
        org.served = self._turn
        agent_id, _ = org.agents.popitem(last=False)
        self._size -= 1
        if not org.agents:
            self._forget(org_id)
        return org_id, agent_id

    def clear(self) -> None:
        self._orgs.clear()
        self._recently_served.clear()
        self._size = 0

    def _make_room_for(self, org_id: str) -> bool:
        """Drops the newest entry of the org holding the most, if ``org_id`` holds fewer."""
        largest = max(self._orgs, key=lambda o: len(self._orgs[o].agents))
        held = len(self._orgs[org_id].agents) if org_id in self._orgs else 0
        if held + 1 >= len(self._orgs[largest].agents):
            return False
        self._orgs[largest].agents.popitem(last=True)
        self._size -= 1
        return True

    def _forget(self, org_id: str) -> None:
        org = self._orgs.pop(org_id)
        self._recently_served[org_id] = org.served
        if len(self._recently_served) > _RECENTLY_SERVED:
            self._recently_served.popitem(last=False)
