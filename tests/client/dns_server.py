"""A tiny authoritative DNS server on a real UDP socket, for the client's resolution tests."""

from __future__ import annotations

import asyncio
import ipaddress
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast

_A, _AAAA = 1, 28


def _question(packet: bytes) -> tuple[str, int, int]:
    """The first question's name, type and where it ends."""
    labels, offset = [], 12
    while packet[offset]:
        length = packet[offset]
        labels.append(packet[offset + 1 : offset + 1 + length].decode())
        offset += 1 + length
    qtype = struct.unpack_from("!H", packet, offset + 1)[0]
    return ".".join(labels).lower(), qtype, offset + 5


class DnsServer(asyncio.DatagramProtocol):
    """Answers A queries for ``names`` with ``addresses``; SERVFAIL while ``failing``."""

    def __init__(self) -> None:
        self.addresses: dict[str, list[str]] = {}
        self.failing = False
        self.queries = 0
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast("asyncio.DatagramTransport", transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self._transport is not None
        self.queries += 1
        name, qtype, end = _question(data)
        (ident,) = struct.unpack_from("!H", data)
        rcode = 2 if self.failing else (0 if name in self.addresses else 3)
        answers = b""
        count = 0
        if rcode == 0 and qtype == _A:
            for address in self.addresses[name]:
                # A pointer to the question's name, type A, class IN, TTL 0, 4 bytes.
                answers += struct.pack("!HHHIH", 0xC00C, _A, 1, 0, 4) + ipaddress.IPv4Address(address).packed
                count += 1
        header = struct.pack("!HHHHHH", ident, 0x8400 | rcode, 1, count, 0, 0)
        self._transport.sendto(header + data[12:end] + answers, addr)


@asynccontextmanager
async def dns_server() -> AsyncIterator[tuple[DnsServer, str]]:
    """The server and its ``host:port``."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(DnsServer, local_addr=("127.0.0.1", 0))
    try:
        yield protocol, f"127.0.0.1:{transport.get_extra_info('sockname')[1]}"
    finally:
        transport.close()
