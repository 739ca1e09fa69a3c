"""Embeddings from an OpenAI-compatible ``POST {base_url}/embeddings`` endpoint.

Works with OpenAI and with the many servers speaking its API (vLLM, TEI, Ollama,
LiteLLM). Every failure — transport, HTTP status, malformed body, wrong
dimension — is an ``EmbeddingError`` whose message names the problem, never the
texts. Vectors are L2-normalised here: not every server normalises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from ibex_context.errors import EmbeddingError
from ibex_context.models import FloatVector
from ibex_context.settings import Settings


class OpenAIEmbedder:
    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        model: str,
        dim: int,
        request_dimensions: bool = False,
    ) -> None:
        """``client`` carries the base URL, the bearer key and the timeout.

        ``request_dimensions`` sends ``dimensions=dim`` (text-embedding-3 models can
        shorten their vectors; other servers may reject the field).
        """
        self._client = client
        self._model = model
        self._dim = dim
        self._request_dimensions = request_dimensions

    @classmethod
    def from_settings(cls, settings: Settings) -> OpenAIEmbedder:
        headers = {"Authorization": f"Bearer {settings.openai_api_key}"} if settings.openai_api_key else {}
        client = httpx.AsyncClient(
            base_url=settings.openai_base_url.rstrip("/") + "/",
            headers=headers,
            timeout=settings.openai_timeout_seconds,
        )
        model = settings.openai_embedding_model
        return cls(
            client,
            model=model,
            dim=settings.embedding_dim,
            request_dimensions=model.startswith("text-embedding-3"),
        )

    @property
    def name(self) -> str:
        return f"openai:{self._model}"

    @property
    def dim(self) -> int:
        return self._dim

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        if not texts:
            return []
        body: dict[str, Any] = {"model": self._model, "input": list(texts)}
        if self._request_dimensions:
            body["dimensions"] = self._dim
        try:
            response = await self._client.post("embeddings", json=body)
        except httpx.HTTPError as exc:
            raise EmbeddingError(f"embeddings endpoint unreachable: {type(exc).__name__}") from exc
        if response.status_code != 200:
            raise EmbeddingError(f"embeddings endpoint answered HTTP {response.status_code}")
        try:
            items = sorted(response.json()["data"], key=lambda item: item["index"])
            vectors = [np.asarray(item["embedding"], dtype=np.float32) for item in items]
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbeddingError(
                f"embeddings endpoint answered a malformed body: {type(exc).__name__}"
            ) from exc
        if len(vectors) != len(texts):
            raise EmbeddingError(
                f"embeddings endpoint returned {len(vectors)} vectors for {len(texts)} texts"
            )
        result: list[FloatVector] = []
        for vector in vectors:
            if vector.shape != (self._dim,):
                raise EmbeddingError(
                    f"embedding_dim: the endpoint returned {vector.shape[-1] if vector.ndim else 0} "
                    f"dimensions, configured {self._dim}"
                )
            norm = float(np.linalg.norm(vector))
            if not np.isfinite(norm) or norm == 0.0:
                raise EmbeddingError("embeddings endpoint returned a zero or non-finite vector")
            result.append(vector / np.float32(norm))
        return result

    async def aclose(self) -> None:
        await self._client.aclose()
