"""A LiteLLM proxy hook: each chat completion's messages go through AssembleContext first.

In LiteLLM's config.yaml::

    litellm_settings:
      callbacks: ["ibex_context_client.litellm.hook.proxy_hook"]
    callback_settings:
      ibex_context:
        target: ibex-context:50051   # else IBEX_TARGET
        timeout_ms: 45               # the whole call, connecting included
        org_id: ""                   # defaults for keys whose metadata names none
        agent_id: ""
        trust_headers: false         # true: x-ibex-org-id / x-ibex-agent-id may name them

The bearer token and TLS files come from the proxy's environment (``IBEX_TOKEN``,
``IBEX_TOKEN_FILE``, ``IBEX_TLS_CA``...; docs/security.md). Whose context a request gets is
``request.resolve_tenant``.

The hook never fails or holds up the request beyond its timeout: ``ContextClient`` returns the
request's own messages on any failure (unreachable, slow, refusing), and anything else going
wrong here leaves the request as it came. Requests it cannot assemble without losing something
(tool calls, images, no known org/agent, other endpoints) pass untouched. The answer says what
happened in ``x-ibex-context`` (``request.outcome_headers``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from ibex_context_client.context import ContextClient
from ibex_context_client.credentials import ClientCredentials
from ibex_context_client.litellm.request import (
    CHAT_CALL_TYPES,
    CONFIG_SECTION,
    HookConfig,
    assemblable_messages,
    outcome_headers,
    resolve_tenant,
)
from ibex_context_client.results import AssembleResult

__all__ = ["IbexContextHook", "proxy_hook"]

log = logging.getLogger("ibex_context_client.litellm")

# Outcomes kept for the answer's headers until it is sent; a request that fails before then
# leaves its entry, so the oldest go first beyond this many.
_OUTCOMES_KEPT = 4096


def _configured() -> HookConfig:
    import litellm

    settings = getattr(litellm, "callback_settings", None) or {}
    section = settings.get(CONFIG_SECTION) or {}
    return HookConfig.from_settings(section, os.environ)


class IbexContextHook(CustomLogger):  # type: ignore[misc]  # LiteLLM ships no type information
    """``async_pre_call_hook`` replaces a chat completion's messages with the assembled ones.

    ``config`` None: read from LiteLLM's ``callback_settings`` on the first request (the proxy
    loads its config after importing the callbacks it names)."""

    def __init__(
        self, config: HookConfig | None = None, credentials: ClientCredentials | None = None
    ) -> None:
        super().__init__()
        self._config = config
        self._credentials = credentials
        self._client: ContextClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._invalid = False
        self._outcomes: OrderedDict[str, dict[str, str]] = OrderedDict()

    def _context_client(self) -> ContextClient | None:
        """The client for this loop (grpc.aio channels belong to the loop that made them; the
        proxy serves on one); None when the configuration is unusable (said once, at ERROR)."""
        loop = asyncio.get_running_loop()
        if self._client is not None and self._loop is loop:
            return self._client
        if self._invalid:
            return None
        try:
            if self._config is None:
                self._config = _configured()
            # Not started here: its first call connects, within that call's timeout.
            self._client = ContextClient(
                self._config.target,
                timeout=self._config.timeout_seconds,
                credentials=self._credentials or ClientCredentials.from_env(),
            )
        except (ValueError, OSError) as exc:
            # A setting it cannot use, a token it would send in clear text off loopback, a TLS
            # file it cannot read: the same for every request, so said once.
            self._invalid = True
            log.error("context hook disabled, every request passes unassembled: %s", exc)
            return None
        self._loop = loop
        return self._client

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: str
    ) -> dict[str, Any]:
        result: AssembleResult | None = None
        try:
            result = await self._assemble(user_api_key_dict, data, call_type)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The request goes out as it came; the exception's type only (its text may quote content).
            log.warning("context hook skipped a request after %s", type(exc).__name__)
        call_id = data.get("litellm_call_id")
        if isinstance(call_id, str) and call_type in CHAT_CALL_TYPES:
            self._outcomes[call_id] = outcome_headers(result)
            while len(self._outcomes) > _OUTCOMES_KEPT:
                self._outcomes.popitem(last=False)
        return data

    async def async_post_call_response_headers_hook(
        self,
        data: dict[str, Any],
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, Any] | None = None,
    ) -> dict[str, str] | None:
        """``x-ibex-context`` (and ``x-ibex-context-ms``) on the answer: what became of its context."""
        call_id = data.get("litellm_call_id")
        return self._outcomes.pop(call_id, None) if isinstance(call_id, str) else None

    async def _assemble(self, key: Any, data: dict[str, Any], call_type: str) -> AssembleResult | None:
        """The call's result once the messages are replaced (or left, on a fallback); None when
        no call was made."""
        if call_type not in CHAT_CALL_TYPES:
            return None
        messages = assemblable_messages(data.get("messages"))
        if messages is None:
            return None
        client = self._context_client()
        if client is None or self._config is None:
            return None
        request = data.get("proxy_server_request")
        tenant = resolve_tenant(
            self._config,
            key_metadata=getattr(key, "metadata", None),
            team_metadata=getattr(key, "team_metadata", None),
            headers=request.get("headers") if isinstance(request, dict) else None,
        )
        if tenant is None:
            return None
        call_id = data.get("litellm_call_id")
        result = await client.assemble(
            org_id=tenant.org_id,
            agent_id=tenant.agent_id,
            session_id=tenant.session_id,
            model=str(data.get("model") or ""),
            request_id=call_id if isinstance(call_id, str) else "",
            messages=messages,
        )
        if result.from_service:
            data["messages"] = [{"role": m.role, "content": m.content} for m in result.messages]
        return result


# What config.yaml names: one hook (and one channel) per proxy process.
proxy_hook = IbexContextHook()
