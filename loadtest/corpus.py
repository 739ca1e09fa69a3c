"""Plausible agent memories, directives, conversations and queries, generated from a seed.

Pure: a ``random.Random`` in, strings and numbers out. The same seed always gives
the same corpus, so load-test runs are comparable. Text is built from per-category
templates over a shared vocabulary of customers, people, systems and numbers, so
memories of one agent share entities (which makes semantic queries meaningful for
real embedders) while every memory stays unique (the store deduplicates by hash).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ibex_context.models import CATEGORY_ORDER

# The service's categories, in its order (the weights below follow it).
CATEGORIES: tuple[str, ...] = CATEGORY_ORDER
# Rough share of each category in an agent's memories.
CATEGORY_WEIGHTS: tuple[float, ...] = (0.2, 0.3, 0.2, 0.1, 0.2)

_CUSTOMERS = (
    "Acme Logistics",
    "Borealis Health",
    "Cobalt Retail",
    "Dunmore Bank",
    "Everline Energy",
    "Fjord Media",
    "Granite Insurance",
    "Helix Pharma",
    "Ironwood Foods",
    "Juniper Travel",
    "Kestrel Aerospace",
    "Lumen Education",
    "Meridian Telecom",
    "Northwind Traders",
    "Orchid Hotels",
    "Pioneer Freight",
)
_PEOPLE = (
    "Alice Moreau",
    "Bob Tanaka",
    "Priya Raman",
    "Chen Wei",
    "Omar Haddad",
    "Sofia Lindqvist",
    "Diego Alvarez",
    "Hannah Okafor",
    "Lukas Becker",
    "Mei Nakamura",
    "Ravi Patel",
    "Zoe Fischer",
    "Tomasz Nowak",
    "Aisha Bello",
)
_SYSTEMS = (
    "the billing service",
    "the orders API",
    "the Postgres primary",
    "the Redis cache",
    "the Kafka cluster",
    "the payments gateway",
    "the search index",
    "the CI pipeline",
    "the staging cluster",
    "the data warehouse",
    "the auth service",
    "the notification worker",
    "the reporting job",
    "the mobile backend",
)
_TASKS = (
    "deploying to production",
    "rotating API keys",
    "closing a support ticket",
    "issuing a refund",
    "onboarding a new customer",
    "running a database migration",
    "preparing the quarterly report",
    "escalating an incident",
    "renewing a contract",
    "changing a feature flag",
    "answering a billing question",
    "scheduling maintenance",
    "restoring a backup",
    "reviewing a pull request",
)
_STEPS = (
    "check the on-call calendar",
    "announce it in #ops",
    "take a snapshot",
    "get written approval from the owner",
    "verify the invoice total",
    "run the smoke tests",
    "confirm the customer's account id",
    "link the incident ticket",
    "update the runbook",
    "notify the account manager",
    "double-check the region",
    "read back the amount to the customer",
    "wait for the canary to stay green for 15 minutes",
)
_REASONS = (
    "because a skipped check caused an outage last spring",
    "since the auditors asked for a paper trail",
    "as the customer was charged twice once before",
    "because the replica lags behind during peak hours",
    "since the legal team reviews every exception",
    "because rollbacks take up to forty minutes",
    "as the finance team reconciles these every Friday",
)
_FORMATS = (
    "bullet points",
    "a short summary first",
    "tables",
    "plain prose",
    "code snippets in Python",
    "metric units",
    "ISO dates",
    "answers under five sentences",
    "links to the source documents",
    "a formal tone",
    "a casual tone",
    "step-by-step instructions",
)
_TOPICS = (
    "status updates",
    "incident reports",
    "pricing questions",
    "architecture reviews",
    "release notes",
    "budget forecasts",
    "customer emails",
    "meeting notes",
    "SQL questions",
    "on-call handovers",
)
_BEHAVIOURS = (
    "asks for the raw numbers after a summary",
    "pastes stack traces without context",
    "switches between English and German",
    "follows up within an hour",
    "prefers to approve changes in batches",
    "asks for a second opinion on security topics",
    "ignores long answers",
    "double-checks totals by hand",
)
_SITUATIONS = (
    "a deadline is close",
    "an incident is open",
    "the request comes from finance",
    "it is late in the day",
    "a customer is escalating",
    "the change touches billing",
    "the question is about a contract",
)
_OUTCOMES = (
    "the refund was approved",
    "the deploy was rolled back",
    "the customer renewed for two years",
    "the incident was closed as a configuration error",
    "the migration finished without downtime",
    "the quote was sent the same day",
    "the ticket was reassigned to the platform team",
    "the invoice was corrected and re-sent",
)
_PLANS = ("Starter", "Team", "Business", "Enterprise", "Enterprise Plus")
FILLER = (
    "This was confirmed in the follow-up call.",
    "The details are in the shared drive under the customer's folder.",
    "Keep this in mind for similar requests.",
    "Nobody objected when this was discussed in the weekly review.",
    "The same applies to the sandbox environment.",
    "It was noted by the support lead.",
    "The previous agent had missed this.",
    "There is a ticket tracking the long-term fix.",
)


def _date(rng: random.Random) -> str:
    return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _money(rng: random.Random) -> str:
    return f"${rng.randint(1, 250)},{rng.randint(0, 999):03d}.{rng.randint(0, 99):02d}"


def _ticket(rng: random.Random) -> str:
    return f"{rng.choice(('OPS', 'BILL', 'SUP', 'ENG', 'SEC'))}-{rng.randint(100, 99999)}"


def _procedural(rng: random.Random) -> str:
    return (
        f"When {rng.choice(_TASKS)} for {rng.choice(_CUSTOMERS)}, always {rng.choice(_STEPS)} before you "
        f"{rng.choice(_STEPS)}, {rng.choice(_REASONS)} (see {_ticket(rng)})."
    )


def _factual(rng: random.Random) -> str:
    customer, person = rng.choice(_CUSTOMERS), rng.choice(_PEOPLE)
    return rng.choice(
        (
            f"{customer} has been on the {rng.choice(_PLANS)} plan since {_date(rng)}; the account owner is "
            f"{person} and the annual contract value is {_money(rng)}.",
            f"{rng.choice(_SYSTEMS).capitalize()} for {customer} runs in eu-west-{rng.randint(1, 3)} with "
            f"{rng.randint(2, 48)} replicas; its p99 latency target is {rng.randint(20, 400)} ms.",
            f"{person} is the escalation contact for {customer}; the backup contact is "
            f"{rng.choice(_PEOPLE)} and the support SLA is {rng.randint(1, 24)} hours.",
            f"Invoice {rng.randint(10000, 99999)} for {customer} totals {_money(rng)} "
            f"and is due on {_date(rng)}.",
        )
    )


def _preference(rng: random.Random) -> str:
    return (
        f"{rng.choice(_PEOPLE)} prefers {rng.choice(_FORMATS)} over {rng.choice(_FORMATS)} for "
        f"{rng.choice(_TOPICS)}, and wants {rng.choice(_FORMATS)} when the topic is {rng.choice(_TOPICS)}."
    )


def _behavioral(rng: random.Random) -> str:
    return (
        f"When {rng.choice(_SITUATIONS)}, {rng.choice(_PEOPLE)} usually {rng.choice(_BEHAVIOURS)}; answer "
        f"with {rng.choice(_FORMATS)} and mention {rng.choice(_SYSTEMS)} explicitly."
    )


def _episodic(rng: random.Random) -> str:
    return (
        f"On {_date(rng)}, {rng.choice(_PEOPLE)} asked about {rng.choice(_TOPICS)} "
        f"for {rng.choice(_CUSTOMERS)} while {rng.choice(_TASKS)}; "
        f"after checking {rng.choice(_SYSTEMS)}, {rng.choice(_OUTCOMES)} "
        f"({_ticket(rng)})."
    )


_SENTENCE: dict[str, Callable[[random.Random], str]] = {
    "procedural": _procedural,
    "factual": _factual,
    "preference": _preference,
    "behavioral": _behavioral,
    "episodic": _episodic,
}


def target_tokens(rng: random.Random, low: int = 50, high: int = 400) -> int:
    """A memory length in tokens: log-normal around ~110, clipped to [low, high]."""
    return max(low, min(high, round(math.exp(rng.gauss(math.log(110), 0.55)))))


def memory_text(rng: random.Random, category: str, tokens: int) -> str:
    """One memory of about ``tokens`` tokens (~4.3 characters a token for this vocabulary)."""
    make = _SENTENCE[category]
    sentences = [make(rng)]
    chars = tokens * 4.3
    while sum(len(s) + 1 for s in sentences) < chars:
        sentences.append(make(rng) if rng.random() < 0.6 else rng.choice(FILLER))
    text = " ".join(sentences)
    # Trim at a word boundary so most memories land near their target length.
    if len(text) > chars * 1.15:
        cut = text.rfind(" ", 0, int(chars))
        text = text[: cut if cut > 0 else int(chars)].rstrip(",;") + "."
    return text


@dataclass(frozen=True, slots=True)
class MemorySpec:
    content: str
    category: str
    confidence: float
    usefulness: float
    retrieval_count: int
    # Seconds before "now" the memory was created / last injected (None: never).
    age_seconds: float
    last_injected_ago_seconds: float | None


YEAR_SECONDS = 365 * 24 * 3600.0


def memory_spec(rng: random.Random) -> MemorySpec:
    category = rng.choices(CATEGORIES, CATEGORY_WEIGHTS)[0]
    content = memory_text(rng, category, target_tokens(rng))
    retrieval_count = min(500, int(rng.paretovariate(1.3)) - 1) if rng.random() < 0.7 else 0
    age = rng.uniform(0, YEAR_SECONDS)
    injected = rng.uniform(0, age) if retrieval_count > 0 else None
    return MemorySpec(
        content=content,
        category=category,
        confidence=round(min(1.0, max(0.05, rng.betavariate(8, 2))), 3),
        usefulness=round(min(1.0, max(0.0, rng.betavariate(4, 4))), 3),
        retrieval_count=retrieval_count,
        age_seconds=age,
        last_injected_ago_seconds=injected,
    )


def directive_text(rng: random.Random) -> str:
    customer = rng.choice(_CUSTOMERS)
    return (
        f"You are the operations assistant for {customer}. Answer with {rng.choice(_FORMATS)}. "
        f"Never share invoice amounts with anyone but the account owner. Before {rng.choice(_TASKS)}, "
        f"{rng.choice(_STEPS)}. Escalate to {rng.choice(_PEOPLE)} when {rng.choice(_SITUATIONS)}. "
        "If you are unsure, say so and ask one clarifying question."
    )


def query_from_memory(rng: random.Random, memory: str) -> str:
    """A user question that should retrieve ``memory``: it reuses a span of its words."""
    words = memory.split()
    span = rng.randint(6, 12)
    start = rng.randrange(max(1, len(words) - span))
    fragment = " ".join(words[start : start + span]).strip(".,;()")
    opener = rng.choice(
        ("What do we know about", "Remind me about", "Can you check", "What was decided on", "Any notes on")
    )
    return f"{opener} {fragment}?"


def user_turn(rng: random.Random, chars: int) -> str:
    """A user or assistant turn of about ``chars`` characters."""
    parts: list[str] = []
    while sum(len(p) + 1 for p in parts) < chars:
        parts.append(_SENTENCE[rng.choice(CATEGORIES)](rng))
    return " ".join(parts)[: max(1, chars)]


def conversation(
    rng: random.Random, turns: int, last_user: str, turn_chars: tuple[int, int] = (80, 800)
) -> list[tuple[str, str]]:
    """``turns`` messages alternating user/assistant, ending with the user's ``last_user``."""
    turns = max(1, turns)
    messages: list[tuple[str, str]] = []
    for i in range(turns - 1):
        role = "user" if (turns - 1 - i) % 2 == 0 else "assistant"
        messages.append((role, user_turn(rng, rng.randint(*turn_chars))))
    messages.append(("user", last_user))
    return messages


