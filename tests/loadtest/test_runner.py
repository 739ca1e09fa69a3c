"""The load-test runner's command line and the machine figures it reports."""

from __future__ import annotations

import os

from loadtest.machine import stolen_seconds
from loadtest.options import SCENARIOS, parse_args


def test_the_stores_share_the_load_generators_cpus_unless_told_otherwise() -> None:
    assert parse_args(["--scenario", "baseline"]).stores_cpus == "1"
    assert parse_args(["--locust-cpus", "0", "--server-cpus", "1"]).stores_cpus == "0"
    assert parse_args(["--stores-cpus", "any"]).stores_cpus is None
    assert parse_args(["--stores-cpus", "0,1"]).stores_cpus == "0,1"


def test_a_scenario_fills_what_the_command_line_leaves_out() -> None:
    args = parse_args(["--scenario", "baseline", "--rps", "50"])
    assert args.rps == 50
    assert (args.agents, args.memories) == (SCENARIOS["baseline"].agents, SCENARIOS["baseline"].memories)
    assert args.label == "baseline"


def test_stolen_cpu_time_is_read_per_cpu() -> None:
    stolen = stolen_seconds()
    assert "0" in stolen and len(stolen) <= (os.cpu_count() or 1)
    assert all(seconds >= 0 for seconds in stolen.values())
