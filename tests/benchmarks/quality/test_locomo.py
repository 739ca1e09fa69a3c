from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from benchmarks.quality.locomo import load_conversations, parse_evidence, parse_sample, parse_session_date

from .sample import sample


def test_session_dates_parse_to_utc() -> None:
    assert parse_session_date("1:56 pm on 8 May, 2023") == dt.datetime(2023, 5, 8, 13, 56, tzinfo=dt.UTC)
    assert parse_session_date("12:09 am on 13 September, 2023") == dt.datetime(
        2023, 9, 13, 0, 9, tzinfo=dt.UTC
    )
    assert parse_session_date("12:30 pm on 1 Jan 2024") == dt.datetime(2024, 1, 1, 12, 30, tzinfo=dt.UTC)
    with pytest.raises(ValueError):
        parse_session_date("yesterday")


def test_evidence_is_parsed_leniently() -> None:
    assert parse_evidence(["D1:3"]) == (["D1:3"], 0)
    assert parse_evidence(["D8:6; D9:17"]) == (["D8:6", "D9:17"], 2)
    assert parse_evidence(["D:11:26", "D30:05"]) == (["D11:26", "D30:5"], 2)
    assert parse_evidence(["D", 7]) == ([], 0)
    assert parse_evidence(["D1:3", "D1:3"]) == (["D1:3"], 0)


def test_a_sample_becomes_turns_and_askable_questions() -> None:
    conversation = parse_sample(sample())

    assert [t.dia_id for t in conversation.turns] == ["D1:1", "D1:2", "D2:1", "D2:2", "D2:3"]
    assert conversation.turns[0].content == "Ada: I adopted a grey cat named Pixel."
    assert (
        conversation.turns[1].content == "Ben: Lovely! Look at my garden. [shares a photo of tomato plants]"
    )
    assert (
        conversation.turns[4].content == "Ben: Sunny weather today. [shares a photo of sunset over a fjord]"
    )
    assert conversation.turns[2].occurred_at == dt.datetime(2023, 12, 19, 10, 4, tzinfo=dt.UTC)

    assert [(q.number, q.category, q.evidence) for q in conversation.questions] == [
        (0, 4, ("D1:1",)),
        (1, 2, ("D1:1", "D2:1")),
        (2, 1, ("D2:2",)),
    ]
    report = conversation.evidence_report
    assert report.questions_total == 7
    assert report.questions_other_category == 1
    assert report.questions_without_evidence == 3
    assert report.ids_unknown == 1
    assert report.ids_repaired == 4


def test_conversations_are_chosen_by_sample_id(tmp_path: Path) -> None:
    other = sample() | {"sample_id": "conv-other"}
    path = tmp_path / "data.json"
    path.write_text(json.dumps([sample(), other]))

    assert [c.sample_id for c in load_conversations(path)] == ["conv-test", "conv-other"]
    assert [c.sample_id for c in load_conversations(path, ["conv-other"])] == ["conv-other"]
    with pytest.raises(ValueError, match="conv-missing"):
        load_conversations(path, ["conv-missing"])
