"""``benchmarks.growth`` turns issue 40's growth measurements (one JSON) into a table and a
picture beside it: a row per agent size, what was not measured said so, a real PNG of a
fixed size that the same figures always draw byte for byte."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from benchmarks import growth

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PICTURE_PIXELS = (
    round(growth.FIGURE_INCHES[0] * growth.FIGURE_DPI),
    round(growth.FIGURE_INCHES[1] * growth.FIGURE_DPI),
)


def _measured(memories: int, **figures: Any) -> dict[str, Any]:
    point: dict[str, Any] = {
        "memories": memories,
        "vectors": "MiniLM-shaped (drawn)",
        "stores_cpu_ms": 4.7,
        "cold_p95_ms": 9.9,
        "search_median_ms": 1.8,
        "recall_mean": 0.99,
        "recall_p5": 0.96,
        "bytes_disk": 4100,
        "bytes_memory": 3000,
        "source": "shapes-2026-12-07.md",
    }
    return point | figures


def _document(*points: dict[str, Any]) -> dict[str, Any]:
    return {"title": "Growth", "setup": ["- two cores", "- MiniLM queries"], "points": list(points)}


FOUR_SIZES = _document(
    _measured(1_000, stores_cpu_ms=2.9),
    _measured(10_000),
    # The same size with other vectors: a point of its own, still drawn.
    _measured(10_000, vectors="MiniLM (real)", stores_cpu_ms=None, cold_p95_ms=None),
    _measured(100_000, recall_p5=None, bytes_disk=None, bytes_memory=None),
    # Nothing measured yet at 1M.
    _measured(
        1_000_000,
        stores_cpu_ms=None,
        cold_p95_ms=None,
        search_median_ms=None,
        recall_mean=None,
        recall_p5=None,
        bytes_disk=None,
        bytes_memory=None,
        source="not run",
    ),
)


def _rows(markdown: str) -> list[list[str]]:
    """The table's body rows, cell by cell."""
    rows = [line for line in markdown.splitlines() if line.startswith("| ")][1:]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows]


def test_the_table_has_a_row_per_point_in_the_files_order() -> None:
    rows = _rows(growth.table(growth.parse(FOUR_SIZES).points))

    assert [(row[0], row[1]) for row in rows] == [
        ("1,000", "MiniLM-shaped (drawn)"),
        ("10,000", "MiniLM-shaped (drawn)"),
        ("10,000", "MiniLM (real)"),
        ("100,000", "MiniLM-shaped (drawn)"),
        ("1,000,000", "MiniLM-shaped (drawn)"),
    ]
    assert rows[0] == [
        "1,000",
        "MiniLM-shaped (drawn)",
        "2.9",
        "9.9",
        "1.8",
        "0.990 / 0.960",
        "4,100 / 3,000",
        "shapes-2026-12-07.md",
    ]


def test_what_was_not_measured_reads_not_measured() -> None:
    rows = _rows(growth.table(growth.parse(FOUR_SIZES).points))

    assert rows[2][2:4] == ["not measured", "not measured"]
    assert rows[3][5:7] == ["0.990 / not measured", "not measured"]
    assert rows[4][2:7] == ["not measured"] * 5


def test_the_report_gives_the_title_the_setup_the_table_and_the_picture_beside_it() -> None:
    markdown = growth.report(growth.parse(FOUR_SIZES), "growth-2026-12-07.png")

    lines = markdown.splitlines()
    assert lines[0] == "# Growth"
    assert "- two cores" in lines and "- MiniLM queries" in lines
    assert len(_rows(markdown)) == 5
    assert lines[-1] == "![growth](growth-2026-12-07.png)"


def test_a_pipe_in_a_cell_does_not_split_the_row() -> None:
    rows = _rows(growth.table(growth.parse(_document(_measured(1_000, source="a | b"))).points))

    assert rows[0][-1] == "a \\| b"


def _picture(png: bytes) -> Image.Image:
    assert png.startswith(PNG_MAGIC)
    image = Image.open(io.BytesIO(png))
    image.load()
    return image


def test_the_picture_is_a_png_of_the_fixed_size() -> None:
    image = _picture(growth.png(growth.parse(FOUR_SIZES)))

    assert image.format == "PNG"
    assert image.size == PICTURE_PIXELS


@pytest.mark.parametrize(
    "document",
    [
        FOUR_SIZES,
        # One size only, and a panel (bytes) with nothing measured at all.
        _document(_measured(10_000, bytes_disk=None, bytes_memory=None)),
        # Nothing measured anywhere.
        FOUR_SIZES | {"points": [FOUR_SIZES["points"][-1]]},
    ],
    ids=["gaps", "one size, one empty panel", "nothing measured"],
)
def test_unmeasured_figures_leave_gaps_instead_of_breaking_the_picture(document: dict[str, Any]) -> None:
    assert _picture(growth.png(growth.parse(document))).size == PICTURE_PIXELS


def test_the_same_figures_draw_the_same_bytes() -> None:
    assert growth.png(growth.parse(FOUR_SIZES)) == growth.png(
        growth.parse(json.loads(json.dumps(FOUR_SIZES)))
    )


def test_the_command_writes_the_picture_and_the_report_beside_the_json(tmp_path: Path) -> None:
    results = tmp_path / "growth-2026-12-07.json"
    results.write_text(json.dumps(FOUR_SIZES))

    assert growth.main([str(results)]) == 0

    picture, markdown = tmp_path / "growth-2026-12-07.png", tmp_path / "growth-2026-12-07.md"
    assert _picture(picture.read_bytes()).size == PICTURE_PIXELS
    assert markdown.read_text() == growth.report(growth.parse(FOUR_SIZES), picture.name)
    first = picture.read_bytes()
    assert growth.main([str(results)]) == 0
    assert picture.read_bytes() == first


@pytest.mark.parametrize(
    ("document", "complaint"),
    [
        (_document(), "points"),
        (_document(_measured(0)), "memories"),
        (_document(_measured(1_000, recall_mean="0.99")), "recall_mean"),
        ({"setup": [], "points": [_measured(1_000)]}, "title"),
    ],
    ids=["no points", "no memories", "a figure as text", "no title"],
)
def test_a_file_of_another_shape_is_refused_with_what_is_wrong(
    document: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(growth.GrowthFileError, match=complaint):
        growth.parse(document)


def test_the_command_reports_a_malformed_file_without_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "growth-2026-12-07.json"
    results.write_text(json.dumps(_document()))

    assert growth.main([str(results)]) == 2

    assert "points" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == [results.name]