def pick_weighted(rng: random.Random, items: Sequence[str], weights: Sequence[float]) -> str:
    return rng.choices(items, weights)[0]


# The words that make a load-test question unique (``loadtest.workload.unique_question``):
# each is one word piece of MiniLM's vocabulary (tests/loadtest/test_workload.py), so three
# of them add three pieces to a question, and 256 ** 3 tags tell 16.8 million asks of one
# question apart.
_TAG_VOCABULARY = """
    apple anchor arrow autumn badge bakery balcony banner barrel basket beacon berry blanket
    bottle bridge bucket butter cabin cable camera candle canvas canyon carpet castle cattle
    cellar chair chalk cherry chimney circle clock cloud coast coffee collar copper corner
    cotton county cradle crystal curtain cushion dagger desert diamond dinner dragon drawer
    eagle engine falcon feather fence ferry field finger flame flower forest fountain frame
    garden garlic glacier glove granite grape gravel guitar hammer harbour harvest helmet honey
    horizon island ivory jacket jungle kettle kitchen ladder lantern leather lemon library
    lighthouse linen lizard magnet mango marble market meadow mirror monkey mountain museum
    needle nickel oasis ocean olive onion orange orchard oyster paddle palace pencil pepper
    piano pillow pirate planet pocket pond potato powder prairie pumpkin puzzle quarry rabbit
    radio raven ribbon river rocket saddle salmon satellite scarf shadow shelter shovel silver
    sketch sleeve spider spoon statue stone storm stream sugar summit sunset tablet temple
    thunder ticket tiger timber tomato tower tractor trumpet tunnel turtle valley velvet village
    violin volcano wagon walnut whistle willow window winter wizard wolf wool yacht zebra bamboo
    bishop blossom bronze cactus carrot cedar cobra comet cricket crown dolphin fabric fossil
    galaxy goose hazel jasmine jewel knight lagoon lotus maple meteor moss nectar otter parrot
    pearl penguin pine plum quartz reef robin rose ruby sapphire shell sparrow spruce swan
    thistle wheat almond badger beetle bison breeze cavern cinnamon clover coral daisy dune elm
    fern fig flint frost heron iris lark lynx mint moth owl panda peach poppy reed sage seal
    slate tide trout vine
"""
TAG_WORDS: tuple[str, ...] = tuple(_TAG_VOCABULARY.split())


# The vocabulary of churn writes (``loadtest/soak``, ``benchmarks.churn_buffers``): a few
# words, so every write adds postings to the same words, the ones the churn's searches
# ask for (``benchmarks.churn_buffers``: "rocket garden violin").
CHURN_WORDS: tuple[str, ...] = (
    "garden",
    "invoice",
    "meeting",
    "rocket",
    "violin",
    "harbour",
    "ledger",
    "pottery",
    "marathon",
    "glacier",
    "recipe",
    "bicycle",
    "orchard",
    "lantern",
    "compass",
    "quarry",
    "saddle",
    "meadow",
    "anchor",
    "tundra",
    "falcon",
    "velvet",
)


def churn_words(rng: random.Random) -> str:
    """Twelve words of ``CHURN_WORDS``, drawn from ``rng``: a churn memory's text before its unique suffix."""
    return " ".join(rng.choice(CHURN_WORDS) for _ in range(12))
