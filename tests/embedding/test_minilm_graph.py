"""The ONNX graph is built from the packaged weights once, under a versioned name."""

from __future__ import annotations

from pathlib import Path

import onnx
from ibex_context.embedding.minilm_graph import ensure_graph, graph_file_name
from ibex_context.embedding.minilm_reference import default_model_dir


def test_the_int8_graph_is_built_from_the_weights_alone_and_smaller(tmp_path: Path) -> None:
    int8 = ensure_graph(default_model_dir(), tmp_path, "int8")
    assert int8.name == graph_file_name("int8")
    assert [p.name for p in tmp_path.iterdir()] == [int8.name]
    fp32 = ensure_graph(default_model_dir(), tmp_path)
    assert int8.stat().st_size < 0.7 * fp32.stat().st_size


def test_the_int8_graph_scales_each_tokens_activations_on_their_own(tmp_path: Path) -> None:
    # A per-tensor scale (onnxruntime's DynamicQuantizeLinear) spans the whole batch.
    model = onnx.load(str(ensure_graph(default_model_dir(), tmp_path, "int8")))
    operators = [n.op_type for n in model.graph.node]
    assert "DynamicQuantizeLinear" not in operators
    # 6 layers x (query/key/value, attention output, feed-forward in, feed-forward out).
    assert operators.count("MatMulIntegerToFloat") == 36 and operators.count("ReduceMax") == 24


def test_a_graph_already_there_is_used_not_rebuilt(tmp_path: Path) -> None:
    existing = tmp_path / graph_file_name()
    existing.write_bytes(b"already built")
    assert ensure_graph(default_model_dir(), tmp_path) == existing
    assert existing.read_bytes() == b"already built"
    assert [p.name for p in tmp_path.iterdir()] == [existing.name]
