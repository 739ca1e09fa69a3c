"""The load-test smoke run, end to end: real stores, the real service, locust over gRPC.

``loadtest/run --scenario smoke`` seeds 5 agents x 200 memories, offers 40 RPS for 30 s
and gates on p99 < 50 ms and fallback and failure rates < 0.1 % through its exit code.
This test checks that the whole chain works and reports its figures; whether the gate
passes is a measurement of the machine it runs on, recorded in the results file (and in
``benchmarks/results/loadtest/``), not an assertion of a unit test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class SmokeRun:
    returncode: int
    output: str
    report: str
    summary: dict[str, Any]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> SmokeRun:
    base = tmp_path_factory.mktemp("smoke")
    results, out = base / "results", base / "out"
    proc = subprocess.run(
        # The service runs the real embedder (the default); the stored vectors come from the
        # hashing toy, as MiniLM costs ~0.2 s of CPU per seeded memory here (minutes for 1,000).
        # --secure: TLS and a bearer token, as the chart deploys the service.
        [sys.executable, "-m", "loadtest.runner", "--scenario", "smoke", "--seed-embedder", "hashing",
         "--secure",
         "--results-dir", str(results), "--out-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=220, check=False,
    )  # fmt: skip
    output = proc.stdout[-6000:] + proc.stderr[-3000:]
    reports = list(results.glob("*-smoke.md"))
    summaries = list(out.glob("*-smoke.json"))
    assert reports and summaries, f"the smoke run wrote no results:\n{output}"
    return SmokeRun(proc.returncode, output, reports[0].read_text(), json.loads(summaries[0].read_text()))


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_the_smoke_run_drives_the_real_service_and_reports_its_figures(smoke: SmokeRun) -> None:
    s = smoke.summary
    assert s["requests"] > 500, smoke.output  # 40 RPS x 30 s were offered and answered or timed out
    assert s["responses"] > 0, smoke.output  # the service answered over real gRPC
    assert s["problems_by_kind"] == {}, s["problems_by_kind"]  # every response kept the contract
    assert "| offered RPS | achieved RPS |" in smoke.report
    assert "stage `" in smoke.report  # the service's own stage histograms were scraped
    assert "GC pause, generation `0`" in smoke.report  # and its garbage-collector pauses
    assert "Server CPU:" in smoke.report
