"""A real LiteLLM proxy process for the tests and the hook's benchmark.

LiteLLM runs from its own virtualenv (``.venv-litellm``, made from requirements-litellm.lock by
scripts/bootstrap.sh ``ensure_litellm_venv``; ``IBEX_LITELLM_VENV`` names another): its pins are
not the project's. The hook comes from the client distribution alone (``ibex_context_client``, whose
source tree is the proxy's ``PYTHONPATH``, as a proxy image installs ``ibex-context-client``): nothing
of the server is importable there. The config is written as JSON, which is YAML.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ibex_context_client

import ibex_context

__all__ = ["CLIENT_ROOT", "HOOK", "LiteLLMProxy", "litellm_proxy", "litellm_venv", "proxy_config"]

SOURCE_ROOT = Path(ibex_context.__file__).resolve().parents[1]
REPO_ROOT = SOURCE_ROOT.parent
# clients/python: the client distribution's source, the one thing of ours on the proxy's path.
CLIENT_ROOT = Path(ibex_context_client.__file__).resolve().parents[1]
HOOK = "ibex_context_client.litellm.hook.proxy_hook"
MASTER_KEY = "sk-ibex-test-master-key"


def litellm_venv() -> Path:
    return Path(os.environ.get("IBEX_LITELLM_VENV") or REPO_ROOT / ".venv-litellm")


def proxy_config(
    upstream_base_url: str, *, model: str = "gpt-4o", hook: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One model (``model``) served by ``upstream_base_url``; with the hook when ``hook`` (its
    ``callback_settings.ibex_context``) is given."""
    config: dict[str, Any] = {
        "model_list": [
            {
                "model_name": model,
                "litellm_params": {
                    "model": f"openai/{model}",
                    "api_base": upstream_base_url,
                    "api_key": "sk-fake-upstream",
                },
            }
        ],
        "general_settings": {"master_key": MASTER_KEY},
        "litellm_settings": {"drop_params": True},
    }
    if hook is not None:
        config["litellm_settings"]["callbacks"] = [HOOK]
        config["callback_settings"] = {"ibex_context": dict(hook)}
    return config


@dataclass
class LiteLLMProxy:
    port: int
    process: asyncio.subprocess.Process
    log_file: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {MASTER_KEY}"}

    def log_tail(self, characters: int = 4000) -> str:
        return self.log_file.read_text(errors="replace")[-characters:]


def _write_config(directory: Path, config: Mapping[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config_file = directory / "litellm-config.yaml"
    config_file.write_text(json.dumps(config, indent=2))
    return config_file


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def litellm_proxy(
    config: Mapping[str, Any],
    directory: Path,
    *,
    env: Mapping[str, str] | None = None,
    start_timeout: float = 240.0,
) -> AsyncIterator[LiteLLMProxy]:
    """The proxy serving ``config`` until the block ends; ready once /health/liveliness answers.

    ``env``: added to a minimal environment (the hook's ``IBEX_TOKEN``...). Raises RuntimeError
    with the proxy's log when it exits or is not ready within ``start_timeout`` seconds."""
    executable = litellm_venv() / "bin" / "litellm"
    if not executable.exists():
        raise RuntimeError(
            f"{executable} is missing: run `source scripts/bootstrap.sh && ensure_litellm_venv` "
            "(or set IBEX_LITELLM_VENV)"
        )
    config_file = _write_config(directory, config)
    log_file = directory / "litellm.log"
    port = _free_port()
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(directory),
        "PYTHONPATH": str(CLIENT_ROOT),
        # The model prices bundled with the release, not fetched from GitHub at start-up.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "GRPC_ENABLE_FORK_SUPPORT": "false",
        **(env or {}),
    }
    with log_file.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            str(executable),
            "--config",
            str(config_file),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=environment,
            cwd=directory,
        )
    proxy = LiteLLMProxy(port, process, log_file)
    try:
        await _wait_ready(proxy, start_timeout)
        yield proxy
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 15.0)
            except TimeoutError:
                process.kill()
                await process.wait()


async def _wait_ready(proxy: LiteLLMProxy, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if proxy.process.returncode is not None:
                code = proxy.process.returncode
                raise RuntimeError(f"the LiteLLM proxy exited ({code}):\n{proxy.log_tail()}")
            try:
                reply = await http.get(f"{proxy.base_url}/health/liveliness")
                if reply.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the LiteLLM proxy was not ready within {timeout:.0f} s:\n{proxy.log_tail()}")
