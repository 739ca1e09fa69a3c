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

The turns are ``org_turns.OrgTurns``'s; this adds the capacity. Pure bookkeeping, no
I/O: the store's one builder task takes from it.
"""

from __future__ import annotations

from ibex_context.org_turns import OrgTurns


class GraphBuildQueue:
    """(org_id, agent_id) pairs queued once each, taken one at a time org by org."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._agents: OrgTurns[str] = OrgTurns()

    def __len__(self) -> int:
        return len(self._agents)

    def __contains__(self, key: tuple[str, str]) -> bool:
        return self._agents.has(*key)

    def add(self, org_id: str, agent_id: str) -> bool:
        """Queues the agent; False when it is not queued (queued already, or the queue is
        full and its org holds the most)."""
        if self._agents.has(org_id, agent_id):
            return False
        if len(self._agents) >= self._capacity and not self._make_room_for(org_id):
            return False
        return self._agents.add(org_id, agent_id)

    def pop(self) -> tuple[str, str] | None:
        """The first queued agent of the org served longest ago, taken off the queue."""
        return self._agents.take()

    def clear(self) -> None:
        self._agents.clear()

    def _make_room_for(self, org_id: str) -> bool:
        """Drops the newest entry of the org holding the most, if ``org_id`` holds fewer."""
        largest = self._agents.largest()
        if largest is None or self._agents.holds(org_id) + 1 >= self._agents.holds(largest):
            return False
        self._agents.drop_newest(largest)
        return True
