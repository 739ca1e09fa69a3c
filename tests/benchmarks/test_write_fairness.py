"""``benchmarks.write_fairness`` runs the service's MiniLM embedder with one org importing
beside another's small writes, in per-org turns or one first-come queue, and says which."""

from __future__ import annotations

import argparse

from benchmarks import write_fairness


async def test_it_reports_the_small_writes_wait_and_the_import_rate_for_either_queue() -> None:
    for one_queue, queue in ((False, "per org, in turns"), (True, "one queue (first come, first served)")):
        args = argparse.Namespace(importers=1, seconds=0.5, every=0.1, one_queue=one_queue, seed=1)
        figures = await write_fairness.measure(args)
        assert figures["queue"] == queue and figures["importers"] == 1
        assert isinstance(figures["small_writes"], int) and figures["small_writes"] >= 1
        waits = figures["wait_ms"]
        assert isinstance(waits, dict) and 0 < waits["p50"] <= waits["p95"] <= waits["max"]
