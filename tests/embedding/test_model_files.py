"""One command builds every file the MiniLM embedder serves from (the image's build step)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from ibex_context.embedding.minilm_graph import (
    GRAPH_VERSION,
    OPSET,
    PRECISIONS,
    graph_file_name,
    open_session,
)
from ibex_context.embedding.model_files import main
from ibex_context.embedding.static_table import table_file_name


# A bound, not a speed: the export, the quantisation and the 30,522 pieces of the table take
# ~30 s alone and passed 120 s while a 1M-memory graph build shared the cores.
@pytest.mark.timeout(480)
def test_every_precisions_graph_and_the_static_table_are_built_into_the_directory_and_run(
    tmp_path: Path,
) -> None:
    main([str(tmp_path)])
    built = sorted(p.name for p in tmp_path.iterdir())
    assert built == sorted([*(graph_file_name(precision) for precision in PRECISIONS), table_file_name()])
    # Readable by every user, as the graphs (below).
    assert (tmp_path / table_file_name()).stat().st_mode & 0o777 == 0o644
    assert graph_file_name("fp32").endswith(f"-g{GRAPH_VERSION}.onnx")
    assert graph_file_name("int8").endswith(f"-g{GRAPH_VERSION}-int8.onnx")
    for precision in PRECISIONS:
        path = tmp_path / graph_file_name(precision)
        # Readable by every user: the image builds it as root and serves it as uid 10001.
        assert path.stat().st_mode & 0o777 == 0o644
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
        assert [o.version for o in model.opset_import if o.domain == ""] == [OPSET]
        assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
        ids = np.array([[101, 7592, 102, 0]], dtype=np.int64)
        [vectors] = open_session(path).run(
            ["embeddings"], {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)}
        )
        assert vectors.shape == (1, 384)
        operators = {n.op_type for n in model.graph.node}
        # int8: the matrix products' weights are int8 (one scale per output channel).
        assert ("MatMulIntegerToFloat" in operators) == (precision == "int8"), precision
