from __future__ import annotations

import pytest
from ibex_context_client.target import Target, parse_target


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ibex-context:50051", Target("ibex-context", 50051)),
        ("ibex-context", Target("ibex-context", 50051)),
        ("10.0.0.7:6000", Target("10.0.0.7", 6000)),
        ("[::1]:6000", Target("::1", 6000)),
        (
            "dns:///ibex-context-headless.ibex.svc:50051",
            Target("ibex-context-headless.ibex.svc", 50051, True),
        ),
        ("dns:ibex-context-headless", Target("ibex-context-headless", 50051, True)),
        (
            "dns://10.96.0.10:53/ibex-context-headless:7000",
            Target("ibex-context-headless", 7000, True, "10.96.0.10:53"),
        ),
    ],
)
def test_targets_parse_to_host_port_and_mode(text: str, expected: Target) -> None:
    assert parse_target(text) == expected


@pytest.mark.parametrize(
    ("text", "grpc_target"),
    [
        ("ibex-context", "ibex-context:50051"),
        ("[::1]:6000", "[::1]:6000"),
        ("dns:///ibex-context-headless:50051", "dns:///ibex-context-headless:50051"),
        ("dns:ibex-context-headless", "dns:///ibex-context-headless:50051"),
        ("dns://127.0.0.1:5353/name:7000", "dns://127.0.0.1:5353/name:7000"),
    ],
)
def test_targets_are_named_to_grpcio_with_their_resolver(text: str, grpc_target: str) -> None:
    assert parse_target(text).grpc_target == grpc_target


@pytest.mark.parametrize("text", ["", "dns:///", "dns://10.0.0.1/", ":50051", "host:http", "host:70000"])
def test_bad_targets_are_refused_with_the_target_in_the_message(text: str) -> None:
    with pytest.raises(ValueError, match="target"):
        parse_target(text)
