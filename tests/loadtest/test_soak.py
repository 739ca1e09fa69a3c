"""The soak's command line and its CPU accounting."""

from __future__ import annotations

import os
import random
import resource
import statistics
import subprocess
import sys

import grpc
from ibex_context.observability.metrics import Metrics
from prometheus_client import CollectorRegistry, generate_latest

from loadtest import soak
from loadtest.measure import Reading


def test_defaults_are_the_hour_of_issue_26_in_two_minute_windows_on_a_data_set_of_its_own() -> None:
    options, base = soak.parse([])
    assert (options.minutes, options.window_minutes, options.compare_minutes) == (60.0, 2.0, 10.0)
    assert (options.rps, options.writes_per_second, options.tolerance) == (50.0, 10.0, 0.10)
    assert (base.rps, base.duration, base.agents, base.memories) == (50.0, 3600.0, 100, 1000)
    # The embedder users run serves the queries; the hashing toy only when asked for.
    assert options.embedder == base.embedder == "minilm"
    # A soak churns its data: never the directory the other load tests reuse.
    assert base.data_dir.name.startswith("soak-")
    # Its verdict is the comparison, not locust's gate over the whole run.
    assert base.p99_ms >= 1000 and base.max_fallback_rate == 1


def test_the_writer_writes_memories_as_long_as_the_seeded_ones_unless_told_churn() -> None:
    """What the server embeds for a write is what it costs: twelve churn words took a
    tenth of a seeded memory's inference."""
    assert soak.parse([])[0].write_texts == "memories"
    rng = random.Random(7)
    memories = [soak.WRITE_TEXTS["memories"][1](rng) for _ in range(200)]
    churn = [soak.WRITE_TEXTS["churn"][1](rng) for _ in range(200)]
    assert statistics.median(len(m.split()) for m in memories) > 50
    assert {len(c.split()) for c in churn} == {12}
    assert soak.parse(["--write-texts", "churn"])[0].write_texts == "churn"


def test_store_cpu_includes_the_children_already_reaped() -> None:
    """PostgreSQL's autovacuum workers and closed backends exit within a window: a
    count of live children alone would leave their CPU out."""
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = soak.tree_cpu_seconds(os.getpid())
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    after = soak.tree_cpu_seconds(os.getpid())
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (children_after.ru_utime + children_after.ru_stime) - (
        children_before.ru_utime + children_before.ru_stime
    )
    assert child_cpu > 0.05
    # /proc counts in clock ticks (10 ms), getrusage in microseconds.
    assert after - before >= child_cpu - 0.03


def test_a_process_that_is_gone_costs_nothing() -> None:
    assert soak.tree_cpu_seconds(None) == 0.0
    assert soak.tree_cpu_seconds(2**22 + 12345) == 0.0


def reading(scrape: str) -> Reading:
    return Reading([scrape], 0.0, 0.0, 0.0, 0.0, 0.0, {}, 0.0)


def test_the_windows_p99_is_read_from_the_histogram_the_service_exports() -> None:
    """Read from the service's own Metrics, so a renamed metric or label fails here, not as
    an hour-long soak without a p99."""
    metrics = Metrics(CollectorRegistry())
    before = reading(generate_latest(metrics.registry).decode())
    method = "/ibex.context.v1.ContextAssemblyService/AssembleContext"
    for _ in range(99):
        metrics.record_call(method, grpc.StatusCode.OK, 0.004)
    metrics.record_call(method, grpc.StatusCode.OK, 0.040)
    metrics.record_call("/grpc.health.v1.Health/Check", grpc.StatusCode.OK, 0.3)
    after = reading(generate_latest(metrics.registry).decode())

    p50 = soak.assemble_percentile_ms(before, after, 0.5)
    p99 = soak.assemble_percentile_ms(before, after, 0.99)
    assert p50 is not None and 2.5 <= p50 <= 5.0
    assert p99 is not None and p99 <= 5.0  # 99 of the 100 calls took 4 ms; the health check is not counted
    assert soak.assemble_percentile_ms(after, after, 0.99) is None


def test_rank_correlation_says_whether_the_slow_windows_are_those_where_a_figure_is_high() -> None:
    p99 = [20.0, 35.0, 22.0, 40.0, 25.0]
    assert soak.rank_correlation(p99, [1.0, 5.0, 2.0, 9.0, 3.0]) == 1.0
    assert soak.rank_correlation(p99, [9.0, 2.0, 5.0, 1.0, 3.0]) == -1.0
    # Ties share their rank; a constant figure and too few windows say nothing.
    rho = soak.rank_correlation(p99, [0.0, 1.0, 0.0, 1.0, 0.0])
    assert rho is not None and 0.8 < rho < 1.0
    assert soak.rank_correlation(p99, [3.0] * 5) is None
    assert soak.rank_correlation([1.0, 2.0], [1.0, 2.0]) is None
    # A window without a p99 (no call finished) is left out, not counted as zero.
    assert soak.rank_correlation([*p99, float("nan")], [1.0, 5.0, 2.0, 9.0, 3.0, 100.0]) == 1.0


def test_the_windows_report_the_stolen_time_of_the_servers_and_the_stores_cpus() -> None:
    _, base = soak.parse([])
    assert soak.window_cpus(base) == ("0", "1")
    _, base = soak.parse([])
    base.server_cpus, base.stores_cpus = "2-3", "0,1"
    assert soak.window_cpus(base) == ("2", "0")


async def test_the_server_wide_counters_are_read_from_the_running_postgresql(postgres_dsn: str) -> None:
    """Checkpoints, WAL and the autovacuum time are PostgreSQL 18's column names: a rename
    fails here, not after an hour of soak."""
    import asyncio

    tables, server = await asyncio.to_thread(soak.pg_state, postgres_dsn)
    assert set(server) == {"checkpoints", "checkpoint_buffers", "wal_bytes", "wal_fpi"}
    assert server["wal_bytes"] > 0
    for figures in tables.values():
        assert set(figures) == set(soak._PG_STATE_COLUMNS)
