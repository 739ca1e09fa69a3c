"""Growth as a picture (issue 40, deliverable 4): what an agent's memories cost as they grow.

Reads a results JSON of measurements taken at several agent sizes (memories per agent:
1k, 10k, 100k, 1M) and writes, beside it, under the same name:

* ``<name>.png``: one figure, memories per agent on a log axis shared by four panels:
  (a) the stores' CPU per call and the cold stage's p95, (b) one agent's search median,
  (c) recall@50 mean and p5 against issue 40's targets (dashed), (d) the bytes a memory
  costs on disk and in memory. A figure that was not measured is absent from its line;
  each kind of vectors has its own marker, so a point measured with other vectors is
  plotted and told apart.
* ``<name>.md``: the title, the setup lines, a table with a row per point (nulls read
  "not measured") and the picture.

    python -m benchmarks.growth benchmarks/results/growth-<date>.json

The JSON::

    {"title": "...", "setup": ["markdown line", ...],
     "points": [{"memories": 1000, "vectors": "MiniLM-shaped (drawn)",
                 "stores_cpu_ms": 4.7, "cold_p95_ms": 9.9, "search_median_ms": 1.8,
                 "recall_mean": 0.99, "recall_p5": 0.96, "bytes_disk": 4100,
                 "bytes_memory": 3000, "source": "stores-2026-12-07.md"}, ...]}

Every figure may be null. The same JSON gives the same PNG bytes (matplotlib's default
style whatever the local matplotlibrc, a fixed size and resolution, no metadata).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import matplotlib.style
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

NOT_MEASURED = "not measured"
# Issue 40, deliverable 2: recall@50 against the exact search, mean and 5th percentile.
RECALL_MEAN_TARGET = 0.95
RECALL_P5_TARGET = 0.90
# The picture's size: fixed, so that the same figures give the same bytes.
FIGURE_INCHES = (11.0, 7.5)
FIGURE_DPI = 100
_VECTOR_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LineStyle = Literal["-", ":", "-."]
_VECTOR_LINES: tuple[LineStyle, ...] = ("-", ":", "-.")


class GrowthFileError(ValueError):
    """The growth JSON is not of the documented shape."""


@dataclass(frozen=True, slots=True)
class Point:
    """The figures measured at one agent size (None: not measured)."""

    memories: int
    vectors: str
    source: str
    stores_cpu_ms: float | None = None
    cold_p95_ms: float | None = None
    search_median_ms: float | None = None
    recall_mean: float | None = None
    recall_p5: float | None = None
    bytes_disk: float | None = None
    bytes_memory: float | None = None


@dataclass(frozen=True, slots=True)
class Growth:
    title: str
    setup: tuple[str, ...]
    points: tuple[Point, ...]


_FIGURES = (
    "stores_cpu_ms",
    "cold_p95_ms",
    "search_median_ms",
    "recall_mean",
    "recall_p5",
    "bytes_disk",
    "bytes_memory",
)


def _figure(raw: Mapping[str, Any], key: str, where: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise GrowthFileError(f"{where}: {key} is {value!r}, not a number or null")
    return float(value)


def _point(raw: Any, where: str) -> Point:
    if not isinstance(raw, Mapping):
        raise GrowthFileError(f"{where}: not an object")
    memories = raw.get("memories")
    if isinstance(memories, bool) or not isinstance(memories, int) or memories <= 0:
        raise GrowthFileError(f"{where}: memories is {memories!r}, not a positive whole number")
    vectors, source = raw.get("vectors"), raw.get("source")
    if not isinstance(vectors, str) or not isinstance(source, str):
        raise GrowthFileError(f"{where}: vectors and source must be text")
    figures = {key: _figure(raw, key, where) for key in _FIGURES}
    return Point(memories=memories, vectors=vectors, source=source, **figures)


def parse(document: Any) -> Growth:
    """The growth figures of a decoded JSON document (GrowthFileError if it is malformed)."""
    if not isinstance(document, Mapping):
        raise GrowthFileError("the document is not an object")
    title, setup, points = document.get("title"), document.get("setup", []), document.get("points")
    if not isinstance(title, str):
        raise GrowthFileError("title must be text")
    if not isinstance(setup, list) or not all(isinstance(line, str) for line in setup):
        raise GrowthFileError("setup must be a list of lines")
    if not isinstance(points, list) or not points:
        raise GrowthFileError("points must be a non-empty list")
    return Growth(
        title=title,
        setup=tuple(setup),
        points=tuple(_point(raw, f"points[{i}]") for i, raw in enumerate(points)),
    )


# --- the table ---------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _number(value: float | None, digits: int) -> str:
    return NOT_MEASURED if value is None else f"{value:,.{digits}f}"


def _pair(first: float | None, second: float | None, digits: int) -> str:
    if first is None and second is None:
        return NOT_MEASURED
    return f"{_number(first, digits)} / {_number(second, digits)}"


TABLE_HEADER = (
    "memories per agent",
    "vectors",
    "stores CPU per call (ms)",
    "cold stage p95 (ms)",
    "search median (ms)",
    "recall@50 mean / p5",
    "bytes per memory on disk / in memory",
    "source",
)


def table_row(point: Point) -> str:
    cells = (
        f"{point.memories:,}",
        _cell(point.vectors),
        _number(point.stores_cpu_ms, 1),
        _number(point.cold_p95_ms, 1),
        _number(point.search_median_ms, 1),
        _pair(point.recall_mean, point.recall_p5, 3),
        _pair(point.bytes_disk, point.bytes_memory, 0),
        _cell(point.source),
    )
    return "| " + " | ".join(cells) + " |"


def table(points: Sequence[Point]) -> str:
    """A Markdown table with a row per point, in the file's order."""
    lines = [
        "| " + " | ".join(TABLE_HEADER) + " |",
        "|" + "|".join("---:" if i in (0, 2, 3, 4) else "---" for i in range(len(TABLE_HEADER))) + "|",
        *(table_row(point) for point in points),
    ]
    return "\n".join(lines)


