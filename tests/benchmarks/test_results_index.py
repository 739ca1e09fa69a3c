"""``benchmarks/results/`` holds the current evidence and an index of it (issue 30): every
file is in the index, every link to a results file resolves, and superseded runs leave
the tree (git keeps them) instead of piling up."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "README.md"
# The bound: beyond it, the results are history, which git keeps.
MOST_FILES = 60
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _results_files() -> list[Path]:
    """The committed results (a local run's new file is the developer's until committed)."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "benchmarks/results"], capture_output=True, check=False
    )
    if listed.returncode != 0:  # not a git checkout: every file there
        return sorted(p for p in RESULTS.rglob("*") if p.is_file() and p != INDEX)
    return sorted(ROOT / name for name in listed.stdout.decode().split("\0") if name and ROOT / name != INDEX)


def _links(document: Path) -> list[Path]:
    return [
        (document.parent / target).resolve()
        for target in LINK.findall(document.read_text())
        if not target.startswith(("http://", "https://", "mailto:"))
    ]


def test_the_results_stay_few_enough_to_be_the_current_evidence() -> None:
    assert len(_results_files()) + 1 <= MOST_FILES


def test_every_results_file_is_in_the_index() -> None:
    indexed = {p for p in _links(INDEX) if p.is_relative_to(RESULTS)}
    # A run's per-question .json stands beside its indexed .md.
    missing = [
        p.relative_to(RESULTS)
        for p in _results_files()
        if p.resolve() not in indexed and p.with_suffix(".md").resolve() not in indexed
    ]
    assert not missing, f"not in benchmarks/results/README.md: {missing}"


def test_every_link_to_a_results_file_resolves() -> None:
    documents = [ROOT / "README.md", INDEX, *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [
        f"{document.relative_to(ROOT)} -> {target}"
        for document in documents
        for target in _links(document)
        if target.is_relative_to(RESULTS) and not target.exists()
    ]
    assert not broken, broken
