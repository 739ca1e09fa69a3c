"""CPU of the caller check a call pays (server/guard.py ``CallGuard.check``): issue 27's
target is <= 0.1 ms of server CPU per call.

What a call of the service pays, in the process, on the real objects: the metadata as
grpc.aio hands it over (a tuple of key/value pairs: the proxy's ``authorization``,
``traceparent`` and ``x-request-id``), the request message parsed from bytes, the
credentials as parsed from a file of ``--principals`` entries; SHA-256 of the token,
the digest lookup, the role and org decision. Three shapes: a token of an unbound
principal (the proxy), of a principal bound to the request's org, and the org given in
upper case (the slow path through ``uuid.UUID``). Also the TLS fetcher's check that
gRPC's core runs on every *handshake* (not every call): a ``stat`` of the files.

    PYTHONPATH=service .venv/bin/python -m benchmarks.auth_cpu --calls 200000
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from ibex_context._proto.ibex.context.v1 import context_pb2 as pb
from ibex_context.server.auth import Role, parse_credentials, token_digest
from ibex_context.server.guard import CallGuard
from ibex_context.server.tls import ServerTls, TlsFiles

PATH = "/ibex.context.v1.ContextAssemblyService/AssembleContext"


class _Context:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> Sequence[tuple[str, str | bytes]]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return 0.045

    def set_code(self, code: Any) -> None: ...
    def set_details(self, details: str) -> None: ...
    def peer_identities(self) -> Sequence[bytes] | None:
        return None


def _metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (
        ("user-agent", "grpc-python-asyncio/1.76.0 grpc-c/51.0.0 (linux; chttp2)"),
        ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ("x-request-id", "req-0123456789"),
        ("authorization", f"Bearer {token}"),
    )


def _per_call_us(run: Callable[[], object], calls: int, rounds: int) -> list[float]:
    results = []
    for _ in range(rounds):
        start = time.process_time_ns()
        for _ in range(calls):
            run()
        results.append((time.process_time_ns() - start) / calls / 1000)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--principals", type=int, default=1000)
    args = parser.parse_args()

    org = str(uuid.uuid4())
    tokens = [f"tok-{uuid.uuid4().hex}{uuid.uuid4().hex}" for _ in range(args.principals)]
    entries: list[dict[str, Any]] = [
        {"name": f"p{i}", "roles": ["assemble"], "token_sha256": [token_digest(t).hex()]}
        for i, t in enumerate(tokens)
    ]
    entries[1]["org_id"] = org
    credentials = parse_credentials(yaml.safe_dump({"principals": entries}))
    guard = CallGuard(lambda: credentials)
    request = pb.AssembleContextRequest.FromString(
        pb.AssembleContextRequest(org_id=org, agent_id=str(uuid.uuid4()), model="gpt-4o").SerializeToString()
    )
    upper = pb.AssembleContextRequest(org_id=org.upper(), agent_id=request.agent_id, model="gpt-4o")
    unbound, bound = _Context(_metadata(tokens[0])), _Context(_metadata(tokens[1]))
    assert guard.check(PATH, request, unbound).roles == {Role.ASSEMBLE}
    shapes = {
        "token, unbound principal (the proxy)": lambda: guard.check(PATH, request, unbound),
        "token, principal bound to the request's org": lambda: guard.check(PATH, request, bound),
        "token, bound, org id in upper case (uuid parse)": lambda: guard.check(PATH, upper, bound),
    }
    with tempfile.TemporaryDirectory() as directory:
        cert, key = _self_signed(Path(directory))
        tls = ServerTls(TlsFiles(cert, key))
        shapes["TLS fetcher on a handshake (files unchanged)"] = tls._fetch

        print(
            f"# auth CPU per call ({args.calls} calls x {args.rounds} rounds, {args.principals} principals)"
        )
        print(
            f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.1f} (shared machine)\n"
        )
        print("| shape | median us | min us | max us |")
        print("|---|---:|---:|---:|")
        for name, run in shapes.items():
            values = _per_call_us(run, args.calls, args.rounds)
            print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")


def _self_signed(directory: Path) -> tuple[Path, Path]:
    from ibex_context.devtools.certs import Authority

    issued = Authority.create("bench CA").server()
    return issued.write(directory, "server")


if __name__ == "__main__":
    main()
