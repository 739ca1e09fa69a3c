"""Opaque page tokens: a keyset position bound to the query that produced it.

A token carries the last row's sort key and id plus a digest of the query's
identity (tenant, filters, order). Reads are always scoped by the request's own
tenant, so a foreign token could never reveal another tenant's rows; the digest
makes such a token (or one reused with other filters) an INVALID_ARGUMENT that
names ``page_token`` instead of a silently shifted page.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence

from ibex_context.errors import InvalidRequest

FIELD = "page_token"


def query_digest(parts: Sequence[object]) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:24]


def encode(digest: str, position: Sequence[str]) -> str:
    payload = json.dumps({"q": digest, "p": list(position)}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


def decode(token: str, digest: str, size: int) -> list[str]:
    """The position in ``token``; InvalidRequest when it is malformed or belongs to another query."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        payload = json.loads(raw)
        position = payload["p"]
        owner = payload["q"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise InvalidRequest(FIELD, "is not a token this service issued") from None
    if owner != digest:
        raise InvalidRequest(FIELD, "belongs to another query (tenant, filters or order differ)")
    if (
        not isinstance(position, list)
        or len(position) != size
        or not all(isinstance(p, str) for p in position)
    ):
        raise InvalidRequest(FIELD, "is not a token this service issued")
    return position
