"""OpenAIEmbedder against a real HTTP server on a local socket speaking the OpenAI shape."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import numpy as np
import pytest
from ibex_context.embedding.openai import OpenAIEmbedder
from ibex_context.errors import EmbeddingError
from ibex_context.settings import Settings


@dataclass
class FakeOpenAI:
    """What the server answers next, and what it was asked."""

    status: int = 200
    dim: int = 8
    body: bytes | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def openai_server() -> Iterator[FakeOpenAI]:
    state = FakeOpenAI()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(payload)
            state.headers.append({"path": self.path, "authorization": self.headers.get("Authorization", "")})
            if state.body is not None:
                body = state.body
            else:
                data = [
                    # Out of order on purpose; not normalised (norm 2) on purpose.
                    {
                        "object": "embedding",
                        "index": i,
                        "embedding": [2.0 if j == i % state.dim else 0.0 for j in range(state.dim)],
                    }
                    for i in reversed(range(len(payload["input"])))
                ]
                body = json.dumps({"object": "list", "data": data, "model": payload["model"]}).encode()
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


def embedder_for(server: FakeOpenAI, dim: int = 8, model: str = "text-embedding-3-small") -> OpenAIEmbedder:
    settings = Settings(
        embedder="openai",
        embedding_dim=dim,
        openai_base_url=server.url,
        openai_api_key="sk-test",
        openai_embedding_model=model,
    )
    return OpenAIEmbedder.from_settings(settings)


async def test_vectors_come_back_in_input_order_and_normalised(openai_server: FakeOpenAI) -> None:
    embedder = embedder_for(openai_server)
    try:
        vectors = await embedder.embed(["a", "b", "c"])
    finally:
        await embedder.aclose()
    assert [int(np.argmax(v)) for v in vectors] == [0, 1, 2]
    assert all(float(np.linalg.norm(v)) == pytest.approx(1.0) for v in vectors)
    assert openai_server.requests == [
        {"model": "text-embedding-3-small", "input": ["a", "b", "c"], "dimensions": 8}
    ]
    assert openai_server.headers[0] == {"path": "/v1/embeddings", "authorization": "Bearer sk-test"}


async def test_other_models_are_not_sent_a_dimensions_field(openai_server: FakeOpenAI) -> None:
    embedder = embedder_for(openai_server, model="nomic-embed-text")
    try:
        await embedder.embed(["a"])
    finally:
        await embedder.aclose()
    assert "dimensions" not in openai_server.requests[0]
    assert embedder.name == "openai:nomic-embed-text"


async def test_a_wrong_dimension_is_an_embedding_error_naming_the_setting(openai_server: FakeOpenAI) -> None:
    openai_server.dim = 4
    embedder = embedder_for(openai_server, dim=8)
    try:
        with pytest.raises(EmbeddingError, match="embedding_dim"):
            await embedder.embed(["a"])
    finally:
        await embedder.aclose()


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (500, b'{"error": "boom"}', "HTTP 500"),
        (401, b'{"error": "bad key"}', "HTTP 401"),
        (200, b"not json", "malformed"),
        (200, b'{"data": [{"index": 0}]}', "malformed"),
        (200, b'{"data": []}', "0 vectors for 1 texts"),
        (200, b'{"data": [{"index": 0, "embedding": [0, 0, 0, 0, 0, 0, 0, 0]}]}', "zero"),
    ],
)
async def test_server_failures_are_embedding_errors(
    openai_server: FakeOpenAI, status: int, body: bytes, message: str
) -> None:
    openai_server.status, openai_server.body = status, body
    embedder = embedder_for(openai_server)
    try:
        with pytest.raises(EmbeddingError, match=message):
            await embedder.embed(["secret text"])
    finally:
        await embedder.aclose()


async def test_an_unreachable_endpoint_is_an_embedding_error() -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1/", timeout=1.0)
    embedder = OpenAIEmbedder(client, model="m", dim=8)
    try:
        with pytest.raises(EmbeddingError, match="unreachable"):
            await embedder.embed(["a"])
    finally:
        await embedder.aclose()
