"""The load test's agents, conversations and request mix, without locust or gevent.

``loadtest.locustfile`` sends these requests; ``benchmarks.call_cpu`` replays them in
process (importing the locustfile would monkey-patch that process with gevent).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from loadtest import corpus

SCENARIOS: tuple[str, ...] = (
    "new_session",
    "long_conversation",
    "constrained_model",
    "large_agent",
    "agent_loop",
    # A new session whose user pastes a long text (600-1,600 characters) before the question:
    # the query the embedder gets is long (off by default: --scenario-weights).
    "long_message",
)
DEFAULT_WEIGHTS = "new_session=5,long_conversation=3,constrained_model=1,large_agent=1"
# An agent loop's turn: the user's message, then this many tool calls (uniform, both ends
# included), each one more LLM call of the same session with the same last user message.
# Mean 4: 4 calls in 5 repeat a question the service has just embedded.
AGENT_LOOP_TOOL_CALLS = (0, 8)
# The request name of an agent loop's tool-call requests (its first request is "agent_loop").
TOOL_CALL = "agent_loop_tool_call"
_TOOLS = ("search_tickets", "get_account", "list_incidents", "read_runbook", "query_billing")


def parse_weights(text: str) -> dict[str, int]:
    weights: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in SCENARIOS:
            raise ValueError(f"--scenario-weights: unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
        weights[name] = int(value)
    if not any(weights.values()):
        raise ValueError("--scenario-weights: every weight is 0")
    return weights


class Workload:
    """Agents and prebuilt conversations, shared by every user of this process."""

    def __init__(self, agents_file: Path, seed: int, org_id: str | None = None) -> None:
        """``org_id``: only that org's agents (a tenant of the noisy-neighbour scenario)."""
        data = json.loads(agents_file.read_text())
        self.agents: list[dict[str, Any]] = [
            a for a in data["agents"] if a.get("queries") and org_id in (None, a["org_id"])
        ]
        if not self.agents:
            where = f" in org {org_id}" if org_id else ""
            raise ValueError(f"{agents_file}: no agents with queries{where}")
        by_size = sorted(self.agents, key=lambda a: -int(a.get("memories", 0)))
        largest = int(by_size[0].get("memories", 0))
        self.large_agents = [a for a in by_size if int(a.get("memories", 0)) == largest][
            : max(1, len(by_size) // 10)
        ]
        rng = random.Random(seed)
        self.histories = [self._history(rng, rng.randint(19, 49)) for _ in range(48)]
        self.short_histories = [self._history(rng, rng.randint(7, 15)) for _ in range(24)]
        self.system_prompts = [
            "You are a helpful assistant for the operations team. Be concise.",
            "You are a support agent. Answer politely and cite ticket numbers.",
            "You help engineers debug production issues. Prefer concrete steps.",
        ]

    @staticmethod
    def _history(rng: random.Random, turns: int) -> list[Any]:
        pairs = corpus.conversation(rng, turns + 1, "")[:-1]
        return [pb.Message(role=role, content=content) for role, content in pairs]


@dataclass(frozen=True, slots=True)
class Caller:
    """What one simulated caller sends with: its session and models."""

    session_id: str
    model: str = "gpt-4o"
    constrained_model: str = "gpt-4"
    # A random tag per question: no two calls share an embedding-cache entry.
    unique_questions: bool = True


def unique_question(rng: random.Random, question: str) -> str:
    """``question`` tagged with three random words, so that no two calls share an
    embedding-cache entry, at the cost of three word pieces: the query costs the service
    what the question would, give or take three pieces. (Until 2026-12-07 the tag was a hex
    reference of eleven pieces: the queries were 57 % longer than their questions, and their
    inference cost a fifth more than now; results/embedding-turns-2026-12-06.md §10.)"""
    return " ".join((question, *(corpus.TAG_WORDS[rng.randrange(len(corpus.TAG_WORDS))] for _ in range(3))))


def build_request(workload: Workload, caller: Caller, rng: random.Random, scenario: str) -> Any:
    """One AssembleContextRequest of ``scenario``, drawn with ``rng`` (of ``agent_loop``: the
    turn's first request; ``RequestMix`` sends its tool calls)."""
    agent = rng.choice(workload.large_agents if scenario == "large_agent" else workload.agents)
    req = pb.AssembleContextRequest(
        org_id=agent["org_id"],
        agent_id=agent["agent_id"],
        model=caller.constrained_model if scenario == "constrained_model" else caller.model,
        request_id=f"lt-{rng.getrandbits(64):016x}",
    )
    if scenario in ("new_session", "long_message"):
        if rng.random() < 0.5:
            req.messages.add(role="system", content=rng.choice(workload.system_prompts))
    else:
        req.session_id = caller.session_id
        history = rng.choice(
            workload.short_histories
            if scenario in ("constrained_model", "agent_loop")
            else workload.histories
        )
        req.messages.extend(history)
    question: str = rng.choice(agent["queries"])
    if caller.unique_questions:
        question = unique_question(rng, question)
    if scenario == "long_message":
        question = f"{corpus.user_turn(rng, rng.randint(600, 1600))}\n\n{question}"
    req.messages.add(role="user", content=question)
    return req


def tool_call_request(previous: Any, rng: random.Random) -> Any:
    """The next LLM call of an agent loop's turn: ``previous`` with the model's tool call
    (an assistant message) and the tool's result appended; same session, same last user
    message, a new request id."""
    req = pb.AssembleContextRequest()
    req.CopyFrom(previous)
    req.request_id = f"lt-{rng.getrandbits(64):016x}"
    tool = rng.choice(_TOOLS)
    req.messages.add(role="assistant", content=f'{tool}({{"ref": "{rng.getrandbits(32):08x}"}})')
    req.messages.add(role="tool", content=corpus.user_turn(rng, rng.randint(200, 1500)))
    return req


class RequestMix:
    """What one caller sends next: a scenario drawn by weight per call, except that an
    agent loop's turn, once started, sends its tool calls before anything else."""

    def __init__(
        self, workload: Workload, caller: Caller, rng: random.Random, weights: dict[str, int]
    ) -> None:
        self._workload = workload
        self._caller = caller
        self._rng = rng
        self._scenarios = [name for name in SCENARIOS if weights.get(name)]
        self._weights = [weights[name] for name in self._scenarios]
        self._turn: Any = None
        self._tool_calls_left = 0

    def next(self) -> tuple[str, Any]:
        """(request name, request): the name is the scenario, or ``TOOL_CALL``."""
        rng = self._rng
        if self._tool_calls_left > 0:
            self._tool_calls_left -= 1
            self._turn = tool_call_request(self._turn, rng)
            return TOOL_CALL, self._turn
        scenario = rng.choices(self._scenarios, self._weights)[0]
        req = build_request(self._workload, self._caller, rng, scenario)
        if scenario == "agent_loop":
            self._turn = req
            self._tool_calls_left = rng.randint(*AGENT_LOOP_TOOL_CALLS)
        return scenario, req
