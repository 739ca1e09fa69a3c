from __future__ import annotations

import numpy as np

from benchmarks.quality.bm25 import BM25Index, tokenize

DOCUMENTS = [
    "Ada: I adopted a grey cat named Pixel.",
    "Ben: I started running marathons in Oslo.",
    "Ada: The weather in Oslo was cold, the cat stayed in.",
    "Ben: Marathons, marathons, marathons! Running is life.",
]


def test_tokens_are_lowercase_words_without_stop_words() -> None:
    assert tokenize("Where does Ben RUN? He's in Oslo's park") == ["ben", "run", "oslo", "park"]
    assert tokenize("the and of") == []


def test_the_document_matching_rare_words_ranks_first() -> None:
    index = BM25Index(DOCUMENTS)

    scores = index.scores("Which cat is called Pixel?")

    assert int(np.argmax(scores)) == 0
    assert scores[1] == 0  # no shared word
    assert scores[0] > scores[2] > 0


def test_term_frequency_saturates_and_long_documents_are_normalised() -> None:
    index = BM25Index(DOCUMENTS)

    scores = index.scores("marathons")

    # Three occurrences score more than one, but far less than three times as much.
    assert scores[1] < scores[3] < 3 * scores[1]


def test_a_query_of_unknown_words_scores_nothing() -> None:
    assert not BM25Index(DOCUMENTS).scores("zebra quantum").any()
