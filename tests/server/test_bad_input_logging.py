"""What a refused request leaves in the logs: its field name and nothing raw. A
model string with a bidi control (U+202E) or a line break could otherwise reverse
or forge the access log line an operator reads."""

from __future__ import annotations

import logging

import grpc
import pytest
from ibex_context.server.validation import INVALID_VALUE
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

from tests.conftest import Tenant

from .conftest import user

HOSTILE_MODEL = "gpt-4o\u202e\nrpc grpc_code=OK outcome=full"


async def test_an_invalid_model_is_refused_and_never_written_raw_to_the_access_log(
    assembly: context_pb2_grpc.ContextAssemblyServiceStub, tenant: Tenant, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ibex_context.access")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await assembly.AssembleContext(
            pb.AssembleContextRequest(
                org_id=tenant.org_id,
                agent_id=tenant.agent_id,
                model=HOSTILE_MODEL,
                request_id="\u202eevil",
                messages=[user("hi")],
            ),
            timeout=10,
        )
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.value.details() or "").startswith("model: ")

    (record,) = [r for r in caplog.records if getattr(r, "invalid_field", None) == "model"]
    assert record.model == INVALID_VALUE
    for record in caplog.records:
        rendered = record.getMessage() + repr(vars(record))
        assert "\u202e" not in rendered and "outcome=full" not in rendered
