"""What one assembly did: the single record metrics, traces and logs are built from.

An ``AssemblyReport`` is a value, built once by ``build_report`` from what the call
produced (the ``Assembly``: its sources' outcomes, its stages' timings, its token
accounting) and the response's send, after the send. Observability reads it after
the response (``observability``); nothing changes it, so the request path carries no
metrics or tracing calls of its own. A ``NamedTuple``, like the outcome's values
(``pipeline.outcome``): immutable and cheap to build once per call.
"""

from __future__ import annotations

from typing import NamedTuple

from ibex_context.models import AssemblyRequest, Degradation
from ibex_context.pipeline.assembler import Assembly
from ibex_context.pipeline.outcome import Outcome, Reason, SourceResult, StageSpan, outcome_of


class AssemblyReport(NamedTuple):
    request_id: str
    model: str = ""
    profile: str = ""
    # 0 for a request rejected before any assembly (nothing was timed).
    started_ns: int = 0
    finished_ns: int = 0
    outcome: Outcome = Outcome.FULL
    degradation: Degradation = Degradation.FULL
    # Most severe first; the first is the wire's fallback_reason.
    reasons: tuple[Reason, ...] = ()
    stages: tuple[StageSpan, ...] = ()
    sources: tuple[SourceResult, ...] = ()
    candidates_evaluated: int = 0
    memories_available: int = 0
    memories_injected: int = 0
    directive_injected: bool = False
    tokens_injected: int = 0
    memory_budget: int = 0
    memory_tokens_used: int = 0
    encoding: str = ""
    exact_tokens: bool = True
    invalid_field: str = ""

    @property
    def duration_seconds(self) -> float:
        return max(0, self.finished_ns - self.started_ns) / 1e9

    @property
    def budget_utilisation(self) -> float:
        """Share of the memory budget the injected memories used (0..1)."""
        if self.memory_budget <= 0:
            return 0.0
        return min(1.0, self.memory_tokens_used / self.memory_budget)


def build_report(
    request: AssemblyRequest, profile: str, assembly: Assembly, serialize: StageSpan | None = None
) -> AssemblyReport:
    """The report of an answered call: ``assembly`` as put on the wire for ``request``
    under the profile named ``profile``, and the response's send (``serialize``; None
    when the send did not finish). Pure: reads its arguments, changes none."""
    budget, timings = assembly.budget, assembly.timings
    return AssemblyReport(
        request_id=request.request_id,
        model=request.model,
        profile=profile,
        started_ns=timings.started_ns,
        finished_ns=timings.finished_ns,
        outcome=outcome_of(assembly.degradation, assembly.reasons),
        degradation=assembly.degradation,
        reasons=assembly.reasons,
        stages=timings.stages if serialize is None else (*timings.stages, serialize),
        sources=assembly.sources,
        candidates_evaluated=assembly.candidates_evaluated,
        memories_available=assembly.memories_available,
        memories_injected=len(assembly.memories),
        directive_injected=assembly.directive_injected,
        tokens_injected=assembly.tokens_injected,
        memory_budget=budget.memory_budget if budget else 0,
        memory_tokens_used=assembly.memory_tokens_used,
        # The encoding counted with; none before the model was resolved.
        encoding=budget.encoding if budget else "",
        exact_tokens=budget.exact if budget else True,
    )


def invalid_report(request_id: str, model: str, field: str) -> AssemblyReport:
    """The report of a request rejected with INVALID_ARGUMENT naming ``field``."""
    return AssemblyReport(request_id=request_id, model=model, outcome=Outcome.INVALID, invalid_field=field)
