"""Metrics: derived from each call's Assembly, scraped over HTTP after real calls."""

from __future__ import annotations

from ibex_context.devtools import scripted_service as scripted
from ibex_context.embedding.batching import EmbeddingTurn
from ibex_context.models import ChatMessage, Degradation
from ibex_context.observability.metrics import (
    ADMISSION_LIMITS,
    KNOWN_REASONS,
    OTHER,
    Metrics,
    normalise_reason,
)
from ibex_context.pipeline.outcome import (
    STAGES,
    STAND_IN_DETAIL,
    Outcome,
    Reason,
    SourceResult,
    SourceStatus,
    StageSpan,
    plan_detail,
)
from ibex_context.stores.postgres.graphs import GraphBuildTiming
from ibex_context.stores.postgres.read_routing import ReplicaStatus
from ibex_context_client import ContextClient
from prometheus_client import CollectorRegistry

from tests.observability.harness import Observed, sample
from tests.pipeline.assemblies import a_budget, an_assembly

MESSAGES = [ChatMessage("user", "What do I like to drink?")]
ASSEMBLE = {
    "grpc_type": "unary",
    "grpc_service": "ibex.context.v1.ContextAssemblyService",
    "grpc_method": "AssembleContext",
}


async def call(client: ContextClient, model: str) -> None:
    await client.assemble(org_id="org", agent_id="agent", model=model, messages=MESSAGES)


def values(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in metrics.registry.collect()
        for s in family.samples
    }


# --- derived from the assembly -----------------------------------------------------------


def test_assembly_duration_lands_in_the_bucket_of_its_outcome() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.record_assembly(an_assembly(outcome=Outcome.DEGRADED), ())  # 12 ms

    v = values(metrics)
    name = "ibex_context_assembly_duration_seconds_bucket"
    assert v[(name, frozenset({("outcome", "degraded"), ("le", "0.01")}))] == 0
    assert v[(name, frozenset({("outcome", "degraded"), ("le", "0.02")}))] == 1
    assert v[(name, frozenset({("outcome", "full"), ("le", "+Inf")}))] == 0
    assert v[("ibex_context_assembly_duration_seconds_sum", frozenset({("outcome", "degraded")}))] == 0.012


def test_every_reason_counts_once_and_unknown_reasons_become_other() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.record_assembly(an_assembly(reasons=("cold_timeout", "hot_error", "tenant-42 exploded")), ())

    v = values(metrics)
    assert v[("ibex_context_fallbacks_total", frozenset({("reason", "cold_timeout")}))] == 1
    assert v[("ibex_context_fallbacks_total", frozenset({("reason", "hot_error")}))] == 1
    assert v[("ibex_context_fallbacks_total", frozenset({("reason", OTHER)}))] == 1
    reasons = {dict(labels)["reason"] for name, labels in v if name == "ibex_context_fallbacks_total"}
    assert reasons == {*KNOWN_REASONS, OTHER}


def test_every_reason_the_assembler_can_give_is_a_known_label() -> None:
    # A reason added to the type and not to KNOWN_REASONS would silently be counted
    # as "other".
    from ibex_context.pipeline.outcome import Reason

    assert list(Reason)
    assert [r for r in Reason if normalise_reason(r) != r] == []


def test_failed_sources_count_by_source_and_kind_and_ok_ones_do_not() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.record_assembly(
        an_assembly(
            sources=(
                SourceResult("cold", SourceStatus.TIMEOUT),
                SourceResult("hot", SourceStatus.ERROR),
                SourceResult("directive", SourceStatus.OK),
                SourceResult("embed", SourceStatus.SKIPPED),
            )
        ),
        (),
    )
    v = values(metrics)
    failures = {
        (dict(labels)["source"], dict(labels)["kind"]): value
        for (name, labels), value in v.items()
        if name == "ibex_context_retrieval_failures_total" and value
    }
    assert failures == {("cold", "timeout"): 1, ("hot", "error"): 1}