def report(growth: Growth, picture_name: str) -> str:
    """The Markdown beside the picture: title, setup, the table, the picture."""
    parts = [f"# {growth.title}", ""]
    if growth.setup:
        parts += [*growth.setup, ""]
    parts += [table(growth.points), "", f"![growth]({picture_name})", ""]
    return "\n".join(parts)


# --- the picture -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Series:
    label: str
    value: Callable[[Point], float | None]
    color: str


def _agent_size(memories: float, _position: float | None = None) -> str:
    for scale, suffix in ((1_000_000, "M"), (1_000, "k")):
        if memories >= scale:
            return f"{memories / scale:g}{suffix}"
    return f"{memories:g}"


@dataclass(frozen=True, slots=True)
class _Style:
    """How the points of one kind of vectors are drawn."""

    marker: str
    linestyle: LineStyle


def _styles(points: Sequence[Point]) -> dict[str, _Style]:
    """One marker and line style per kind of vectors, in order of first appearance (the first
    solid; dashes are the targets')."""
    kinds = list(dict.fromkeys(point.vectors for point in points))
    return {
        kind: _Style(_VECTOR_MARKERS[i % len(_VECTOR_MARKERS)], _VECTOR_LINES[i % len(_VECTOR_LINES)])
        for i, kind in enumerate(kinds)
    }


def _plot(
    axes: Axes, points: Sequence[Point], series: Sequence[_Series], styles: Mapping[str, _Style]
) -> bool:
    """Each series as a line per kind of vectors through its measured points (by size);
    False when nothing in the panel was measured."""
    drawn = False
    for one in series:
        labelled = False
        for kind, style in styles.items():
            measured = sorted(
                (p.memories, value)
                for p in points
                if p.vectors == kind and (value := one.value(p)) is not None
            )
            if not measured:
                continue
            drawn = True
            axes.plot(
                [m[0] for m in measured],
                [m[1] for m in measured],
                color=one.color,
                marker=style.marker,
                linestyle=style.linestyle,
                label=None if labelled else one.label,
            )
            labelled = True
    return drawn


def _mark_unmeasured(axes: Axes) -> None:
    axes.text(0.5, 0.5, NOT_MEASURED, transform=axes.transAxes, ha="center", va="center", color="grey")


