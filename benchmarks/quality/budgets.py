"""The budgets measured, and the profiles that give them to the service.

A budget is a profile's ``budget.maxMemoryTokens`` and ``budget.maxMemories``. Each
budget gets its own agents (fresh ids, memories ingested again), selected by agent
id in one profiles file, so one service process serves every budget and the
injection counters of one budget's run never reach another's.

Every profile also gets the longest deadlines the profile schema allows (45 ms for
the assembly, 44 ms per source), so a slow machine degrades as few answers as
possible; the benchmark counts the ones that still degrade.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ibex_context.profiles.model import BudgetLimits
from ibex_context.profiles.schema import MAX_ASSEMBLY_MS

_DEFAULT = BudgetLimits()
# Each source must answer strictly before the assembly deadline.
SOURCE_MS = MAX_ASSEMBLY_MS - 1.0


@dataclass(frozen=True, slots=True)
class Budget:
    name: str  # as given on the command line: "1000", "default", "4000x100"
    max_memory_tokens: int
    max_memories: int

    @property
    def label(self) -> str:
        if self.name == "default":
            return f"default ({self.max_memory_tokens:,} tokens, at most {self.max_memories} memories)"
        return f"{self.max_memory_tokens:,} tokens, at most {self.max_memories} memories"

    @property
    def profile_name(self) -> str:
        return f"quality-bench-{self.name}"


def parse_budget(text: str) -> Budget:
    """``default`` (the built-in profile's limits), ``N`` (N tokens, the default count
    cap) or ``NxM`` (N tokens, at most M memories)."""
    text = text.strip()
    if text == "default":
        return Budget("default", _DEFAULT.max_memory_tokens, _DEFAULT.max_memories)
    tokens, _, count = text.partition("x")
    try:
        max_tokens = int(tokens)
        max_memories = int(count) if count else _DEFAULT.max_memories
    except ValueError:
        raise ValueError(f"budget {text!r}: expected 'default', N or NxM") from None
    if max_tokens <= 0 or max_memories <= 0:
        raise ValueError(f"budget {text!r}: tokens and memories must be positive")
    return Budget(text, max_tokens, max_memories)


def parse_budgets(text: str) -> list[Budget]:
    budgets = [parse_budget(part) for part in text.split(",") if part.strip()]
    if not budgets:
        raise ValueError("no budget given")
    return budgets


def profile_entry(name: str, selector: Mapping[str, Any], budget: Budget | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "selector": dict(selector),
        "deadlines": {
            "assemblyMs": MAX_ASSEMBLY_MS,
            "directiveMs": SOURCE_MS,
            "hotMs": SOURCE_MS,
            "coldMs": SOURCE_MS,
        },
    }
    if budget is not None:
        entry["budget"] = {"maxMemoryTokens": budget.max_memory_tokens, "maxMemories": budget.max_memories}
    return entry


def profiles_document(agents_by_budget: Mapping[Budget, Sequence[str]], warm_up_agent: str) -> dict[str, Any]:
    """The profiles file: one profile per budget (its agents), one for the warm-up agent."""
    profiles = [
        profile_entry(budget.profile_name, {"agentIds": list(agents)}, budget)
        for budget, agents in agents_by_budget.items()
    ]
    profiles.append(profile_entry("quality-bench-warm-up", {"agentIds": [warm_up_agent]}, None))
    return {"apiVersion": "context.ibex.dev/v1alpha1", "kind": "ContextProfileSet", "profiles": profiles}


def profiles_json(agents_by_budget: Mapping[Budget, Sequence[str]], warm_up_agent: str) -> str:
    return json.dumps(profiles_document(agents_by_budget, warm_up_agent), indent=2)
