"""What one org may store: its memories and bytes of content, checked on every upsert.

``org_usage`` (migration 0016) holds each org's counts, kept by statement triggers in
the writing transaction; the upsert reads its org's row after its own statements (the
triggers' update holds the row until commit, so concurrent writers of the org are
checked one after another, each against what the others committed) and refuses the
batch, rolled back whole, when it added to a measure that is now past its limit. A
batch that adds nothing (updates that keep or shrink the content) always passes, so
an org over a lowered limit can still correct and delete.
"""

from __future__ import annotations

from dataclasses import dataclass

from ibex_context.errors import LimitExceeded


@dataclass(frozen=True, slots=True)
class OrgQuotas:
    """Per-org limits; 0 means none."""

    memories: int = 0
    content_bytes: int = 0


@dataclass(frozen=True, slots=True)
class OrgUsage:
    memories: int
    content_bytes: int


# The settings that name the limits (RESOURCE_EXHAUSTED names them, metrics label them).
MEMORIES_LIMIT = "max_org_memories"
CONTENT_BYTES_LIMIT = "max_org_content_bytes"


def check_org_usage(quotas: OrgQuotas, usage: OrgUsage, *, added_memories: int, added_bytes: int) -> None:
    """Raises ``LimitExceeded`` when the write added to a measure now past its limit."""
    if quotas.memories and added_memories > 0 and usage.memories > quotas.memories:
        raise LimitExceeded(
            MEMORIES_LIMIT,
            f"the org would store {usage.memories} memories; at most {quotas.memories} are allowed",
        )
    if quotas.content_bytes and added_bytes > 0 and usage.content_bytes > quotas.content_bytes:
        raise LimitExceeded(
            CONTENT_BYTES_LIMIT,
            f"the org would store {usage.content_bytes} bytes of content;"
            f" at most {quotas.content_bytes} are allowed",
        )