def figure(growth: Growth) -> Figure:
    """The growth picture (no I/O; render it with ``png``)."""
    points = growth.points
    styles = _styles(points)
    fig = Figure(figsize=FIGURE_INCHES, dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(2, 2, sharex=True, squeeze=False)
    cost, search, recall, size = grid[0][0], grid[0][1], grid[1][0], grid[1][1]

    panels: list[tuple[Axes, str, str, list[_Series]]] = [
        (
            cost,
            "(a) stores CPU and cold stage",
            "ms",
            [
                _Series("stores CPU per call", lambda p: p.stores_cpu_ms, "tab:blue"),
                _Series("cold stage p95", lambda p: p.cold_p95_ms, "tab:orange"),
            ],
        ),
        (search, "(b) one search", "ms", [_Series("median", lambda p: p.search_median_ms, "tab:green")]),
        (
            recall,
            "(c) recall@50 against exact",
            "recall@50",
            [
                _Series("mean", lambda p: p.recall_mean, "tab:purple"),
                _Series("p5", lambda p: p.recall_p5, "tab:red"),
            ],
        ),
        (
            size,
            "(d) bytes per memory",
            "bytes",
            [
                _Series("on disk", lambda p: p.bytes_disk, "tab:brown"),
                _Series("in memory", lambda p: p.bytes_memory, "tab:cyan"),
            ],
        ),
    ]
    for axes, title, unit, series in panels:
        axes.set_title(title, loc="left", fontsize="medium")
        axes.set_ylabel(unit)
        axes.grid(True, which="major", alpha=0.3)
        if not _plot(axes, points, series, styles):
            _mark_unmeasured(axes)
        if axes is recall:
            for target, label, color in (
                (RECALL_MEAN_TARGET, "mean target", "tab:purple"),
                (RECALL_P5_TARGET, "p5 target", "tab:red"),
            ):
                axes.axhline(target, color=color, linestyle="--", linewidth=1, label=f"{label} {target:.2f}")
        else:
            axes.set_ylim(bottom=0)
        if axes.get_legend_handles_labels()[1]:
            axes.legend(fontsize="small", loc="best")

    measured_recall = [v for p in points for v in (p.recall_mean, p.recall_p5) if v is not None]
    recall.set_ylim(min([RECALL_P5_TARGET - 0.05, *(v - 0.02 for v in measured_recall)]), 1.005)

    sizes = sorted({p.memories for p in points})
    cost.set_xscale("log")
    cost.set_xlim(sizes[0] / 2, sizes[-1] * 2)
    cost.xaxis.set_major_locator(FixedLocator([float(s) for s in sizes]))
    cost.xaxis.set_minor_locator(NullLocator())
    cost.xaxis.set_major_formatter(FuncFormatter(_agent_size))
    for axes in (recall, size):
        axes.set_xlabel("memories per agent")

    fig.suptitle(growth.title)
    fig.legend(
        handles=[
            Line2D([], [], linestyle=style.linestyle, marker=style.marker, color="black", label=kind)
            for kind, style in styles.items()
        ],
        title="vectors",
        loc="outside lower center",
        ncols=min(len(styles), 3),
        fontsize="small",
    )
    return fig


def png(growth: Growth) -> bytes:
    """The growth picture as PNG bytes: matplotlib's default style (not the local
    matplotlibrc), fixed size and resolution, no metadata (no version, no time)."""
    with matplotlib.style.context("default"):
        out = io.BytesIO()
        figure(growth).savefig(out, format="png", dpi=FIGURE_DPI, metadata={"Software": None})
    return out.getvalue()


# --- the edges ---------------------------------------------------------------------------


def outputs(results: Path) -> tuple[Path, Path]:
    """The picture and the report written beside the results JSON."""
    return results.with_suffix(".png"), results.with_suffix(".md")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.growth",
        description="Growth as a picture: the PNG and table beside a results JSON.",
    )
    parser.add_argument("results", type=Path, help="benchmarks/results/growth-<date>.json")
    args = parser.parse_args(argv)
    results: Path = args.results
    try:
        growth = parse(json.loads(results.read_text()))
    except (OSError, json.JSONDecodeError, GrowthFileError) as error:
        print(f"{results}: {error}", file=sys.stderr)
        return 2
    picture, markdown = outputs(results)
    picture.write_bytes(png(growth))
    markdown.write_text(report(growth, picture.name))
    print(f"wrote {picture} and {markdown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
