"""The vocabulary of a call's outcome: its stages, its sources and how each ended, the
reasons an assembly did less than everything, and the outcome label.

One definition each: the assembler records in these terms, the call's ``Assembly``
(``pipeline.assembly``) carries them, the wire (``server.assembly_service``) reads them,
and observability labels its series with them. The wire's ``StageTimings`` has one
``<stage>_us`` field per ``Stage`` but ``SERIALIZE`` (the send, timed after the
response is built; tests/server/test_assembly_service.py keeps the two in step).

The values made for every call (stages, the sources' outcomes) are ``NamedTuple``s:
immutable like a frozen dataclass, but built about four times faster (a frozen
dataclass sets each field through ``object.__setattr__``).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from ibex_context.models import Degradation


class Stage(enum.StrEnum):
    """A call's stages, in the order they run. The values are the metrics' ``stage`` label
    and name the wire's ``<stage>_us`` fields; the retrieval sources' stages share their
    ``SourceName``'s value."""

    BUDGET = "budget"
    DIRECTIVE = "directive"
    HOT = "hot"
    EMBED = "embed"
    COLD = "cold"
    LEXICAL = "lexical"
    SCORE = "score"
    PACK = "pack"
    FORMAT = "format"
    SERIALIZE = "serialize"


STAGES: tuple[Stage, ...] = tuple(Stage)


class SourceName(enum.StrEnum):
    """The retrieval sources, in the order the metadata lists them; each is a stage."""

    DIRECTIVE = Stage.DIRECTIVE.value
    HOT = Stage.HOT.value
    EMBED = Stage.EMBED.value
    COLD = Stage.COLD.value
    LEXICAL = Stage.LEXICAL.value


SOURCES: tuple[SourceName, ...] = tuple(SourceName)
# The stage each source's interval is timed as.
SOURCE_STAGES: dict[SourceName, Stage] = {source: Stage(source.value) for source in SourceName}


class Reason(enum.StrEnum):
    """Why an assembly did less than everything, most severe first: the first of a
    call's reasons is the wire's ``fallback_reason`` (``Reason.ordered``). The values
    are the wire's ``degradation_reasons`` and the metrics' ``reason`` label."""

    DEADLINE_EXCEEDED = "deadline_exceeded"
    ASSEMBLY_ERROR = "assembly_error"
    DIRECTIVE_TIMEOUT = "directive_timeout"
    DIRECTIVE_ERROR = "directive_error"
    HOT_TIMEOUT = "hot_timeout"
    HOT_ERROR = "hot_error"
    EMBED_TIMEOUT = "embed_timeout"
    EMBED_ERROR = "embed_error"
    COLD_TIMEOUT = "cold_timeout"
    COLD_ERROR = "cold_error"
    LEXICAL_TIMEOUT = "lexical_timeout"
    LEXICAL_ERROR = "lexical_error"
    # Not a source's failure: the call as a whole.
    OVERLOADED = "overloaded"
    # Shed by fair admission (server/admission.py): the call's org was over its share of a
    # saturated process, or over its own rate limit; other orgs' calls were assembled.
    ORG_OVER_SHARE = "org_over_share"
    ORG_OVER_RATE = "org_over_rate"
    MESSAGES_EXCEED_WINDOW = "messages_exceed_window"
    DIRECTIVE_EXCEEDS_WINDOW = "directive_exceeds_window"

    @classmethod
    def of_source(cls, source: SourceName, status: SourceStatus) -> Reason | None:
        """The reason a source's outcome gives, None when it answered or was skipped."""
        return _SOURCE_REASONS.get((source, status))

    @property
    def source(self) -> SourceName | None:
        """The source whose failure this is, None for a reason of the whole call."""
        return _REASON_SOURCES.get(self)

    @staticmethod
    def ordered(reasons: list[Reason]) -> list[Reason]:
        """Most severe first (declaration order)."""
        return sorted(reasons, key=_SEVERITY.__getitem__)


class Outcome(enum.StrEnum):
    """The outcome label of the assembly duration histogram."""

    FULL = "full"  # everything asked for answered
    DEGRADED = "degraded"  # some source failed; memories or directive still injected
    FALLBACK = "fallback"  # directive only or pass-through
    INVALID = "invalid"  # rejected with INVALID_ARGUMENT


