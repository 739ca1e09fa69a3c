"""What one call produced, once: the ``Assembly`` (the call's outcome) and the
``Composition`` inside it, a ``Rejection`` for a request refused before any assembly,
and the ``AssemblyObserver`` they are handed to.

One record, made once at the end of every path (``Assembler._finish``): the wire's
response is built from it (``server.assembly_service``), and observability reads the same
value after the send (metrics, spans, the access log) through the observer the
handler is given. Nothing changes it. ``NamedTuple``s, like the outcome's vocabulary
(``pipeline.outcome``): immutable and cheap to build once per call.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from ibex_context.models import ChatMessage, Degradation, ScoredMemory
from ibex_context.pipeline.budget import TokenBudget
from ibex_context.pipeline.outcome import Outcome, Reason, SourceResult, StageSpan, Timings


class Composition(NamedTuple):
    """What was injected: the compose step's result, or a fallback's (the directive
    alone, or the client's messages unchanged)."""

    messages: tuple[ChatMessage, ...]
    directive_injected: bool = False
    memories: tuple[ScoredMemory, ...] = ()  # in rank order, ``tokens`` set to their cost
    handles: tuple[int, ...] = ()  # each memory's handle in the injected text
    memories_available: int = 0  # candidates above the relevance floor
    tokens_injected: int = 0
    memory_tokens: int = 0
    was_truncated: bool = False
    # None when the call ended before its model was resolved (shed, out of time).
    budget: TokenBudget | None = None
    # The directive alone would not leave the response reserve: nothing injected.
    directive_exceeds_window: bool = False
    # perf_counter_ns marks of the compose step: start, ranked, packed, rendered.
    marks: tuple[int, int, int, int] = (0, 0, 0, 0)


class Assembly(NamedTuple):
    """The outcome of one answered call: what it injected (``composed``), how far it got
    (degradation, reasons, each source's outcome) and when (``timings``)."""

    request_id: str
    model: str
    profile: str
    composed: Composition
    degradation: Degradation
    # Most severe first; the first is the wire's fallback_reason.
    reasons: tuple[Reason, ...]
    outcome: Outcome
    # Every source's outcome, in ``SOURCES`` order (none when no source was asked).
    sources: tuple[SourceResult, ...]
    candidates_evaluated: int
    # Percent of the model's window the prompt takes, rounded up.
    context_window_used: int
    timings: Timings

    @property
    def messages(self) -> tuple[ChatMessage, ...]:
        return self.composed.messages

    @property
    def memories(self) -> tuple[ScoredMemory, ...]:
        return self.composed.memories

    @property
    def handles(self) -> tuple[int, ...]:
        return self.composed.handles

    @property
    def budget(self) -> TokenBudget | None:
        return self.composed.budget

    @property
    def memories_injected(self) -> int:
        return len(self.composed.memories)

    @property
    def memory_budget(self) -> int:
        budget = self.composed.budget
        return budget.memory_budget if budget is not None else 0

    @property
    def encoding(self) -> str:
        """The encoding counted with; none before the model was resolved."""
        budget = self.composed.budget
        return budget.encoding if budget is not None else ""

    @property
    def exact_tokens(self) -> bool:
        budget = self.composed.budget
        return budget.exact if budget is not None else True

    @property
    def budget_utilisation(self) -> float:
        """Share of the memory budget the injected memories used (0..1)."""
        budget = self.memory_budget
        return min(1.0, self.composed.memory_tokens / budget) if budget > 0 else 0.0

    @property
    def duration_seconds(self) -> float:
        return max(0, self.timings.finished_ns - self.timings.started_ns) / 1e9


class Rejection(NamedTuple):
    """A request refused with INVALID_ARGUMENT before any assembly: its (loggable)
    request id and model, and the field that failed."""

    request_id: str
    model: str
    field: str

    @property
    def outcome(self) -> Outcome:
        return Outcome.INVALID


class AssemblyObserver(Protocol):
    """Told what each AssembleContext call produced, after the response was sent
    (``send``: the response's serialization; None when it did not finish)."""

    def answered(self, assembly: Assembly, send: StageSpan | None) -> None: ...

    def rejected(self, rejection: Rejection) -> None: ...
