"""The compose step: what arrived from the stores in, the injected messages out.

Pure (no I/O, no clock): rank the candidates (``candidates.Candidates``,
the stores' columns; ``scoring.rank``: no per-candidate objects), lay the directive
out alone and count it (``directive_only``: the budget left with it reserved), cost
the candidates the packer reaches (``layout.BlockCosts``: a lookup of the block counts
stored at write time), walk them in rank order into the budget
(``packing.pack_ranked``), and only then build objects, for the chosen memories: lay
the injection out once (``layout.lay_out``), count it exactly and render the messages
from that one value. Its ``Composition`` (``pipeline.assembly``) is what the call
injected: the assembler times the step and keeps the composition whole in the call's
``Assembly``. The assembler's fallback injects ``directive_only`` as the compose step
would.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ibex_context.candidates import Candidates
from ibex_context.models import ChatMessage, FloatVector
from ibex_context.pipeline.assembly import Composition
from ibex_context.pipeline.budget import TokenBudget, with_directive
from ibex_context.pipeline.layout import BlockCosts, Injection, lay_out, section_overhead
from ibex_context.pipeline.packing import pack_ranked
from ibex_context.pipeline.scoring import rank
from ibex_context.profiles.model import Profile
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import Encoding


@dataclass(frozen=True, slots=True)
class ComposeInput:
    messages: tuple[ChatMessage, ...]
    directive: str | None
    candidates: Candidates
    query_embedding: FloatVector | None
    # The lexical search answered: a candidate without a BM25 score shares no word
    # with the query.
    lexical_searched: bool
    profile: Profile
    encoding: Encoding
    # The budget before the directive was known (``directive_only`` reserves it).
    budget: TokenBudget
    nonce: str
    now: float


@dataclass(frozen=True, slots=True)
class DirectiveOnly:
    """The directive laid out alone (no memory), its exact tokens, and the budget with
    them reserved."""

    injection: Injection
    tokens: int
    budget: TokenBudget


def directive_only(
    messages: Sequence[ChatMessage],
    directive: str | None,
    *,
    profile: Profile,
    nonce: str,
    encoding: Encoding,
    budget: TokenBudget,
    counter: MessageTokenCounter,
) -> DirectiveOnly:
    """The injection of ``directive`` alone into ``messages`` (nothing without one) and
    the budget it leaves: ``budget``, computed before the directive was known, with the
    directive's exact tokens reserved."""
    injection = lay_out(
        messages,
        directive=directive,
        memories=(),
        fmt=profile.format,
        mode=profile.injection_mode,
        nonce=nonce,
    )
    tokens = injection.tokens(encoding, counter)
    return DirectiveOnly(injection, tokens, with_directive(budget, tokens, profile.budget))


def compose(given: ComposeInput, counter: MessageTokenCounter) -> Composition:
    profile, encoding, nonce = given.profile, given.encoding, given.nonce
    fmt, mode = profile.format, profile.injection_mode
    t0 = time.perf_counter_ns()
    ranking = rank(
        given.candidates,
        given.query_embedding,
        profile.scoring,
        now=given.now,
        lexical_searched=given.lexical_searched,
    )
    t1 = time.perf_counter_ns()

    alone = directive_only(
        given.messages,
        given.directive,
        profile=profile,
        nonce=nonce,
        encoding=encoding,
        budget=given.budget,
        counter=counter,
    )
    directive_tokens, budget = alone.tokens, alone.budget
    if given.directive is not None and budget.window_remaining < 0:
        # The directive would push the prompt into the response reserve (or past the
        # window): inject nothing rather than a prompt the model cannot answer.
        return Composition(
            given.messages,
            memories_available=len(ranking),
            budget=budget,
            directive_exceeds_window=True,
            marks=(t0, t1, t1, t1),
        )

    candidates = ranking.candidates
    categories = candidates.categories
    # The notice and category sections cost tokens too; an upper bound for the kept
    # candidates' categories keeps the exact repair below a rare event.
    overhead = (
        section_overhead(
            encoding,
            fmt,
            nonce=nonce,
            categories={categories[i] for i in ranking.order},
            include_message_framing=not given.directive,
            counter=counter,
        )
        if ranking.order
        else 0
    )
    packed = pack_ranked(
        ranking.order,
        BlockCosts(encoding, fmt, counter).by_index(candidates),
        max(0, budget.memory_budget - overhead),
        max_items=profile.budget.max_memories,
    )
    selected = ranking.scored_at(packed.chosen, packed.costs)
    t2 = time.perf_counter_ns()

    injection, injected_tokens = alone.injection, directive_tokens
    was_truncated = packed.was_truncated
    while selected:
        injection = lay_out(
            given.messages, directive=given.directive, memories=selected, fmt=fmt, mode=mode, nonce=nonce
        )
        injected_tokens = injection.tokens(encoding, counter)
        # The packer works on per-memory costs; the exact count of the whole injected
        # text is the one that must fit. Drop the weakest until it does (each drop
        # moves handles, so the text is laid out again: a rare event).
        if injected_tokens <= directive_tokens + budget.memory_budget:
            break
        selected.pop()
        was_truncated = True
    if not selected:
        injection, injected_tokens = alone.injection, directive_tokens
    messages = injection.messages(given.messages)
    t3 = time.perf_counter_ns()
    injected = bool(injection.chunks)
    return Composition(
        messages=messages,
        directive_injected=given.directive is not None and injected,
        memories=tuple(selected),
        handles=tuple(injection.handles[m.memory.id] for m in selected),
        memories_available=len(ranking),
        tokens_injected=injected_tokens if injected else 0,
        memory_tokens=max(0, injected_tokens - directive_tokens) if selected else 0,
        was_truncated=was_truncated,
        budget=budget,
        directive_exceeds_window=False,
        marks=(t0, t1, t2, t3),
    )
