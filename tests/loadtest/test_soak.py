"""The soak's command line and its CPU accounting."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

from loadtest import soak


def test_defaults_are_the_hour_of_issue_26_in_two_minute_windows_on_a_data_set_of_its_own() -> None:
    options, base = soak.parse([])
    assert (options.minutes, options.window_minutes, options.compare_minutes) == (60.0, 2.0, 10.0)
    assert (options.rps, options.writes_per_second, options.tolerance) == (50.0, 10.0, 0.10)
    assert (base.rps, base.duration, base.agents, base.memories) == (50.0, 3600.0, 100, 1000)
    # A soak churns its data: never the directory the other load tests reuse.
    assert base.data_dir.name.startswith("soak-")
    # Its verdict is the comparison, not locust's gate over the whole run.
    assert base.p99_ms >= 1000 and base.max_fallback_rate == 1


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