def test_answered_cold_searches_count_by_the_plan_named_in_their_detail() -> None:
    metrics = Metrics(CollectorRegistry())
    for detail in (
        plan_detail("agent_halfvec"),
        plan_detail("agent_halfvec"),
        plan_detail("exact"),
        plan_detail("hnsw"),  # the partitions' graphs' plan, gone since migration 0021
    ):
        metrics.record_assembly(
            an_assembly(sources=(SourceResult("cold", SourceStatus.OK, detail=detail),)), ()
        )
    # A failed search and a skipped one name no plan; neither counts.
    metrics.record_assembly(
        an_assembly(
            sources=(
                SourceResult("cold", SourceStatus.TIMEOUT, detail="no answer within 20.0 ms"),
                SourceResult("cold", SourceStatus.SKIPPED, detail="cold_limit is 0"),
            )
        ),
        (),
    )
    plans = {
        dict(labels)["plan"]: value
        for (name, labels), value in values(metrics).items()
        if name == "ibex_context_cold_search_plans_total"
    }
    # Every plan a series from the start.
    assert plans == {"exact": 1, "agent_halfvec": 2, "agent_sparse": 0, "agent": 0, OTHER: 1}


def test_a_repeated_walk_counts_under_its_plan_and_apart() -> None:
    metrics = Metrics(CollectorRegistry())
    assert values(metrics)[("ibex_context_cold_search_rewalks_total", frozenset())] == 0
    for rewalked in (True, False):
        detail = plan_detail("agent_halfvec", rewalked=rewalked)
        metrics.record_assembly(
            an_assembly(sources=(SourceResult("cold", SourceStatus.OK, detail=detail),)), ()
        )
    v = values(metrics)
    assert v[("ibex_context_cold_search_plans_total", frozenset({("plan", "agent_halfvec")}))] == 2
    assert v[("ibex_context_cold_search_rewalks_total", frozenset())] == 1


def test_calls_searched_with_the_stand_ins_vector_are_counted() -> None:
    metrics = Metrics(CollectorRegistry())
    for detail in (STAND_IN_DETAIL, "", STAND_IN_DETAIL):
        metrics.record_assembly(
            an_assembly(sources=(SourceResult("embed", SourceStatus.OK, detail=detail),)), ()
        )
    metrics.record_assembly(
        an_assembly(
            sources=(SourceResult("embed", SourceStatus.TIMEOUT, detail="no answer within 20.0 ms"),)
        ),
        (),
    )
    assert values(metrics)[("ibex_context_embedding_stand_ins_total", frozenset())] == 2


def test_stage_durations_use_the_fine_buckets_and_unknown_stages_become_other() -> None:
    metrics = Metrics(CollectorRegistry())
    stages = (StageSpan("score", 0, 180_000), StageSpan("teleport", 0, 1_000))  # 180 us, 1 us
    metrics.record_assembly(an_assembly(), stages)

    v = values(metrics)
    bucket = "ibex_context_stage_duration_seconds_bucket"
    assert v[(bucket, frozenset({("stage", "score"), ("le", "0.0001")}))] == 0
    assert v[(bucket, frozenset({("stage", "score"), ("le", "0.00025")}))] == 1
    assert v[("ibex_context_stage_duration_seconds_count", frozenset({("stage", OTHER)}))] == 1


def test_budget_utilisation_is_observed_only_when_there_was_a_budget() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.record_assembly(
        an_assembly(composed={"budget": a_budget(memory_budget=1000), "memory_tokens": 850}), ()
    )
    metrics.record_assembly(an_assembly(composed={"budget": a_budget(memory_budget=0)}), ())
    metrics.record_assembly(an_assembly(composed={"budget": None}), ())

    v = values(metrics)
    assert v[("ibex_context_budget_utilisation_ratio_count", frozenset())] == 1
    assert v[("ibex_context_budget_utilisation_ratio_sum", frozenset())] == 0.85
    bucket = "ibex_context_budget_utilisation_ratio_bucket"
    assert v[(bucket, frozenset({("le", "0.8")}))] == 0
    assert v[(bucket, frozenset({("le", "0.9")}))] == 1


