"""Okapi BM25 (k1 = 1.2, b = 0.75) over a fixed set of documents, in numpy.

Tokens: lowercase runs of ASCII letters and digits ("Caroline's" is "caroline" and
"s"), English stop words removed. IDF is the non-negative
Lucene form, ln(1 + (N - n + 0.5) / (n + 0.5)), so a word in most documents still
counts a little instead of subtracting.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

K1 = 1.2
B = 0.75

# The classic English stop list (Glasgow IR group / scikit-learn's ENGLISH_STOP_WORDS
# core), kept here so the benchmark needs no extra package.
STOP_WORDS: frozenset[str] = frozenset(
    """
    a about above across after afterwards again against all almost alone along already also although
    always am among amongst an and another any anyhow anyone anything anyway anywhere are around as at
    be became because become becomes becoming been before beforehand behind being below beside besides
    between beyond both but by can cannot could did do does doing done down during each eg either else
    elsewhere enough etc even ever every everyone everything everywhere except few for former formerly
    from further had has have having he hence her here hereafter hereby herein hereupon hers herself him
    himself his how however i ie if in indeed into is it its itself just last latter latterly least less
    ltd many may me meanwhile might more moreover most mostly much must my myself namely neither never
    nevertheless next no nobody none noone nor not nothing now nowhere of off often on once one only onto
    or other others otherwise our ours ourselves out over own per perhaps please rather re same seem
    seemed seeming seems several she should since so some somehow someone something sometime sometimes
    somewhere still such than that the their theirs them themselves then thence there thereafter thereby
    therefore therein thereupon these they this those though through throughout thru thus to together too
    toward towards under until up upon us very via was we well were what whatever when whence whenever
    where whereafter whereas whereby wherein whereupon wherever whether which while whither who whoever
    whole whom whose why will with within without would yet you your yours yourself yourselves
    s t d ll m o re ve y
    """.split()  # noqa: SIM905 - a word list reads better as text
)
_WORD = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]


class BM25Index:
    """Scores every document for a query at once (a dense term-frequency matrix:
    a LoCoMo conversation has a few hundred turns and a few thousand words)."""

    def __init__(self, documents: Sequence[str], *, k1: float = K1, b: float = B) -> None:
        tokenized = [tokenize(d) for d in documents]
        vocabulary: dict[str, int] = {}
        for tokens in tokenized:
            for token in tokens:
                vocabulary.setdefault(token, len(vocabulary))
        self._vocabulary = vocabulary
        counts = np.zeros((len(documents), max(1, len(vocabulary))), dtype=np.float32)
        for row, tokens in enumerate(tokenized):
            for token in tokens:
                counts[row, vocabulary[token]] += 1
        lengths = counts.sum(axis=1)
        average = float(lengths.mean()) if len(documents) else 0.0
        document_frequency = (counts > 0).sum(axis=0)
        n = len(documents)
        self._idf: npt.NDArray[np.float32] = np.log1p(
            (n - document_frequency + 0.5) / (document_frequency + 0.5)
        ).astype(np.float32)
        norm = k1 * (1 - b + b * lengths / max(average, 1e-9))
        # Per (document, term): the saturated term frequency, ready to be summed per query.
        self._weights: npt.NDArray[np.float32] = (counts * (k1 + 1) / (counts + norm[:, None])).astype(
            np.float32
        )

    def scores(self, query: str) -> npt.NDArray[np.float32]:
        """BM25 of every document for ``query`` (query words counted with multiplicity)."""
        columns = [self._vocabulary[t] for t in tokenize(query) if t in self._vocabulary]
        if not columns:
            return np.zeros(self._weights.shape[0], dtype=np.float32)
        picked = np.asarray(columns, dtype=np.int64)
        result: npt.NDArray[np.float32] = self._weights[:, picked] @ self._idf[picked]
        return result
