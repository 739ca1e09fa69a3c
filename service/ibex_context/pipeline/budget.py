"""How many tokens the memories may take in one request.

window = messages + directive + response reserve + safety buffer + memories

* Response reserve: 15 % of the window, clamped to [500, 4096], never above the
  model's max output (``BudgetLimits.response_reserve_tokens`` overrides).
* Safety buffer: 2 % of the window when every count is exact, 10 % when any is
  approximate (``BudgetLimits.safety_buffer_ratio`` overrides).
* The directive is reserved in full; memories get what is left, capped by
  ``BudgetLimits.max_memory_tokens``.

Percentages are rounded up: a token too many reserved costs one memory token,
one too few can overflow the window. See docs/adr/0002-assembly-pipeline.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ibex_context.profiles.model import BudgetLimits, ModelSpec

RESPONSE_RESERVE_RATIO = 0.15
RESPONSE_RESERVE_MIN = 500
RESPONSE_RESERVE_MAX = 4096
SAFETY_BUFFER_RATIO_EXACT = 0.02
SAFETY_BUFFER_RATIO_APPROXIMATE = 0.10
# Below this many memory tokens the window (not the profile's cap) is tight; the
# assembler then skips the cold search, whose results could not fit anyway.
IS_CONSTRAINED_BELOW = 1000


@dataclass(frozen=True, slots=True)
class TokenBudget:
    model: ModelSpec
    encoding: str
    exact: bool
    approximation_reason: str
    context_window: int
    messages_tokens: int
    directive_tokens: int
    response_reserve: int
    safety_buffer: int
    memory_budget: int
    is_constrained: bool
    # What the window leaves for memories before the profile's cap (may be < 0).
    window_remaining: int = 0


def response_reserve(model: ModelSpec, limits: BudgetLimits) -> int:
    if limits.response_reserve_tokens is not None:
        return limits.response_reserve_tokens
    share = math.ceil(model.context_window * RESPONSE_RESERVE_RATIO)
    clamped = min(max(share, RESPONSE_RESERVE_MIN), RESPONSE_RESERVE_MAX)
    return min(clamped, model.max_output_tokens)


def safety_buffer(model: ModelSpec, limits: BudgetLimits, *, exact: bool) -> int:
    if limits.safety_buffer_ratio is not None:
        ratio = limits.safety_buffer_ratio
    else:
        ratio = SAFETY_BUFFER_RATIO_EXACT if exact else SAFETY_BUFFER_RATIO_APPROXIMATE
    # round() first so 0.02 * 128000 is 2560, not ceil(2560.0000000000005) = 2561.
    return math.ceil(round(model.context_window * ratio, 6))


def compute_budget(
    model: ModelSpec,
    *,
    messages_tokens: int,
    directive_tokens: int,
    limits: BudgetLimits,
    exact: bool,
    approximation_reason: str = "",
) -> TokenBudget:
    """The budget for one request; pure arithmetic, no I/O.

    ``exact`` says whether the counts were exact; it is combined with the
    model's own ``exact`` (a model whose tokenizer is only approximated is
    never treated as exact).
    """
    if messages_tokens < 0:
        raise ValueError("messages_tokens must be >= 0")
    if directive_tokens < 0:
        raise ValueError("directive_tokens must be >= 0")
    effective_exact = exact and model.exact
    reason = approximation_reason
    if not effective_exact and not reason:
        reason = (
            f"{model.name} is counted with {model.encoding}, an approximation of its tokenizer"
            if not model.exact
            else "token counts are approximate"
        )
    if effective_exact:
        reason = ""
    reserve = response_reserve(model, limits)
    safety = safety_buffer(model, limits, exact=effective_exact)
    remaining = model.context_window - messages_tokens - directive_tokens - reserve - safety
    memory_budget = max(0, min(limits.max_memory_tokens, remaining))
    # Constrained means the window, not the profile's cap, is what limits memories:
    # a profile that caps memories at 500 tokens is not "constrained".
    is_constrained = memory_budget < min(IS_CONSTRAINED_BELOW, limits.max_memory_tokens)
    return TokenBudget(
        model=model,
        encoding=model.encoding,
        exact=effective_exact,
        approximation_reason=reason,
        context_window=model.context_window,
        messages_tokens=messages_tokens,
        directive_tokens=directive_tokens,
        response_reserve=reserve,
        safety_buffer=safety,
        memory_budget=memory_budget,
        is_constrained=is_constrained,
        window_remaining=remaining,
    )


def with_directive(budget: TokenBudget, directive_tokens: int, limits: BudgetLimits) -> TokenBudget:
    """``budget`` (computed before the directive arrived, with none reserved) once the
    directive's ``directive_tokens`` are known: the same model, messages and exactness,
    the directive reserved in full."""
    return compute_budget(
        budget.model,
        messages_tokens=budget.messages_tokens,
        directive_tokens=directive_tokens,
        limits=limits,
        exact=budget.exact,
        approximation_reason=budget.approximation_reason,
    )
