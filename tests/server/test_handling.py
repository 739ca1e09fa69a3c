"""What every memory method does around its work (``server/handling.py``): counts
itself in flight, maps our exceptions to gRPC statuses under its own name, and
validates the tenant before its work runs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import grpc
import pytest
from ibex_context.errors import InvalidRequest, LimitExceeded, StoreUnavailable
from ibex_context.server.handling import agent_scoped, handled
from ibex_context.server.lifecycle import InflightCalls
from ibex_context.server.rpc import CallError


@dataclass
class Request:
    org_id: str = ""
    agent_id: str = ""
    fails_with: Exception | None = None


class Handler:
    def __init__(self) -> None:
        self._inflight = InflightCalls()
        self.seen_in_flight: list[int] = []
        self.scopes: list[tuple[str, str]] = []
        self.limits_refused: list[str] = []
        self._limit_refused = self.limits_refused.append

    @handled
    async def Ping(self, message: Request) -> str:
        self.seen_in_flight.append(self._inflight.count)
        if message.fails_with is not None:
            raise message.fails_with
        return "pong"

    @agent_scoped
    async def Scoped(self, message: Request, org_id: str, agent_id: str) -> str:
        self.scopes.append((org_id, agent_id))
        if message.fails_with is not None:
            raise message.fails_with
        return "done"


async def test_a_call_counts_in_flight_while_it_runs_and_not_after() -> None:
    handler = Handler()
    assert await handler.Ping(Request(), None) == "pong"  # type: ignore[arg-type]
    assert handler.seen_in_flight == [1]
    assert handler._inflight.count == 0
    with pytest.raises(CallError):
        await handler.Ping(Request(fails_with=ValueError("boom")), None)  # type: ignore[arg-type]
    assert handler._inflight.count == 0


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (
            InvalidRequest("ids[2]", "is not a valid UUID"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "ids[2]: is not a valid UUID",
        ),
        (
            StoreUnavailable("postgres: down"),
            grpc.StatusCode.UNAVAILABLE,
            "store unavailable: StoreUnavailable",
        ),
        (
            LimitExceeded("max_delete_ids", "ids has 1001 ids; at most 1000 per call"),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "max_delete_ids: ids has 1001 ids; at most 1000 per call",
        ),
        (ValueError("internal detail"), grpc.StatusCode.INTERNAL, "Ping failed: ValueError"),
        (CallError(grpc.StatusCode.NOT_FOUND, "as raised"), grpc.StatusCode.NOT_FOUND, "as raised"),
    ],
)
async def test_our_errors_become_statuses_named_after_the_method(
    error: Exception, code: grpc.StatusCode, message: str
) -> None:
    with pytest.raises(CallError) as caught:
        await Handler().Ping(Request(fails_with=error), None)  # type: ignore[arg-type]
    assert (caught.value.code, caught.value.message) == (code, message)
    assert "internal detail" not in caught.value.message


async def test_a_limit_refusal_is_counted_by_the_limit_it_names() -> None:
    handler = Handler()
    with pytest.raises(CallError):
        await handler.Ping(Request(fails_with=LimitExceeded("max_org_memories", "full")), None)  # type: ignore[arg-type]
    with pytest.raises(CallError):
        await handler.Ping(Request(fails_with=InvalidRequest("ids", "is empty")), None)  # type: ignore[arg-type]
    assert handler.limits_refused == ["max_org_memories"]


async def test_the_tenant_is_validated_before_the_work_and_given_to_it_canonical() -> None:
    handler = Handler()
    org, agent = uuid.uuid4(), uuid.uuid4()

    assert await handler.Scoped(Request(str(org).upper(), str(agent)), None) == "done"  # type: ignore[arg-type]
    assert handler.scopes == [(str(org), str(agent))]

    for request, field in ((Request("", str(agent)), "org_id"), (Request(str(org), "agent-7"), "agent_id")):
        with pytest.raises(CallError) as caught:
            await handler.Scoped(request, None)  # type: ignore[arg-type]
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.message.startswith(field)
    assert len(handler.scopes) == 1  # the work never ran for them


async def test_a_scoped_method_keeps_its_name_for_lookup_and_for_its_errors() -> None:
    assert Handler.Scoped.__name__ == "Scoped"
    with pytest.raises(CallError) as caught:
        await Handler().Scoped(Request(str(uuid.uuid4()), str(uuid.uuid4()), KeyError("x")), None)  # type: ignore[arg-type]
    assert caught.value.message == "Scoped failed: KeyError"
