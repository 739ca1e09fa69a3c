"""``benchmarks.compose`` measures the compose step and (``--identity``) proves a change
left its output unchanged; either is worth something only while it drives the real
assembler to an injection. Its stand-in retriever once lacked a method the assembler
had gained: every call fell back to PASS_THROUGH, the timings failed and the digest was
one of 4,608 fallbacks."""

from __future__ import annotations

import pytest

from benchmarks import compose


def test_the_benchmark_composes_injections_through_the_real_assembler(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Each timed call asserts that it injected memories (an assembly error would not).
    assert compose.main(["--calls", "3", "--workloads", "1", "--caches", "next turn"]) == 0

    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| next turn"))
    injected = int(row.rstrip(" |").rsplit("|", 1)[1])
    assert injected > 0
