"""How long a thread may hold the GIL while another waits for it.

The event loop and the embedding worker threads (``embedding.batching``) share one
interpreter. onnxruntime releases the GIL while it computes, but an inference takes it
back several times (tokenising, building the input arrays, handing the vectors and the
result to the loop), and each time the loop is running Python the worker waits until the
loop gives the GIL up: at CPython's default switch interval, up to 5 ms a hand-off. Under
load that wait was most of the embedding stage: 20 RPS with MiniLM on one core, embed
stage mean 23-25 ms for queries of ~13 ms of CPU and 16-47 % of calls degraded; with a
0.5 ms interval, 16.7 ms and 0.9 %, at the same server CPU a call
(benchmarks/results/session-12-2026-11-28.md, section 6).
"""

from __future__ import annotations

import sys

__all__ = ["set_switch_interval"]


def set_switch_interval(milliseconds: float) -> None:
    """The process's GIL switch interval (``sys.setswitchinterval``); 0 keeps CPython's."""
    if milliseconds > 0:
        sys.setswitchinterval(milliseconds / 1000)
