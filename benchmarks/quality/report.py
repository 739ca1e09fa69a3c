"""The results: a Markdown report, a JSON file of per-question figures (no text of
the data set: conversation id, question position, category and counts only), and a
short summary for the terminal."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.quality.locomo import CATEGORY_LABELS, Conversation
from benchmarks.quality.metrics import Outcome, Summary, concentration, summarise
from benchmarks.quality.run import CONTENT_ONLY, SERVICE, BudgetRun, methods, served_over
from benchmarks.quality.served import Served

FRAMED_METHODS = ("service", "cosine", "bm25", "hybrid")


@dataclass(frozen=True, slots=True)
class Setup:
    data_path: str
    data_sha256: str
    conversations: Sequence[Conversation]
    duplicate_turns: int
    embedder: str
    memory_embeddings: str
    machine: str
    started_utc: str
    seconds: float
    service: str
    command: str
    note: str = ""
    # Warm: each question's embedding computed before it was asked (not what users get).
    warm: bool = False
    # Cold, with the benchmark's own service: a new process per budget (no cached questions).
    fresh_service_per_budget: bool = False


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f} %"


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _by_category(outcomes: Sequence[Outcome]) -> dict[int, list[Outcome]]:
    grouped: dict[int, list[Outcome]] = {c: [] for c in CATEGORY_LABELS}
    for o in outcomes:
        grouped.setdefault(o.category, []).append(o)
    return grouped


def _summary_row(name: str, s: Summary, concentration_share: float | None = None) -> str:
    cells = [
        name,
        str(s.questions),
        _pct(s.recall_micro),
        _pct(s.recall_macro),
        _pct(s.full_hit),
        f"{s.mean_injected:.1f}",
        f"{s.mean_tokens:.0f}",
        _ms(s.latency_p50_ms),
        _ms(s.latency_p99_ms),
    ]
    if concentration_share is not None:
        cells.append(_pct(concentration_share))
    return "| " + " | ".join(cells) + " |"


def _budget_section(run: BudgetRun) -> list[str]:
    lines = [f"## Budget: {run.budget.label}", ""]
    header = (
        "| method | questions | recall (micro) | recall (macro) | full hit | memories | tokens"
        " | p50 ms | p99 ms | top-10 concentration |"
    )
    lines += [
        "All categories. Tokens: what the injected memories cost in the prompt (service:"
        " `metadata.tokens.memory_tokens_used`; baselines: the same framing, rendered by the"
        ' service\'s formatter and counted exactly; "content tokens" rows: content alone).',
        "",
        header,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for method in methods():
        outcomes = run.outcomes[method]
        lines.append(_summary_row(method, summarise(outcomes), concentration(outcomes)))
    lines += ["", "Recall (micro) per category:", ""]
    categories = [f"{c} {label}" for c, label in CATEGORY_LABELS.items()]
    lines.append("| method | " + " | ".join(categories) + " |")
    lines.append("|---|" + "---:|" * len(categories))
    for method in methods():
        grouped = _by_category(run.outcomes[method])
        cells = []
        for c in CATEGORY_LABELS:
            s = summarise(grouped[c])
            cells.append(f"{_pct(s.recall_micro)} (full {_pct(s.full_hit)})")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Questions per category: "
        + ", ".join(
            f"{c} {label}: {len(_by_category(run.outcomes[SERVICE])[c])}"
            for c, label in CATEGORY_LABELS.items()
        )
        + ".",
    ]
    degraded = sum(run.degradations.values())
    lines += [
        "",
        f"Service: profile(s) applied {dict(run.profiles_seen)}; memory budget(s) reported"
        f" {dict(run.memory_budgets_seen)}; degraded answers: {degraded}"
        + (f" ({dict(run.degradations)})" if degraded else "")
        + f"; warm-up failures: {run.warm_up_failures}; baseline packing repairs: {run.packing_repairs};"
        f" {_costing_check(run.costing_differences)}; questions costed with a random nonce (no"
        f" answer had shown the service's yet): {run.costed_without_service_nonce};"
        f" {run.seconds:.0f} s for this budget.",
        "",
    ]
    return lines


def _asking(setup: Setup) -> str:
    if setup.warm:
        return (
            "WARM mode (`--warm`): before its first call a question is asked of a memoryless warm-up"
            " agent until the service has its query embedding cached, and the real call has a 2 s"
            " deadline: round trips are those of a cached query embedding, not what users are served."
        )
    fresh = (
        "a new service process per budget, so no budget finds a question another one asked"
        if setup.fresh_service_per_budget
        else "one service for every budget (`--target`): only the first budget's questions are new to"
        " its query-embedding cache"
    )
    return (
        "Each question is asked once, cold (no warm-up: the service embeds it within the call), with"
        f" the proxy's 45 ms as the call's gRPC deadline; {fresh}; the client's connection is opened"
        " first by one uncounted call of a memoryless agent with a fixed text, as a proxy's is"
        " long-lived."
    )


def _served_row(name: str, served: Served) -> str:
    levels = ", ".join(f"{level} {n}" for level, n in served.levels.items())
    reasons = ", ".join(f"{reason} {n}" for reason, n in served.reasons.items()) or "none"
    return (
        f"| {name} | {served.answers} | {100 * served.full_share:.1f} % | {levels} | {reasons} |"
        f" {_ms(served.p50_ms)} | {_ms(served.p99_ms)} | {_ms(served.max_ms)} |"
    )


def _served_section(setup: Setup, runs: Sequence[BudgetRun]) -> list[str]:
    mode = "warm (`--warm`: query embeddings computed beforehand)" if setup.warm else "cold, under 45 ms"
    return [
        f"## As served ({mode})",
        "",
        "Each answer's degradation level (FULL: everything retrieved in time; no answer: the call"
        " passed its deadline and the caller sent its messages unchanged), the reasons the service"
        " gave, and the round trip as the benchmark's client measured it.",
        "",
        "| budget | answers | FULL | levels | reasons | round trip p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---|---|---:|---:|---:|",
        *(_served_row(run.budget.label, run.served()) for run in runs),
        _served_row("all budgets", served_over(runs)),
        "",
    ]


def _costing_check(differences: Sequence[int]) -> str:
    if not differences:
        return "costing check: no answer to compare"
    mean = sum(differences) / len(differences)
    spread = f"{min(differences)}..{max(differences)}"
    return (
        f"costing check (service's memory tokens minus the baselines' cost of the same set):"
        f" mean {mean:+.1f}, range {spread} tokens"
    )


def _headline(runs: Sequence[BudgetRun]) -> list[str]:
    lines = [
        "| budget | " + " | ".join(f"{m} recall / full hit / conc." for m in FRAMED_METHODS) + " |",
        "|---|" + "---:|" * len(FRAMED_METHODS),
    ]
    for run in runs:
        cells = []
        for method in FRAMED_METHODS:
            outcomes = run.outcomes[method]
            s = summarise(outcomes)
            cells.append(f"{_pct(s.recall_micro)} / {_pct(s.full_hit)} / {_pct(concentration(outcomes))}")
        lines.append(f"| {run.budget.label} | " + " | ".join(cells) + " |")
    return lines


def markdown(setup: Setup, runs: Sequence[BudgetRun]) -> str:
    questions = sum(len(c.questions) for c in setup.conversations)
    turns = sum(len(c.turns) for c in setup.conversations)
    reports = [c.evidence_report for c in setup.conversations]
    lines = [
        f"# Retrieval quality on LoCoMo ({setup.started_utc[:10]})",
        "",
        *([setup.note, ""] if setup.note else []),
        "Share of the annotated evidence turns each method injects, at each budget. Written by"
        f" `{setup.command}`.",
        "",
        "Categories: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop (labels by content, as the"
        " data's README reads them; other scripts swap 1 and 4). Category 5 (adversarial) is not asked.",
        "",
        *_served_section(setup, runs),
        "## Summary (recall micro / full-hit rate / top-10 concentration)",
        "",
        *_headline(runs),
        "",
        "Concentration: per conversation, the share of injected slots taken by its 10 most-injected"
        " memories, averaged over conversations (service: the replay with its injection counters on).",
        "",
    ]
    for run in runs:
        lines += _budget_section(run)
    lines += [
        "## Setup",
        "",
        f"- Data: `{setup.data_path}`, sha256 `{setup.data_sha256}` (CC BY-NC 4.0; not in this repository).",
        f"- Conversations: {', '.join(c.sample_id for c in setup.conversations)}; {turns} turns stored as"
        f" one memory each ({setup.duplicate_turns} turns shared a memory with an identical one).",
        f"- Questions asked: {questions} (categories 1-4 with evidence) of"
        f" {sum(r.questions_total for r in reports)}; category 5:"
        f" {sum(r.questions_other_category for r in reports)}; skipped for want of parseable evidence:"
        f" {sum(r.questions_without_evidence for r in reports)}; evidence ids repaired (malformed):"
        f" {sum(r.ids_repaired for r in reports)}; evidence ids naming no turn (dropped):"
        f" {sum(r.ids_unknown for r in reports)}.",
        '- Memories: content `"{speaker}: {text}"` (plus `[shares a photo of …]` from the image caption),'
        ' category `episodic`, `occurred_at` = the session\'s date (UTC), metadata `{"dia_id": …}`;'
        " fresh org and agent per conversation and per budget (so one budget's injection counters"
        " never reach another's), written with `MemoryClient.upsert_memories`.",
        f"- Embedder: {setup.embedder}; memory embeddings: {setup.memory_embeddings}.",
        "- Service: " + setup.service,
        "- Asking: each question is the single user message of `AssembleContext` (model `gpt-4o`), in"
        " conversation order; injected memories are read from `metadata.memories[*].id`. " + _asking(setup),
        "- Baselines (same memories, same budget, computed in the benchmark): cosine top-k (MiniLM,"
        " `ibex_context.embedding.minilm`), BM25 (Okapi k1 = 1.2, b = 0.75, lowercase words, English"
        " stop words removed; memories sharing no word with the question are not ranked), hybrid ="
        " reciprocal rank fusion of both (k = 60). Packing: ranking order, a memory that does not fit is"
        " skipped, stop at the count cap. Cost: the set rendered by the service's own formatter"
        " (`format_context`, xml, one injected system message, the session's nonce as read from the"
        " service's answers, the ids the service gave the memories) and counted with the service's"
        ' tokenizer (`o200k_base`) as the service counts its budget; "content tokens" rows cost'
        " content alone.",
        f"- Machine: {setup.machine}. Started {setup.started_utc}; took {setup.seconds:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def results_json(setup: Setup, runs: Sequence[BudgetRun]) -> str:
    document: dict[str, Any] = {
        "mode": "warm" if setup.warm else "cold",
        "data_sha256": setup.data_sha256,
        "conversations": [c.sample_id for c in setup.conversations],
        "embedder": setup.embedder,
        "machine": setup.machine,
        "started_utc": setup.started_utc,
        "seconds": round(setup.seconds, 1),
        "categories": {str(k): v for k, v in CATEGORY_LABELS.items()},
        "budgets": [],
    }
    for run in runs:
        entry: dict[str, Any] = {
            "name": run.budget.name,
            "max_memory_tokens": run.budget.max_memory_tokens,
            "max_memories": run.budget.max_memories,
            "service_degraded": dict(run.degradations),
            "service_levels": dict(run.levels),
            "service_reasons": dict(run.reasons),
            "warm_up_failures": run.warm_up_failures,
            "summary": {},
            "questions": {},
        }
        for method in methods():
            outcomes = run.outcomes[method]
            summary = asdict(summarise(outcomes))
            summary["concentration_top10"] = concentration(outcomes)
            entry["summary"][method] = summary
            if method in FRAMED_METHODS:
                entry["questions"][method] = _question_rows(outcomes)
        document["budgets"].append(entry)
    document["question_rows"] = "per method (baselines costed with the framing), per conversation"
    document["question_fields"] = [
        "question (position in its qa list)",
        "category",
        "evidence turns",
        "evidence turns injected",
        "memories injected",
        "tokens",
        "round trip ms (service)",
        "degraded (service)",
    ]
    return json.dumps(_finite(document), separators=(",", ":"), allow_nan=False)


def _question_rows(outcomes: Sequence[Outcome]) -> dict[str, list[list[float | int]]]:
    rows: dict[str, list[list[float | int]]] = {}
    for o in outcomes:
        row: list[float | int] = [o.question, o.category, o.evidence, o.hits, o.injected, o.tokens]
        if o.latency_ms is not None:
            row += [round(o.latency_ms, 2), int(o.degraded)]
        rows.setdefault(o.conversation, []).append(row)
    return rows


def _finite(value: Any) -> Any:
    """NaN (a figure over no questions) as null: JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def terminal_summary(runs: Sequence[BudgetRun]) -> str:
    lines = []
    for run in runs:
        parts = []
        for method in [*FRAMED_METHODS, *(m + CONTENT_ONLY for m in FRAMED_METHODS[1:])]:
            s = summarise(run.outcomes[method])
            parts.append(f"{method} {_pct(s.recall_micro)}")
        served = run.served()
        lines.append(
            f"{run.budget.label}: " + ", ".join(parts) + f"; service {100 * served.full_share:.1f} % FULL,"
            f" round trip p50 {_ms(served.p50_ms)} / p99 {_ms(served.p99_ms)} ms"
        )
    return "\n".join(lines)
