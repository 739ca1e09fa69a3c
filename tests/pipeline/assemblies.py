"""Assemblies for tests that read one (the wire, metrics, spans): a timed, answered
call whose every part can be changed."""

from __future__ import annotations

import dataclasses
from typing import Any

from ibex_context.models import ChatMessage, Degradation
from ibex_context.pipeline.assembly import Assembly, Composition
from ibex_context.pipeline.budget import TokenBudget, compute_budget
from ibex_context.pipeline.outcome import Outcome, Timings
from ibex_context.profiles.model import BudgetLimits
from ibex_context.tokens.catalogue import resolve_model

MESSAGES = (ChatMessage("user", "when does the warehouse open?"),)


def a_budget(**changes: Any) -> TokenBudget:
    """gpt-4o's budget for a 20-token prompt and a 40-token directive (memory budget 4,000)."""
    budget = compute_budget(
        resolve_model("gpt-4o", {}),
        messages_tokens=20,
        directive_tokens=40,
        limits=BudgetLimits(),
        exact=True,
    )
    return dataclasses.replace(budget, **changes)


def an_assembly(*, composed: dict[str, Any] | None = None, **changes: Any) -> Assembly:
    """A FULL call of 12 ms that injected nothing; ``composed`` changes its composition."""
    assembly = Assembly(
        request_id="r1",
        model="gpt-4o",
        profile="default",
        composed=Composition(MESSAGES, budget=a_budget())._replace(**(composed or {})),
        degradation=Degradation.FULL,
        reasons=(),
        outcome=Outcome.FULL,
        sources=(),
        candidates_evaluated=0,
        context_window_used=1,
        timings=Timings(1_000_000, 13_000_000),
    )
    return assembly._replace(**changes)