def test_invalid_requests_count_their_duration_but_no_assembly_distributions() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.record_rejection(0.003)

    v = values(metrics)
    assert v[("ibex_context_assembly_duration_seconds_count", frozenset({("outcome", "invalid")}))] == 1
    assert v[("ibex_context_assembly_duration_seconds_sum", frozenset({("outcome", "invalid")}))] == 0.003
    assert v[("ibex_context_memories_injected_count", frozenset())] == 0
    assert v[("ibex_context_assembly_degradation_total", frozenset({("level", "full")}))] == 0


def test_degradation_level_is_counted_by_name() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.record_assembly(an_assembly(degradation=Degradation.DIRECTIVE_ONLY), ())
    v = values(metrics)
    assert v[("ibex_context_assembly_degradation_total", frozenset({("level", "directive_only")}))] == 1


def test_no_label_can_carry_an_id() -> None:
    metrics = Metrics(CollectorRegistry())
    label_names = {
        label for family in metrics.registry.collect() for s in family.samples for label in s.labels
    }
    assert label_names <= {
        "outcome",
        "stage",
        "level",
        "reason",
        "source",
        "kind",
        "grpc_type",
        "grpc_service",
        "grpc_method",
        "grpc_code",
        "generation",
        "phase",
        # python_info: the interpreter's version, a fixed set.
        "implementation",
        "major",
        "minor",
        "patchlevel",
        "version",
        "plan",
        "target",
        "replica",
        # admission_shed_total: process, org_share, org_rate (never an org).
        "limit",
        # graph_build_seconds: dense, sparse (never an agent or its index's name).
        "graph",
        "le",
    }


def test_every_admission_shed_is_counted_under_its_limit_and_the_series_exist_from_the_start() -> None:
    metrics = Metrics(CollectorRegistry())
    shed = "ibex_context_admission_shed_total"
    assert all(
        metrics.registry.get_sample_value(shed, {"limit": limit}) == 0 for limit in ADMISSION_LIMITS.values()
    )
    metrics.record_admission_shed(Reason.ORG_OVER_SHARE)
    metrics.record_admission_shed(Reason.ORG_OVER_SHARE)
    metrics.record_admission_shed(Reason.ORG_OVER_RATE)
    assert metrics.registry.get_sample_value(shed, {"limit": "org_share"}) == 2
    assert metrics.registry.get_sample_value(shed, {"limit": "org_rate"}) == 1
    assert metrics.registry.get_sample_value(shed, {"limit": "process"}) == 0
    metrics.track_admission(lambda: 3)
    assert metrics.registry.get_sample_value("ibex_context_admission_active_orgs") == 3


def test_read_replicas_lag_and_routing_are_read_at_scrape_time_named_by_position() -> None:
    metrics = Metrics(CollectorRegistry())
    # Every route is a series from the start (0, not absent, on a dashboard).
    assert (
        values(metrics)[
            (
                "ibex_context_postgres_reads_total",
                frozenset({("target", "primary"), ("reason", "behind_write")}),
            )
        ]
        == 0
    )
    statuses = [ReplicaStatus("replica-0", up=True, lag_seconds=0.25, lag_bytes=4096, replayed_lsn=1)]
    metrics.track_replicas(lambda: statuses, ["replica-0"])
    metrics.record_postgres_read("replica", "replica")
    read = values(metrics)
    assert read[("ibex_context_postgres_replica_lag_seconds", frozenset({("replica", "replica-0")}))] == 0.25
    assert read[("ibex_context_postgres_replica_lag_bytes", frozenset({("replica", "replica-0")}))] == 4096
    assert read[("ibex_context_postgres_replica_up", frozenset({("replica", "replica-0")}))] == 1
    assert (
        read[("ibex_context_postgres_reads_total", frozenset({("target", "replica"), ("reason", "replica")}))]
        == 1
    )
    statuses[0] = ReplicaStatus("replica-0", up=False, lag_seconds=9.0, lag_bytes=0, replayed_lsn=1)
    assert values(metrics)[("ibex_context_postgres_replica_up", frozenset({("replica", "replica-0")}))] == 0


