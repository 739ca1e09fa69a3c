"""The ONNX graph is built from the packaged weights once, under a versioned name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from ibex_context.embedding.minilm import open_session
from ibex_context.embedding.minilm_graph import GRAPH_VERSION, OPSET, ensure_graph, graph_file_name, main
from ibex_context.embedding.minilm_reference import default_model_dir


def test_the_graph_is_built_into_the_directory_and_runs(tmp_path: Path) -> None:
    main([str(tmp_path)])
    [built] = [p for p in tmp_path.iterdir()]
    assert built.name == graph_file_name() and f"-g{GRAPH_VERSION}.onnx" in built.name
    # Readable by every user: the image builds it as root and serves it as uid 10001.
    assert built.stat().st_mode & 0o777 == 0o644
    model = onnx.load(str(built))
    onnx.checker.check_model(model)
    assert [o.version for o in model.opset_import if o.domain == ""] == [OPSET]
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    ids = np.array([[101, 7592, 102, 0]], dtype=np.int64)
    [vectors] = open_session(built).run(
        ["embeddings"], {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)}
    )
    assert vectors.shape == (1, 384)


def test_a_graph_already_there_is_used_not_rebuilt(tmp_path: Path) -> None:
    existing = tmp_path / graph_file_name()
    existing.write_bytes(b"already built")
    assert ensure_graph(default_model_dir(), tmp_path) == existing
    assert existing.read_bytes() == b"already built"
    assert [p.name for p in tmp_path.iterdir()] == [existing.name]
