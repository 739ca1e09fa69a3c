"""Parsing where the service is: ``host:port``, ``[v6]:port`` or ``dns:///name:port``."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PORT = 50051


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int = DEFAULT_PORT
    # dns:///name: a channel per resolved address, picked round robin.
    round_robin: bool = False


def parse_target(target: str) -> Target:
    """``ibex-context:50051`` -> one channel; ``dns:///ibex-context-headless:50051`` -> round robin."""
    text = target.strip()
    round_robin = False
    if text.startswith("dns:"):
        round_robin = True
        text = text.removeprefix("dns:").lstrip("/")
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
    return Target(host, port, round_robin)
