"""Page tokens: a keyset position bound to the query that produced it."""

from __future__ import annotations

import base64
import json

import pytest
from ibex_context.errors import InvalidRequest
from ibex_context.memory_api import page_tokens


def test_a_token_round_trips_and_is_bound_to_its_query() -> None:
    mine = page_tokens.query_digest(["org", "agent", "CREATED_DESC"])
    theirs = page_tokens.query_digest(["other-org", "agent", "CREATED_DESC"])
    token = page_tokens.encode(mine, ["1700000000000000", "id-1"])

    assert page_tokens.decode(token, mine, 2) == ["1700000000000000", "id-1"]
    with pytest.raises(InvalidRequest) as caught:
        page_tokens.decode(token, theirs, 2)
    assert caught.value.field == "page_token"
    for garbage in ("", "!!!", "eyJ4IjoxfQ", page_tokens.encode(mine, ["only-one"])):
        with pytest.raises(InvalidRequest):
            page_tokens.decode(garbage, mine, 2)


def test_the_digest_tells_apart_queries_that_differ_in_any_part() -> None:
    base = ["org", "agent", "CREATED_DESC", ["factual"], None]
    variants = [
        ["org", "agent", "CREATED_ASC", ["factual"], None],
        ["org", "agent", "CREATED_DESC", ["preference"], None],
        ["org", "agent", "CREATED_DESC", ["factual"], "2026-01-01"],
        ["org", "agent-2", "CREATED_DESC", ["factual"], None],
    ]
    digests = {page_tokens.query_digest(base)} | {page_tokens.query_digest(v) for v in variants}
    assert len(digests) == 1 + len(variants)
    assert page_tokens.query_digest(base) == page_tokens.query_digest(list(base))


def test_a_token_is_url_safe_without_padding() -> None:
    digest = page_tokens.query_digest(["export", "org", ""])
    token = page_tokens.encode(digest, ["a" * 37, "b" * 41])
    assert "=" not in token and "+" not in token and "/" not in token
    assert page_tokens.decode(token, digest, 2) == ["a" * 37, "b" * 41]


def test_a_position_of_the_wrong_length_or_kind_is_refused_under_the_right_digest() -> None:
    digest = page_tokens.query_digest(["q"])
    numbers = base64.urlsafe_b64encode(json.dumps({"q": digest, "p": [1, 2]}).encode()).decode()
    for token in (page_tokens.encode(digest, ["1", "2", "3"]), numbers):
        with pytest.raises(InvalidRequest) as caught:
            page_tokens.decode(token, digest, 2)
        assert "not a token this service issued" in str(caught.value)
