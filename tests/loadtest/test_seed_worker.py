"""What one seeding process computes: texts within the stored token range."""

from __future__ import annotations

import random

from loadtest import seed_worker


def _words(_name: str, text: str) -> int:
    return len(text.split())


def test_fit_tokens_pads_short_texts_and_trims_long_ones_into_the_range() -> None:
    rng = random.Random(1)
    short, counts = seed_worker.fit_tokens("Too short.", _words, rng, 50, 400)
    assert min(counts.values()) >= 50 and max(counts.values()) <= 400
    assert short.startswith("Too short.")
    long_text = " ".join(["word"] * 2000)
    _, counts = seed_worker.fit_tokens(long_text, _words, rng, 50, 400)
    assert min(counts.values()) >= 50 and max(counts.values()) <= 400