class SourceStatus(enum.IntEnum):
    """Values match the wire enum SourceStatus."""

    OK = 1
    TIMEOUT = 2
    ERROR = 3
    SKIPPED = 4


class StageSpan(NamedTuple):
    """A stage's wall-clock interval, ``time.perf_counter_ns()`` based."""

    stage: Stage
    start_ns: int
    end_ns: int

    @property
    def duration_us(self) -> int:
        return (self.end_ns - self.start_ns) // 1000


class Timings(NamedTuple):
    """When an assembly started and finished and its stages' intervals, collected as
    the call ran (``time.perf_counter_ns()``)."""

    started_ns: int
    finished_ns: int
    stages: tuple[StageSpan, ...] = ()

    @property
    def total_us(self) -> int:
        return max(0, self.finished_ns - self.started_ns) // 1000

    def stages_us(self) -> dict[str, int]:
        """Microseconds per stage name (a stage that ran twice is summed)."""
        durations: dict[str, int] = {}
        for span in self.stages:
            durations[span.stage] = durations.get(span.stage, 0) + span.duration_us
        return durations

    @property
    def retrieval_us(self) -> int:
        """From the first source's start to the last one's end."""
        spans = [s for s in self.stages if s.stage in _SOURCE_NAMES]
        if not spans:
            return 0
        return (max(s.end_ns for s in spans) - min(s.start_ns for s in spans)) // 1000


# The cold source's ``detail`` when it answered: which plan searched (stores.cold_plan),
# e.g. "plan: agent_halfvec", and whether its graph walk was repeated wider after it missed
# ("plan: agent_halfvec, walked again wider"). On the wire as SourceOutcome.detail; counted
# by plan in metrics, and the repeated walks apart.
_PLAN_PREFIX = "plan: "
_REWALKED_SUFFIX = ", walked again wider"


# The embed source's detail when the call searched with the stand-in's query vector (its
# embedder's was late or failed: ``pipeline.retrieval.StandIn``); the metrics count it.
STAND_IN_DETAIL = "stand-in: static table"


def plan_detail(plan: str, *, rewalked: bool = False) -> str:
    return _PLAN_PREFIX + plan + (_REWALKED_SUFFIX if rewalked else "")


def plan_of(detail: str) -> str | None:
    """The plan named by a ``plan_detail``, else None."""
    if not detail.startswith(_PLAN_PREFIX):
        return None
    return detail[len(_PLAN_PREFIX) :].removesuffix(_REWALKED_SUFFIX)


def rewalked(detail: str) -> bool:
    """Whether a ``plan_detail`` says the graph walk was repeated wider."""
    return detail.startswith(_PLAN_PREFIX) and detail.endswith(_REWALKED_SUFFIX)


class SourceResult(NamedTuple):
    """How one source ended (on the wire as a ``SourceOutcome``)."""

    source: SourceName
    status: SourceStatus
    duration_us: int = 0
    # What it returned: memories, or 1 for a directive or a query embedding (the wire's
    # ``count``; a tuple already has a ``count`` method).
    found: int = 0
    detail: str = ""


def outcome_of(degradation: Degradation, reasons: tuple[Reason, ...]) -> Outcome:
    """The metrics' outcome of a degradation level: FULL only when nothing went wrong."""
    if degradation is Degradation.FULL:
        return Outcome.DEGRADED if reasons else Outcome.FULL
    if degradation in _DEGRADED_LEVELS:
        return Outcome.DEGRADED
    return Outcome.FALLBACK


_SOURCE_REASONS: dict[tuple[SourceName, SourceStatus], Reason] = {
    (source, status): Reason(f"{source.value}_{kind}")
    for source in SourceName
    for status, kind in ((SourceStatus.TIMEOUT, "timeout"), (SourceStatus.ERROR, "error"))
}
_REASON_SOURCES: dict[Reason, SourceName] = {
    reason: source for (source, _), reason in _SOURCE_REASONS.items()
}
_SOURCE_NAMES: frozenset[str] = frozenset(SourceName)
_DEGRADED_LEVELS = frozenset({Degradation.HOT_ONLY, Degradation.COLD_ONLY, Degradation.PARTIAL})
_SEVERITY: dict[Reason, int] = {reason: rank for rank, reason in enumerate(Reason)}