def test_post_response_queue_depth_is_read_at_scrape_time() -> None:
    metrics = Metrics(CollectorRegistry())
    queue: list[int] = [1, 2, 3]
    metrics.track_post_response_queue(lambda: len(queue))
    assert values(metrics)[("ibex_context_post_response_queue_depth", frozenset())] == 3
    queue.clear()
    assert values(metrics)[("ibex_context_post_response_queue_depth", frozenset())] == 0


def test_the_graph_build_queue_is_read_at_scrape_time() -> None:
    metrics = Metrics(CollectorRegistry())
    queued = [("org", "agent")] * 4
    metrics.track_graph_builds_queued(lambda: len(queued))
    assert values(metrics)[("ibex_context_graph_builds_queued", frozenset())] == 4
    queued.clear()
    assert values(metrics)[("ibex_context_graph_builds_queued", frozenset())] == 0


def test_graph_builds_are_timed_by_graph_and_outcome_without_a_tenant() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.record_graph_build(GraphBuildTiming("dense", True, 42.0))
    metrics.record_graph_build(GraphBuildTiming("sparse", True, 2.0))
    metrics.record_graph_build(GraphBuildTiming("dense", False, 3.0))
    metrics.record_graph_build(GraphBuildTiming("an unknown graph", True, 1.0))  # no new series
    read = values(metrics)
    count = "ibex_context_graph_build_seconds_count"
    assert read[(count, frozenset({("graph", "dense"), ("outcome", "built")}))] == 1
    assert read[(count, frozenset({("graph", "sparse"), ("outcome", "built")}))] == 1
    assert read[(count, frozenset({("graph", "dense"), ("outcome", "failed")}))] == 1
    assert (
        read[("ibex_context_graph_build_seconds_sum", frozenset({("graph", "dense"), ("outcome", "built")}))]
        == 42
    )
    assert {dict(labels).get("graph") for name, labels in read if name == count} == {"dense", "sparse"}


def test_profile_reloads_count_by_outcome_and_stamp_the_last_success() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.record_profile_reload(True, profiles=3, at=1_700_000_000.0)
    metrics.record_profile_reload(False)

    v = values(metrics)
    assert v[("ibex_context_profile_reloads_total", frozenset({("outcome", "success")}))] == 1
    assert v[("ibex_context_profile_reloads_total", frozenset({("outcome", "failure")}))] == 1
    assert v[("ibex_context_profile_reload_last_success_timestamp_seconds", frozenset())] == 1_700_000_000.0
    assert v[("ibex_context_profiles_loaded", frozenset())] == 3


# --- scraped over HTTP after real calls ------------------------------------------------


async def test_real_calls_move_the_counts_and_buckets_seen_by_a_scrape(
    observed: Observed, client: ContextClient
) -> None:
    before = await observed.scrape()
    for _ in range(3):
        await call(client, scripted.FULL)
    after = await observed.scrape()

    count = "ibex_context_assembly_duration_seconds_count"
    assert sample(after, count, outcome="full") - sample(before, count, outcome="full") == 3
    inf = sample(after, "ibex_context_assembly_duration_seconds_bucket", outcome="full", le="+Inf")
    assert inf == 3
    assert sample(after, "grpc_server_handled_total", grpc_code="OK", **ASSEMBLE) == 3
    assert sample(after, "ibex_context_memories_injected_sum") == 6
    assert sample(after, "ibex_context_candidates_evaluated_sum") == 21
    # Every stage the handler timed, serialize included (added after the report was attached).
    for stage in STAGES:
        assert sample(after, "ibex_context_stage_duration_seconds_count", stage=stage.value) == 3, stage
    assert sample(after, "ibex_context_inflight_calls") == 0


async def test_a_forced_fallback_shows_its_reason_and_failed_source(
    observed: Observed, client: ContextClient
) -> None:
    await call(client, scripted.COLD_TIMEOUT)
    await call(client, scripted.UNKNOWN_REASON)
    samples = await observed.scrape()

    assert sample(samples, "ibex_context_fallbacks_total", reason="cold_timeout") == 1
    assert sample(samples, "ibex_context_fallbacks_total", reason="other") == 1
    assert sample(samples, "ibex_context_fallbacks_total", reason="hot_timeout") == 0
    assert sample(samples, "ibex_context_retrieval_failures_total", source="cold", kind="timeout") == 1
    assert sample(samples, "ibex_context_assembly_duration_seconds_count", outcome="degraded") == 2
    assert sample(samples, "ibex_context_assembly_degradation_total", level="hot_only") == 1


