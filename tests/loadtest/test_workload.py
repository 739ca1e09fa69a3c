"""The load test's request mix: the agent loop's turns (a question, then 0-8 tool calls that
repeat it in the same session) and the weights that choose what a caller sends next."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ibex_context.embedding.minilm_reference import default_model_dir, load_tokenizer

from loadtest import corpus
from loadtest.workload import (
    AGENT_LOOP_TOOL_CALLS,
    TOOL_CALL,
    Caller,
    RequestMix,
    Workload,
    parse_weights,
    unique_question,
)

SESSION = "6f1c2a8e-0d3b-4c5e-9f7a-1b2c3d4e5f60"


@pytest.fixture(scope="module")
def agents_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    agents = [
        {
            "org_id": f"org-{i}",
            "agent_id": f"agent-{i}",
            "memories": 100 if i else 1000,
            "queries": [f"What do we know about the Acme renewal {i}-{q}?" for q in range(3)],
        }
        for i in range(4)
    ]
    path = tmp_path_factory.mktemp("workload") / "agents.json"
    path.write_text(json.dumps({"agents": agents}))
    return path


@pytest.fixture(scope="module")
def workload(agents_file: Path) -> Workload:
    return Workload(agents_file, seed=7)


def test_a_tenants_workload_calls_only_its_own_orgs_agents(agents_file: Path) -> None:
    tenant = Workload(agents_file, seed=7, org_id="org-2")
    mix = RequestMix(tenant, Caller(session_id=SESSION), random.Random(3), parse_weights("new_session=1"))
    assert {mix.next()[1].org_id for _ in range(50)} == {"org-2"}
    with pytest.raises(ValueError, match="no agents with queries in org org-9"):
        Workload(agents_file, seed=7, org_id="org-9")


def calls(workload: Workload, weights: str, n: int, seed: int = 1) -> list[tuple[str, Any]]:
    mix = RequestMix(workload, Caller(session_id=SESSION), random.Random(seed), parse_weights(weights))
    return [mix.next() for _ in range(n)]


def turns(sent: list[tuple[str, Any]]) -> list[list[Any]]:
    """The agent-loop calls grouped by turn: its first request, then its tool calls."""
    grouped: list[list[Any]] = []
    for name, req in sent:
        if name == "agent_loop":
            grouped.append([req])
        else:
            assert name == TOOL_CALL
            grouped[-1].append(req)
    return grouped


def last_user(req: Any) -> str:
    return str(next(m.content for m in reversed(req.messages) if m.role == "user"))


def test_every_tool_call_carries_its_turns_question_in_the_same_session_for_the_same_agent(
    workload: Workload,
) -> None:
    for turn in turns(calls(workload, "agent_loop=1", 300)):
        first = turn[0]
        assert first.messages[-1].role == "user"
        for req in turn[1:]:
            assert last_user(req) == last_user(first)
            assert (req.org_id, req.agent_id, req.model) == (first.org_id, first.agent_id, first.model)
            assert req.session_id == first.session_id == SESSION


def test_each_tool_call_appends_the_models_call_and_the_tools_result_to_the_previous_request(
    workload: Workload,
) -> None:
    for turn in turns(calls(workload, "agent_loop=1", 300)):
        for previous, req in itertools.pairwise(turn):
            assert list(req.messages[: len(previous.messages)]) == list(previous.messages)
            assert [m.role for m in req.messages[len(previous.messages) :]] == ["assistant", "tool"]
            assert req.request_id != previous.request_id


def test_a_turn_makes_zero_to_eight_tool_calls_uniformly(workload: Workload) -> None:
    sent = calls(workload, "agent_loop=1", 5000)
    counts = Counter(len(turn) - 1 for turn in turns(sent)[:-1])  # the last turn may be cut short
    low, high = AGENT_LOOP_TOOL_CALLS
    assert (low, high) == (0, 8)
    assert set(counts) == set(range(low, high + 1))
    expected = sum(counts.values()) / (high - low + 1)
    assert all(0.7 * expected < c < 1.3 * expected for c in counts.values()), counts
    # Mean 4 tool calls a turn: 4 calls in 5 repeat a question already embedded.
    tool_calls = sum(1 for name, _ in sent if name == TOOL_CALL)
    assert 0.75 < tool_calls / len(sent) < 0.85


def test_each_turn_asks_a_new_question(workload: Workload) -> None:
    questions = [last_user(turn[0]) for turn in turns(calls(workload, "agent_loop=1", 500))]
    assert len(set(questions)) == len(questions)


def test_a_started_turn_finishes_its_tool_calls_before_another_scenario_is_drawn(
    workload: Workload,
) -> None:
    sent = calls(workload, "new_session=1,agent_loop=1", 2000)
    names = Counter(name for name, _ in sent)
    assert names["new_session"] and names["agent_loop"] and names[TOOL_CALL]
    for (name, _), (after, _) in itertools.pairwise(sent):
        if after == TOOL_CALL:
            assert name in ("agent_loop", TOOL_CALL)
    for turn in turns([(n, r) for n, r in sent if n in ("agent_loop", TOOL_CALL)]):
        assert len({last_user(req) for req in turn}) == 1


def test_the_default_mix_sends_no_agent_loop(workload: Workload) -> None:
    names = {
        name
        for name, _ in calls(
            workload, "new_session=5,long_conversation=3,constrained_model=1,large_agent=1", 500
        )
    }
    assert names == {"new_session", "long_conversation", "constrained_model", "large_agent"}


def test_an_unknown_scenario_in_the_weights_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="agent_loops"):
        parse_weights("agent_loops=1")


def test_a_long_message_pastes_a_long_text_before_its_question_in_a_new_session(workload: Workload) -> None:
    from loadtest.workload import build_request

    rng = random.Random(3)
    for _ in range(20):
        request = build_request(workload, Caller(SESSION), rng, "long_message")
        last = request.messages[-1]
        text, _, question = last.content.rpartition("\n\n")
        assert last.role == "user" and 600 <= len(text) <= 1700
        assert question.startswith("What do we know about the Acme renewal")
        assert request.session_id == ""


def test_the_default_mix_sends_no_long_message(workload: Workload) -> None:
    from loadtest.workload import DEFAULT_WEIGHTS

    assert "long_message" not in parse_weights(DEFAULT_WEIGHTS)


def test_a_unique_question_costs_the_embedder_three_word_pieces_more_than_the_question() -> None:
    tokenizer = load_tokenizer(default_model_dir())
    assert len(set(corpus.TAG_WORDS)) == len(corpus.TAG_WORDS) == 256
    assert all(len(tokenizer.encode(word, add_special_tokens=False).ids) == 1 for word in corpus.TAG_WORDS)
    rng = random.Random(11)
    for memory in (corpus.memory_text(rng, category, 120) for category in corpus.CATEGORIES * 20):
        question = corpus.query_from_memory(rng, memory)
        asked = unique_question(rng, question)
        assert asked.startswith(question)
        assert len(tokenizer.encode(asked).ids) == len(tokenizer.encode(question).ids) + 3


def test_the_same_question_asked_a_thousand_times_is_never_the_same_text_twice() -> None:
    rng = random.Random(5)
    question = "What do we know about the Acme renewal?"
    assert len({unique_question(rng, question) for _ in range(1000)}) == 1000
