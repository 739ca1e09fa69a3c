"""The matrix's steps: which embedder each runs and what its summary says it ran."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from loadtest import matrix, options


class Planned(matrix.Matrix):
    """The matrix with each step's load test left out: what it would run, not the run."""

    def __init__(self, opts: object) -> None:
        super().__init__(opts)  # type: ignore[arg-type]
        self.planned: list[tuple[str, str, list[str]]] = []

    def step(self, label: str, data: str, config: str, argv: list[str], offered: float) -> matrix.Row:
        self.planned.append((label, config, argv))
        return matrix.Row(label, data, config, offered, None, None)


def plan(*names: str, extra: list[str] | None = None) -> Planned:
    """Planned in a root with no data sets, so no shape goes on to its single searches."""
    planned = Planned(matrix.parse_args(["--only", ",".join(names), *(extra or [])]))
    for name in names:
        getattr(planned, {"max": "max_rps"}.get(name, name))()
    return planned


def test_the_service_steps_run_the_hashing_toy_and_the_shapes_minilm_on_vectors_drawn_like_its(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """loadtest/run defaults to the real embedder, so a step measuring the service's own
    work must ask for the toy by name; the data shapes are measured as users run them:
    MiniLM serves the queries, the stored vectors are drawn from the model of its own."""
    monkeypatch.setattr(matrix, "ROOT", tmp_path)
    planned = plan("rates", "profile", "workers", "minilm", "large", "shapes", extra=["--shapes", "baseline"])
    runs = {label: options.parse_args(argv) for label, _, argv in planned.planned}
    shape = runs.pop("shape-100x1k-50rps")
    assert (shape.embedder, shape.seed_embedder, shape.vectors) == ("minilm", "minilm", "shaped")
    assert runs.pop("minilm-200rps").embedder == "minilm"
    assert {args.embedder for args in runs.values()} == {"hashing"}, runs


def test_the_shapes_are_the_issues_six_starting_with_the_other_runs_data_set() -> None:
    assert [data for _, data in matrix.SHAPES] == [
        "100x1k",
        "1000x1k",
        "100x10k",
        "10x100k",
        "1x1M",
        "5x100k+500x1k",
    ]


def test_the_summary_names_the_embedder_each_run_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The config column is derived from the run's arguments, not written beside them."""
    seen: list[str] = []

    def refuse(args: argparse.Namespace) -> tuple[object, Path | None]:
        seen.append(args.embedder)
        raise RuntimeError("not run here")

    monkeypatch.setattr(matrix.runner, "run_and_report", refuse)
    m = matrix.Matrix(matrix.parse_args(["--only", "minilm,large"]))
    m.minilm()
    m.large()
    assert seen == ["minilm", "hashing"]
    assert [row.config.split(",")[0] for row in m.rows] == ["minilm", "hashing"]
    assert "did not run: RuntimeError" in m.render()
