"""The serialization benchmark generates its own betterproto2 code (the ``benchmark`` extra)."""

from __future__ import annotations

import random
from pathlib import Path

from benchmarks.serialization import (
    BetterprotoCodec,
    UpbCodec,
    generate_betterproto_messages,
    make_request_values,
    make_response_values,
)


def test_the_generated_dataclasses_and_upb_read_each_others_bytes(tmp_path: Path) -> None:
    betterproto = BetterprotoCodec(generate_betterproto_messages(tmp_path))
    upb = UpbCodec()
    rng = random.Random(7)
    messages = make_request_values(rng)
    assert betterproto.decode_request(upb.encode_request(messages)) == tuple(messages)
    assert upb.decode_request(betterproto.encode_request(messages)) == tuple(messages)
    response = make_response_values(rng, messages, 3)
    assert upb.decode_response(betterproto.encode_response(response)) == upb.decode_response(
        upb.encode_response(response)
    )
