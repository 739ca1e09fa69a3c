"""How a memory ranks: the formula, its constants and the rules for what is unknown,
stated once (ADR-0008).

    score      = relevance · adjustment
    adjustment = (w_rel + w_rec·recency + w_use·usefulness + w_conf·confidence
                  + w_freq·frequency) / Σw
    recency    = exp(-ln 2 · age_days / half_life(category)), age_days from occurred_at
                 (the stores give a memory written without one its write time); a date
                 in the future counts as age 0; an unknown age (no date at all, or one
                 that is not finite) counts ``UNKNOWN_RECENCY``
    usefulness = as stored (moved by feedback), ``DEFAULT_USEFULNESS`` when unknown,
                 clipped to [0, 1]
    confidence = as stored, ``DEFAULT_CONFIDENCE`` when unknown, clipped to [0, 1]
    frequency  = min(retrieval_count / FREQUENCY_CAP, 1): the count grows with every
                 injection, so it feeds on itself (its default weight is 0)

A memory's score is its relevance scaled by a factor in [w_rel / Σw, 1]: with the
default weights a stale, unrated memory keeps 80 % of its relevance, and nothing
lifts an off-topic memory above a relevant one by more than that factor.

Relevance exists on the request path only (``pipeline.scoring``: semantic and lexical
halves). The hot set is chosen before any query is known, so it ranks by the
adjustment alone (relevance 1, which changes the level, not the order) with the
default weights and half-lives: it is one set per agent, refreshed on writes, while
profiles are resolved per request and may change at any time (a ConfigMap edit), so
the weights of the profile that will read it are not known when it is built. The
profile's weights then rank the hot memories read on each request, with everything
else retrieved; they decide what is injected, the defaults only which memories wait
in Redis.

Each term is written once below as a function of a ``Math``: the operations it needs.
The request path evaluates it with numpy over all candidates (``NUMPY``), the hot
set's refresh with Python floats for one memory (``FLOATS``); the hot set's rebuild
in PostgreSQL and Redis's score update on an injection run it as code generated from
the same functions (``SQL``, ``LUA``). So a change to the formula is a change here,
and tests/test_ranking.py evaluates all four on a grid of inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from ibex_context.models import DEFAULT_CONFIDENCE as DEFAULT_CONFIDENCE
from ibex_context.models import DEFAULT_USEFULNESS as DEFAULT_USEFULNESS
from ibex_context.profiles.model import ScoringWeights

UNKNOWN_RECENCY = 0.5
FREQUENCY_CAP = 50
SECONDS_PER_DAY = 86_400.0
_LN2 = math.log(2.0)

# A value the formula computes with: a numpy array, a float, or ``Code`` (SQL or Lua):
# anything with + - * / against floats, with a ``Math`` for its functions.
Value: TypeAlias = Any


@dataclass(frozen=True, slots=True)
class Math:
    """The functions the formula needs, for one kind of ``Value``."""

    exp: Callable[[Value], Value]
    minimum: Callable[[Value, float], Value]
    maximum: Callable[[Value, float], Value]
    # (test, value, default): value where test is a finite number, else default.
    where_finite: Callable[[Value, Value, Value], Value]


def _float_where_finite(test: float, value: float, default: float) -> float:
    return value if math.isfinite(test) else default


NUMPY: Math = Math(
    exp=np.exp,
    minimum=np.minimum,
    maximum=np.maximum,
    where_finite=lambda test, value, default: np.where(np.isfinite(test), value, default),
)
FLOATS: Math = Math(exp=math.exp, minimum=min, maximum=max, where_finite=_float_where_finite)


# -- the terms ---------------------------------------------------------------------------


def recency(m: Math, occurred_at: Value, now: Value, half_life_days: Value) -> Value:
    """exp(-ln 2 · age_days / half_life); an unknown ``occurred_at`` gives
    ``UNKNOWN_RECENCY``, a future one counts as now."""
    age_days = m.maximum(now - occurred_at, 0.0) / SECONDS_PER_DAY
    return m.where_finite(occurred_at, m.exp(-_LN2 * age_days / half_life_days), UNKNOWN_RECENCY)


def rated(m: Math, value: Value, default: Any) -> Value:
    """A stored rating (usefulness, confidence): ``default`` when unknown, then [0, 1].
    ``default`` may be an array (numpy rates both ratings in one stacked call)."""
    return unit(m, m.where_finite(value, value, default))


def frequency(m: Math, retrieval_count: Value) -> Value:
    """min(retrieval_count / FREQUENCY_CAP, 1)."""
    return unit(m, retrieval_count / FREQUENCY_CAP)


def unit(m: Math, value: Value) -> Value:
    """Clipped to [0, 1]."""
    return m.minimum(m.maximum(value, 0.0), 1.0)


def adjustment(
    weights: ScoringWeights, recency: Value, usefulness: Value, confidence: Value, frequency: Value
) -> Value:
    """(w_rel + w_rec·recency + w_use·usefulness + w_conf·confidence + w_freq·frequency) / Σw.

    Summed left to right as the formula reads; a term of weight 0 adds 0.0 to a
    non-negative sum, which changes nothing, so it is left out."""
    w = weights
    total = w.relevance + w.recency + w.usefulness + w.confidence + w.frequency
    acc: Value = w.relevance
    for term_weight, signal in (
        (w.recency, recency),
        (w.usefulness, usefulness),
        (w.confidence, confidence),
        (w.frequency, frequency),
    ):
        if term_weight:
            acc = acc + term_weight * signal
    result: Value = acc / total
    return result


def frequency_share(weights: ScoringWeights) -> float:
    """The share of the adjustment the frequency term holds: an injection moves a
    score by ``frequency_share · Δfrequency`` (the only term injections move)."""
    return weights.frequency / (
        weights.relevance + weights.recency + weights.usefulness + weights.confidence + weights.frequency
    )


# -- code generation: the same terms in SQL and Lua -------------------------------------


def _operator(op: str, *, reflected: bool = False) -> Callable[[Code, object], Code]:
    def method(self: Code, other: object) -> Code:
        return self._binary(op, other, self) if reflected else self._binary(op, self, other)

    return method


@dataclass(frozen=True, slots=True)
class Code:
    """An expression in SQL or Lua, built with Python's operators; ``literal`` writes a
    number in the language."""

    text: str
    literal: Callable[[float], str]

    def _of(self, other: object) -> str:
        if isinstance(other, Code):
            return other.text
        if isinstance(other, int | float):
            return self.literal(float(other))
        raise TypeError(f"not an expression: {other!r}")

    def _binary(self, op: str, left: object, right: object) -> Code:
        return Code(f"({self._of(left)} {op} {self._of(right)})", self.literal)

    __add__ = _operator("+")
    __radd__ = _operator("+", reflected=True)
    __sub__ = _operator("-")
    __rsub__ = _operator("-", reflected=True)
    __mul__ = _operator("*")
    __rmul__ = _operator("*", reflected=True)
    __truediv__ = _operator("/")
    __rtruediv__ = _operator("/", reflected=True)


def _call(name: str, literal: Callable[[float], str]) -> Callable[..., Code]:
    """A function of the language, ``name(args...)``."""

    def call(*args: Code | float) -> Code:
        first = next(a for a in args if isinstance(a, Code))
        return Code(f"{name}({', '.join(first._of(a) for a in args)})", literal)

    return call


def _sql_literal(value: float) -> str:
    # A bare 0.5 is numeric in PostgreSQL; every value of the formula is float8.
    return f"{value!r}::float8"


def sql(text: str) -> Code:
    """A float8 SQL expression."""
    return Code(f"({text})::float8", _sql_literal)


def _sql_where_finite(test: Code, value: Code, default: Code | float) -> Code:
    # abs(NaN) < 'Infinity' is false in PostgreSQL (NaN sorts above every number) and
    # a NULL comparison is not true: both take the default, as infinities do.
    return Code(
        f"(CASE WHEN abs({test.text}) < 'Infinity'::float8 THEN {value.text} ELSE {test._of(default)} END)",
        _sql_literal,
    )


SQL: Math = Math(
    exp=_call("exp", _sql_literal),
    minimum=_call("least", _sql_literal),
    maximum=_call("greatest", _sql_literal),
    where_finite=_sql_where_finite,
)


def lua(text: str) -> Code:
    """A Lua number expression."""
    return Code(text, repr)


def _lua_where_finite(test: Code, value: Code, default: Code | float) -> Code:
    # A number is truthy in Lua (0 included), so and/or picks value or default.
    t = test.text
    return Code(
        f"((({t}) == ({t}) and math.abs({t}) ~= math.huge) and {value.text} or {test._of(default)})", repr
    )


LUA: Math = Math(
    exp=_call("math.exp", repr),
    minimum=_call("math.min", repr),
    maximum=_call("math.max", repr),
    where_finite=_lua_where_finite,
)
