"""A py-spy profile of the server under load, summarised: where its CPU goes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from loadtest.machine import BIN


def _server_pids(pid: int) -> list[int]:
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return [pid]
    # serve --workers: the parent only supervises; profile the first worker.
    return [c.pid for c in children if "python" in (c.name() or "")] or [pid]


def start_profiler(pid: int, prefix: Path, seconds: float, log: Any) -> subprocess.Popen[bytes] | None:
    py_spy = shutil.which("py-spy") or str(BIN / "py-spy")
    if not Path(py_spy).exists():
        log("py-spy is not installed (pip install py-spy): no profile")
        return None
    target = _server_pids(pid)[0]
    cmd = [
        py_spy,
        "record",
        "--pid",
        str(target),
        "--duration",
        str(int(seconds)),
        "--rate",
        "200",
        "--format",
        "raw",
        "--output",
        str(prefix.with_suffix(".pyspy.txt")),
        "--nonblocking",
    ]
    log("profiling: " + " ".join(cmd))
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish_profiler(proc: subprocess.Popen[bytes], prefix: Path, log: Any) -> str:
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.terminate()
    path = prefix.with_suffix(".pyspy.txt")
    if not path.exists():
        return "py-spy produced no output: " + (proc.stderr.read().decode()[-500:] if proc.stderr else "")
    return summarize_collapsed(path.read_text())


def _frame_parts(frame: str) -> tuple[str, str]:
    """``"func (path/file.py:12)"`` -> (``"func"``, ``"path/file.py"``)."""
    name, _, where = frame.strip().rpartition(" (")
    return name, where.rstrip(")").rsplit(":", 1)[0]


def _component(path: str) -> str:
    """What a frame's file belongs to: ``ibex_context/pipeline/packing.py`` or a library's top package."""
    if "ibex_context/" in path:
        return "ibex_context/" + path.split("ibex_context/", 1)[1]
    top = path.split("/", 1)[0]
    return top.removesuffix(".py") or path


def summarize_collapsed(text: str, top: int = 15) -> str:
    """Where the server's CPU goes, from py-spy's collapsed stacks (idle excluded by py-spy).

    Two views: self time by component (our modules one by one, libraries by top-level
    package), and inclusive time of our own functions (time spent in them and below).
    """
    by_component: dict[str, int] = {}
    leaf_frames: dict[str, int] = {}
    ours: dict[str, int] = {}
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        leaf_name, leaf_path = _frame_parts(frames[-1])
        component = _component(leaf_path)
        by_component[component] = by_component.get(component, 0) + count
        key = f"{leaf_name} ({component})"
        leaf_frames[key] = leaf_frames.get(key, 0) + count
        seen: set[str] = set()
        for frame in frames:
            name, path = _frame_parts(frame)
            if "ibex_context/" in path and not path.endswith(("cli.py", "__main__.py")):
                fn = f"{name} ({_component(path)})"
                if fn not in seen:
                    seen.add(fn)
                    ours[fn] = ours.get(fn, 0) + count
    if not total:
        return "no samples"

    def table(counts: dict[str, int], title: str) -> list[str]:
        rows = [f"| {title} | % of samples |", "|---|---:|"]
        for name, c in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
            rows.append(f"| `{name[:150]}` | {100.0 * c / total:.1f} |")
        return rows

    return "\n".join(
        [
            f"{total:,} samples at 200 Hz of the busy server (py-spy excludes idle time).",
            "",
            *table(by_component, "self time by component"),
            "",
            *table(leaf_frames, "self time by function"),
            "",
            *table(ours, "inclusive time of ibex_context functions"),
        ]
    )
