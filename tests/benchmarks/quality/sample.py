"""A tiny conversation in LoCoMo's format, written here (not taken from the data set)."""

from __future__ import annotations

from typing import Any


def sample() -> dict[str, Any]:
    return {
        "sample_id": "conv-test",
        "conversation": {
            "speaker_a": "Ada",
            "speaker_b": "Ben",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ada", "dia_id": "D1:1", "text": "I adopted a grey cat named Pixel."},
                {
                    "speaker": "Ben",
                    "dia_id": "D1:2",
                    "text": "Lovely! Look at my garden.",
                    "img_url": ["http://example.invalid/x.jpg"],
                    "blip_caption": "a photo of tomato plants",
                },
            ],
            "session_2_date_time": "10:04 am on 19 December, 2023",
            "session_2": [
                {"speaker": "Ada", "dia_id": "D2:1", "text": "Pixel learned to open doors."},
                {"speaker": "Ben", "dia_id": "D2:2", "text": "I started running marathons in Oslo."},
                {
                    "speaker": "Ben",
                    "dia_id": "D2:3",
                    "text": "Sunny weather today.",
                    "blip_caption": "sunset over a fjord",
                },
            ],
            # A date without turns, as some upstream samples have.
            "session_3_date_time": "9:00 am on 1 January, 2024",
        },
        "qa": [
            {"question": "What is the cat called?", "answer": "Pixel", "evidence": ["D1:1"], "category": 4},
            {
                "question": "When did Ada adopt?",
                "answer": "May 2023",
                "evidence": ["D1:1; D2:1"],
                "category": 2,
            },
            {
                "question": "Where does Ben run?",
                "answer": "Oslo",
                "evidence": ["D:2:2", "D02:02"],
                "category": 1,
            },
            {"question": "Unanswerable", "adversarial_answer": "x", "evidence": ["D1:2"], "category": 5},
            {"question": "No evidence", "answer": "?", "evidence": [], "category": 3},
            {"question": "Malformed only", "answer": "?", "evidence": ["D"], "category": 3},
            {"question": "Unknown turn", "answer": "?", "evidence": ["D9:9"], "category": 3},
        ],
    }
