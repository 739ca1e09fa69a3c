"""A narrow Kubernetes client for the operator's children, on kopf's own credentials.

kopf logs in through our ``@kopf.on.login`` handler, which calls ``Credentials.login``:
the ``ConnectionInfo`` it returns to kopf is kept and used for this client too, so
the operator has one identity and no second (heavy) Kubernetes client library.
On HTTP 401 (a rotated service-account token) the client logs in again and retries once.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import kopf

from ibex_operator.crd import GROUP, PLURAL, VERSION

LoginFn = Callable[..., kopf.ConnectionInfo | None]
MERGE_PATCH = "application/merge-patch+json"
_SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class KubeApiError(Exception):
    def __init__(self, method: str, path: str, status: int, message: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status} {message}")
        self.status = status


def default_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account when mounted, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    if os.path.exists(_SERVICE_ACCOUNT_TOKEN):
        return kopf.login_with_service_account(**kwargs)
    return kopf.login_with_kubeconfig(**kwargs)


class Credentials:
    """The connection kopf uses, shared with ``KubeClient``."""

    def __init__(self, login: LoginFn = default_login) -> None:
        self._login = login
        self._kwargs: dict[str, Any] = {}
        self.current: kopf.ConnectionInfo | None = None

    def login(self, **kwargs: Any) -> kopf.ConnectionInfo | None:
        self._kwargs = kwargs
        self.current = self._login(**kwargs)
        return self.current

    def relogin(self) -> kopf.ConnectionInfo | None:
        return self.login(**self._kwargs)


def configmaps_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    return f"{base}/{name}" if name else base


def hpas_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers"
    return f"{base}/{name}" if name else base


def profiles_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    return f"{base}/{name}" if name else base


class KubeClient:
    def __init__(self, credentials: Credentials, *, timeout_s: float = 30.0) -> None:
        self._credentials = credentials
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._session_info: kopf.ConnectionInfo | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def _open(self) -> tuple[aiohttp.ClientSession, str]:
        if self._closed:
            raise KubeApiError("OPEN", "-", 503, "client closed (operator stopping)")
        info = self._credentials.current
        if info is None:
            info = self._credentials.relogin()
        if info is None:
            raise KubeApiError("LOGIN", "-", 401, "no Kubernetes credentials")
        async with self._lock:
            if self._session is None or self._session_info is not info:
                if self._session is not None:
                    await self._session.close()
                self._session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=info.as_ssl_context()),
                    headers={**info.as_http_headers(), "User-Agent": "ibex-context-operator"},
                    proxy=info.proxy_url,
                    trust_env=info.trust_env,
                    timeout=self._timeout,
                )
                self._session_info = info
            return self._session, info.server.rstrip("/")

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        retry_auth: bool = True,
    ) -> Any:
        session, server = await self._open()
        headers = {"Content-Type": content_type} if body is not None else {}
        async with session.request(method, server + path, json=body, params=params, headers=headers) as resp:
            if resp.status == 401 and retry_auth:
                self._credentials.relogin()
                return await self._request(
                    method, path, body=body, params=params, content_type=content_type, retry_auth=False
                )
            if resp.status >= 400:
                text = await resp.text()
                raise KubeApiError(method, path, resp.status, text[:300])
            return await resp.json(content_type=None)

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._request("GET", path)
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        result = await self._request("GET", path, params=params)
        items: list[dict[str, Any]] = result.get("items") or []
        return items

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("POST", path, body=body)
        return result

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("PATCH", path, body=patch, content_type=MERGE_PATCH)
        return result

    async def delete(self, path: str) -> None:
        try:
            await self._request("DELETE", path)
        except KubeApiError as exc:
            if exc.status != 404:
                raise

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None
