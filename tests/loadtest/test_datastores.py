"""The data dir a load run seeds or reuses (``loadtest.datastores.seed_if_needed``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.datastores import DataSetMismatch, seed_if_needed, seed_parameters
from loadtest.options import parse_args

# No server answers here: a seed that starts fails at once.
NOWHERE = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"


def _seeded_with(data_dir: Path, argv: list[str]) -> None:
    """Leaves ``data_dir`` as a finished seed of ``argv``'s parameters leaves it."""
    params = seed_parameters(parse_args(argv))
    (data_dir / "agents.json").write_text(json.dumps({"plan": {}, "agents": []}))
    (data_dir / "seeded.json").write_text(json.dumps({"params": params, "output": "seeded"}))


REAL_100K = ["--scenario", "large-agent", "--vectors", "embedder", "--seed-embedder", "minilm"]


def test_a_data_set_of_other_parameters_is_not_seeded_over(tmp_path: Path) -> None:
    _seeded_with(tmp_path, REAL_100K)
    # The scenario's own vectors (random) differ from the data set's.
    with pytest.raises(DataSetMismatch, match="vectors 'embedder' there, 'random' asked"):
        seed_if_needed(parse_args(["--scenario", "large-agent"]), NOWHERE, tmp_path, print)
    assert json.loads((tmp_path / "seeded.json").read_text())["output"] == "seeded", "left as it was"


def test_a_reseed_of_other_parameters_starts_again_and_an_interrupted_one_is_never_reused(
    tmp_path: Path,
) -> None:
    _seeded_with(tmp_path, REAL_100K)
    with pytest.raises(RuntimeError, match="seeding failed"):
        seed_if_needed(
            parse_args(["--scenario", "large-agent", "--reseed"]), NOWHERE, tmp_path, lambda _: None
        )
    # The marker went before the seed started: the next run seeds again.
    assert not (tmp_path / "seeded.json").exists()
