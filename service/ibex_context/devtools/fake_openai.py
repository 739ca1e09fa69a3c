"""A stand-in OpenAI-compatible model on loopback: it records every chat completion request it
receives and answers with a fixed reply, so a test or a benchmark can check what a proxy sent the
model, and time the proxy without a model's own latency."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["REPLY", "FakeOpenAI", "fake_openai"]

REPLY = "fake model reply"


@dataclass
class FakeOpenAI:
    port: int
    # Every chat completion body received, in order.
    received: list[dict[str, Any]] = field(default_factory=list)
    # Keep only the last this many (a benchmark sends thousands).
    keep: int = 1000

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.received.append(body)
        del self.received[: -self.keep]
        return web.json_response(
            {
                "id": f"chatcmpl-{len(self.received)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", ""),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": REPLY},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    @staticmethod
    async def _models(_request: web.Request) -> web.Response:
        return web.Response(text=json.dumps({"object": "list", "data": []}), content_type="application/json")


@asynccontextmanager
async def fake_openai(keep: int = 1000) -> AsyncIterator[FakeOpenAI]:
    """The fake model on a free loopback port, for the ``async with`` block."""
    fake = FakeOpenAI(port=0, keep=keep)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake._chat)
    app.router.add_post("/chat/completions", fake._chat)
    app.router.add_get("/v1/models", fake._models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.port = int(runner.addresses[0][1])
    try:
        yield fake
    finally:
        await runner.cleanup()
