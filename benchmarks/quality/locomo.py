"""Reading LoCoMo: conversations, their dialog turns and the questions with evidence.

The format is that of upstream ``data/locomo10.json`` (see the data's README): a list
of samples, each with ``sample_id``, ``conversation`` (``session_N`` turn lists and
``session_N_date_time`` strings) and ``qa``. Only this module (and the benchmark
around it) knows turns and dia_ids; the service never does.

Category labels follow the content of the questions (the README's reading):
1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop; 5 (adversarial) is not asked.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CATEGORY_LABELS: Mapping[int, str] = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
ASKED_CATEGORIES: tuple[int, ...] = tuple(CATEGORY_LABELS)

_SESSION_KEY = re.compile(r"session_(\d+)")
# "1:56 pm on 8 May, 2023"; the comma and the spacing vary a little between files.
_SESSION_DATE = re.compile(
    r"\s*(\d{1,2}):(\d{2})\s*([ap])\.?m\.?\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})\s*", re.IGNORECASE
)
_MONTHS: Mapping[str, int] = {
    name: number
    for number, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        start=1,
    )
    for name in names
}
# Lenient: "D8:6; D9:17" holds two ids, "D:11:26" is D11:26, "D30:05" is D30:5; "D" none.
_EVIDENCE_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")


@dataclass(frozen=True, slots=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str
    image_caption: str | None
    occurred_at: dt.datetime

    @property
    def content(self) -> str:
        """The memory text: who said what, and what picture they shared (its caption)."""
        content = f"{self.speaker}: {self.text}"
        if self.image_caption:
            caption = self.image_caption.strip()
            # Captions read "a photo of ..." (sometimes "a photography of ...").
            shared = caption if caption.lower().startswith("a photo") else f"a photo of {caption}"
            content += f" [shares {shared}]"
        return content


@dataclass(frozen=True, slots=True)
class Question:
    """A question asked of the service; ``evidence`` are dia_ids of this conversation's turns."""

    number: int  # position in the sample's qa list: identifies it in the results, without its text
    text: str
    category: int
    evidence: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EvidenceReport:
    """How the evidence annotations of one conversation parsed."""

    questions_total: int = 0
    questions_other_category: int = 0
    questions_without_evidence: int = 0
    ids_repaired: int = 0
    ids_unknown: int = 0


@dataclass(frozen=True, slots=True)
class Conversation:
    sample_id: str
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]
    evidence_report: EvidenceReport = field(default_factory=EvidenceReport)


def parse_session_date(text: str) -> dt.datetime:
    """``"1:56 pm on 8 May, 2023"`` as an aware UTC datetime (the data has no time zone)."""
    match = _SESSION_DATE.fullmatch(text)
    if match is None:
        raise ValueError(f"unrecognised session date {text!r}")
    hour, minute, half, day, month_name, year = match.groups()
    month = _MONTHS.get(month_name.lower())
    if month is None:
        raise ValueError(f"unrecognised month in session date {text!r}")
    hour_24 = int(hour) % 12 + (12 if half.lower() == "p" else 0)
    return dt.datetime(int(year), month, int(day), hour_24, int(minute), tzinfo=dt.UTC)


def parse_evidence(raw: Iterable[object]) -> tuple[list[str], int]:
    """Canonical dia_ids (``D<session>:<turn>``, no leading zeros) found in ``raw``, in
    order and without duplicates, and how many of them needed repair to be read."""
    found: list[str] = []
    repaired = 0
    for item in raw:
        if not isinstance(item, str):
            continue
        for match in _EVIDENCE_ID.finditer(item):
            canonical = f"D{int(match.group(1))}:{int(match.group(2))}"
            if match.group(0) != canonical or item.strip() != match.group(0):
                repaired += 1
            if canonical not in found:
                found.append(canonical)
    return found, repaired


def _turns(sample_id: str, conversation: Mapping[str, Any]) -> list[Turn]:
    turns: list[Turn] = []
    sessions = sorted(
        (int(m.group(1)), key)
        for key in conversation
        if (m := _SESSION_KEY.fullmatch(key)) and isinstance(conversation[key], list)
    )
    for number, key in sessions:
        date_text = conversation.get(f"{key}_date_time")
        if not isinstance(date_text, str):
            raise ValueError(f"{sample_id}: {key} has turns but no {key}_date_time")
        occurred_at = parse_session_date(date_text)
        for raw in conversation[key]:
            caption = raw.get("blip_caption")
            turns.append(
                Turn(
                    dia_id=str(raw["dia_id"]),
                    session=number,
                    speaker=str(raw["speaker"]),
                    text=str(raw["text"]),
                    image_caption=caption if isinstance(caption, str) and caption.strip() else None,
                    occurred_at=occurred_at,
                )
            )
    return turns


def parse_sample(sample: Mapping[str, Any]) -> Conversation:
    sample_id = str(sample["sample_id"])
    turns = _turns(sample_id, sample["conversation"])
    known = {turn.dia_id for turn in turns}
    questions: list[Question] = []
    other = without = repaired_total = unknown_total = 0
    qa: Sequence[Mapping[str, Any]] = sample.get("qa", [])
    for number, item in enumerate(qa):
        category = item.get("category")
        if not isinstance(category, int) or category not in CATEGORY_LABELS:
            other += 1
            continue
        evidence, repaired = parse_evidence(item.get("evidence") or [])
        repaired_total += repaired
        usable = [e for e in evidence if e in known]
        unknown_total += len(evidence) - len(usable)
        if not usable:
            without += 1
            continue
        questions.append(Question(number, str(item["question"]), category, tuple(usable)))
    report = EvidenceReport(
        questions_total=len(qa),
        questions_other_category=other,
        questions_without_evidence=without,
        ids_repaired=repaired_total,
        ids_unknown=unknown_total,
    )
    return Conversation(sample_id, tuple(turns), tuple(questions), report)


def load_conversations(path: Path, wanted: Sequence[str] | None = None) -> list[Conversation]:
    """The conversations of ``path`` (all, or those named in ``wanted``, in that order)."""
    samples = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(samples, list):
        raise ValueError(f"{path}: expected a list of LoCoMo samples")
    by_id = {str(s["sample_id"]): s for s in samples}
    if wanted:
        missing = [w for w in wanted if w not in by_id]
        if missing:
            raise ValueError(f"{path}: no conversation {', '.join(missing)} (has {', '.join(by_id)})")
        return [parse_sample(by_id[w]) for w in wanted]
    return [parse_sample(s) for s in samples]