async def test_rejected_and_crashed_calls_are_counted_by_grpc_code(
    observed: Observed, client: ContextClient
) -> None:
    await call(client, scripted.INVALID)
    await call(client, scripted.CRASH)
    samples = await observed.scrape()

    assert sample(samples, "grpc_server_handled_total", grpc_code="INVALID_ARGUMENT", **ASSEMBLE) == 1
    assert sample(samples, "grpc_server_handled_total", grpc_code="UNKNOWN", **ASSEMBLE) == 1
    assert sample(samples, "ibex_context_assembly_duration_seconds_count", outcome="invalid") == 1
    assert sample(samples, "ibex_context_inflight_calls") == 0


async def test_no_scraped_label_value_contains_request_content_or_ids(
    observed: Observed, client: ContextClient
) -> None:
    await client.assemble(
        org_id="org-7f3a",
        agent_id="agent-91bc",
        session_id="sess-55de",
        request_id="req-0042",
        model=scripted.COLD_TIMEOUT,
        messages=MESSAGES,
    )
    samples = await observed.scrape()
    label_values = {value for _, labels in samples for _, value in labels}
    forbidden = ("org-7f3a", "agent-91bc", "sess-55de", "req-0042", "PAPAYA", "drink")
    assert not [v for v in label_values if any(f in v for f in forbidden)]


def test_gc_pauses_are_recorded_by_generation_and_unknown_generations_ignored() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.record_gc_pause(2, 0.07)
    metrics.record_gc_pause(0, 0.0001)
    metrics.record_gc_pause(7, 1.0)
    v = values(metrics)
    assert v[("ibex_context_gc_pause_seconds_count", frozenset({("generation", "2")}))] == 1
    assert v[("ibex_context_gc_pause_seconds_sum", frozenset({("generation", "2")}))] == 0.07
    assert v[("ibex_context_gc_pause_seconds_bucket", frozenset({("generation", "2"), ("le", "0.045")}))] == 0
    assert v[("ibex_context_gc_pause_seconds_count", frozenset({("generation", "0")}))] == 1
    assert v[("ibex_context_gc_pause_seconds_count", frozenset({("generation", "1")}))] == 0


def test_each_embedding_turn_is_recorded_by_kind_and_phase() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.record_embedding_turn(
        EmbeddingTurn(query=True, texts=2, queued=0.004, computing=0.006, on_cpu=0.003)
    )
    v = values(metrics)

    def count_and_sum(kind: str, phase: str) -> tuple[float, float]:
        labels = frozenset({("kind", kind), ("phase", phase)})
        return (
            v[("ibex_context_embedding_seconds_count", labels)],
            v[("ibex_context_embedding_seconds_sum", labels)],
        )

    assert count_and_sum("query", "queued") == (1, 0.004)
    assert count_and_sum("query", "computing") == (1, 0.006)
    assert count_and_sum("query", "on_cpu") == (1, 0.003)
    # Writes' series exist before their first turn: they read 0, not absent.
    assert count_and_sum("stored", "computing") == (0, 0)


def test_query_embedding_cache_lookups_are_read_from_the_cache_at_scrape_time() -> None:
    metrics = Metrics(CollectorRegistry())
    counts = [3, 1, 2]
    metrics.track_query_embedding_cache(lambda: (counts[0], counts[1], counts[2]))
    name = "ibex_context_query_embedding_lookups_total"
    assert {
        result: values(metrics)[(name, frozenset({("result", result)}))]
        for result in ("hit", "shared", "miss")
    } == {
        "hit": 3,
        "shared": 1,
        "miss": 2,
    }
    counts[0] += 5
    assert values(metrics)[(name, frozenset({("result", "hit")}))] == 8
