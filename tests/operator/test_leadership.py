"""Leader election among operator replicas through kopf's peering: the rule (``is_leader``), and the
real kopf operator against kmock pausing while a live peer outranks it, then taking over."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import AsyncIterator
from typing import Any

import kopf
import kopf_harness
import pytest
from ibex_operator.handlers import build_registry
from ibex_operator.kube import Credentials
from ibex_operator.leadership import is_leader, peering_path, random_priority
from kopf_harness import NAMESPACE, eventually
from prometheus_client import generate_latest
from test_operator_e2e import CM, create_profile, live

k8s = kopf_harness.k8s  # fixtures, requested by name
NOW = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)
PEERING = "rel-ibex-context-operator"


def seen(seconds_ago: float, priority: int, lifetime: int = 60) -> dict[str, Any]:
    when = NOW - datetime.timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": when.isoformat()}


def test_the_highest_live_priority_leads_and_a_tie_pauses_both() -> None:
    assert is_leader({}, "me", 5, NOW)
    assert is_leader({"me": seen(0, 5), "b": seen(0, 4)}, "me", 5, NOW)
    assert not is_leader({"me": seen(0, 5), "b": seen(0, 6)}, "me", 5, NOW)
    assert not is_leader({"me": seen(0, 5), "b": seen(0, 5)}, "me", 5, NOW)


def test_a_dead_peer_no_longer_outranks_and_a_malformed_record_counts_as_dead() -> None:
    assert is_leader({"b": seen(61, 9)}, "me", 5, NOW)
    assert not is_leader({"b": seen(59, 9)}, "me", 5, NOW)
    assert is_leader({"b": {"priority": 9, "lastseen": "yesterday"}}, "me", 5, NOW)
    assert is_leader({"b": {"priority": 9}}, "me", 5, NOW)


def test_replicas_draw_distinct_positive_priorities() -> None:
    drawn = {random_priority() for _ in range(1000)}
    assert len(drawn) > 990 and min(drawn) > 0


@pytest.fixture()
async def peered_k8s(k8s: Any) -> Any:
    k8s.resources["kopf.dev/v1/kopfpeerings"] = k8s.ResourceInfo(
        kind="KopfPeering",
        singular="kopfpeering",
        namespaced=True,
        verbs={"get", "list", "watch", "create", "patch", "update", "delete"},
    )
    return k8s


@pytest.fixture()
async def follower(peered_k8s: Any) -> AsyncIterator[Any]:
    """One replica with priority 5 in the peering, whose other member (priority 9) is alive."""
    outranking = {
        "other-replica": {**seen(0, 9), "lastseen": datetime.datetime.now(datetime.UTC).isoformat()}
    }
    body = {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": PEERING, "namespace": NAMESPACE, "resourceVersion": "1"},
        "status": outranking,
    }
    path = f"/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfpeerings"
    assert (await peered_k8s.post(path, json=body)).status == 200
    server = str(peered_k8s.url).rstrip("/")
    config = dataclasses.replace(
        kopf_harness.default_operator_config(), peering=PEERING, liveness_endpoint=None
    )
    registry, reconciler = build_registry(
        config, Credentials(lambda **_: kopf.ConnectionInfo(server=server)), identity="me", priority=5
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    tasks = await kopf.spawn_tasks(
        registry=registry,
        standalone=False,
        peering_name=PEERING,
        priority=5,
        identity="me",  # type: ignore[arg-type]
        namespaces=[NAMESPACE],
        stop_flag=stop,
        ready_flag=ready,
    )
    await asyncio.wait_for(ready.wait(), 10)
    yield reconciler
    stop.set()
    await asyncio.wait_for(kopf.run_tasks(tasks, ignored=asyncio.all_tasks() - set(tasks)), 20)


async def test_a_replica_waits_while_a_live_peer_outranks_it_and_takes_over_when_it_is_gone(
    peered_k8s: Any, follower: Any
) -> None:
    await create_profile(
        peered_k8s, "default", {"selector": {"default": True}}, created="2026-11-01T10:00:00Z"
    )
    await asyncio.sleep(1.5)  # several drift intervals: nothing may be rendered by the follower
    assert live(peered_k8s, CM, "ibex-context-profiles") is None
    assert not await follower.leads()
    assert follower.metrics.leader._value.get() == 0

    # The leader is gone (its record removed, as kopf does on a clean exit): the follower takes over.
    response = await peered_k8s.patch(
        peering_path(NAMESPACE, PEERING),
        json={"status": {"other-replica": None}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status == 200, await response.text()
    await eventually(lambda: live(peered_k8s, CM, "ibex-context-profiles") is not None, timeout=20)
    assert await follower.leads()
    registry = follower.metrics.registry
    await eventually(
        lambda: registry.get_sample_value("ibex_operator_reconciles_total", {"result": "success"})
    )
    assert registry.get_sample_value("ibex_operator_leader") == 1
    # Each change a reconcile makes is counted by kind and action: delete the ConfigMap, reconcile.
    labels = {"kind": "ConfigMap", "action": "created"}
    before = registry.get_sample_value("ibex_operator_changes_total", labels) or 0
    response = await peered_k8s.delete(f"/api/v1/namespaces/{NAMESPACE}/configmaps/ibex-context-profiles")
    assert response.status == 200, await response.text()
    await follower.reconcile_namespace(NAMESPACE)  # or the drift loop's, whichever runs first
    await eventually(lambda: live(peered_k8s, CM, "ibex-context-profiles") is not None)
    await eventually(lambda: (registry.get_sample_value("ibex_operator_changes_total", labels) or 0) > before)
    assert "process_cpu_seconds_total" in generate_latest(registry).decode()
