"""Builds every file the MiniLM embedder serves from into one directory: the graph of
each precision (``embedding.minilm_graph``) and the static query table
(``embedding.static_table``). The Dockerfile's build step::

    python -m ibex_context.embedding.model_files /opt/ibex/onnx

A checkout builds the same files on first use into its cache directory instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ibex_context.embedding.minilm_graph import PRECISIONS, ensure_graph
from ibex_context.embedding.minilm_reference import default_model_dir
from ibex_context.embedding.static_table import ensure_table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("graph_dir", type=Path, help="directory to write the graphs and the table into")
    args = parser.parse_args(argv)
    for precision in PRECISIONS:
        print(ensure_graph(default_model_dir(), args.graph_dir, precision))
    print(ensure_table(default_model_dir(), args.graph_dir))


if __name__ == "__main__":
    main()
