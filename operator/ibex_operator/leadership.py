"""Which replica of the operator works: kopf's peering, made a leader election.

kopf's peering pauses an operator while another live operator of the same peering object has a
higher priority, and pauses all of them while two share the highest. So every replica starts with a
random priority (``random_priority``): the highest live one works, the others wait, and when it dies
its record expires (``lifetime``, 60 s) and the next highest takes over. kopf pauses its own watches;
our drift loop is not kopf's, so it asks ``is_leader`` with the peering object's status.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Mapping
from typing import Any

PEERING_GROUP = "kopf.dev"
PEERING_VERSION = "v1"
PEERING_PLURAL = "kopfpeerings"


def peering_path(namespace: str, name: str) -> str:
    return f"/apis/{PEERING_GROUP}/{PEERING_VERSION}/namespaces/{namespace}/{PEERING_PLURAL}/{name}"


def random_priority(rng: random.Random | None = None) -> int:
    """Distinct among replicas with near certainty (kopf pauses everyone on a tie)."""
    return (rng or random.SystemRandom()).randint(1, 2**31 - 1)


def _alive(info: Mapping[str, Any], now: datetime.datetime) -> bool:
    lastseen = info.get("lastseen")
    if not isinstance(lastseen, str):
        return False
    try:
        seen = datetime.datetime.fromisoformat(lastseen.replace("Z", "+00:00"))
    except ValueError:
        return False
    if seen.tzinfo is None:
        seen = seen.replace(tzinfo=datetime.UTC)
    return seen + datetime.timedelta(seconds=int(info.get("lifetime", 60))) > now


def is_leader(
    peers: Mapping[str, Mapping[str, Any]], identity: str, priority: int, now: datetime.datetime
) -> bool:
    """kopf's rule for the operator ``identity``: it works while no other live peer has a priority
    at least as high (a tie pauses both)."""
    for other, info in peers.items():
        if other == identity or not _alive(info, now):
            continue
        if int(info.get("priority", 0)) >= priority:
            return False
    return True
