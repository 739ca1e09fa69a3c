"""Parsing where the service is: ``host:port``, ``[v6]:port``, ``dns:///name:port`` or
``dns://dns-server:53/name:port``."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PORT = 50051


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int = DEFAULT_PORT
    # dns:///name: every resolved address, picked round robin (grpcio's resolver and policy).
    round_robin: bool = False
    # dns://server/name: the DNS server to ask ("" = the system's).
    dns_server: str = ""

    @property
    def grpc_target(self) -> str:
        """The target as grpcio names it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.round_robin:
            return f"dns://{self.dns_server}/{host}:{self.port}"
        return f"{host}:{self.port}"


def parse_target(target: str) -> Target:
    """``ibex-context:50051`` -> one connection; ``dns:///ibex-context-headless:50051`` -> round robin."""
    text = target.strip()
    round_robin = False
    dns_server = ""
    if text.startswith("dns:"):
        round_robin = True
        text = text.removeprefix("dns:")
        if text.startswith("//"):
            dns_server, _, text = text[2:].partition("/")
        text = text.lstrip("/")
    if not text:
        raise ValueError(f"target {target!r}: no host")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"target {target!r}: no host")
    try:
        port = int(port_text) if port_text else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"target {target!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"target {target!r}: port {port} out of range")
    return Target(host, port, round_robin, dns_server)
