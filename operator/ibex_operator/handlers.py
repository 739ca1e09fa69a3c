"""kopf handlers: every trigger re-renders the whole namespace (level-based, idempotent).

Create, spec update, resume, the DELETED watch event and the drift loop all call
``Reconciler.reconcile_namespace``: list every ContextProfile of the namespace,
compute the desired ConfigMaps, HPAs and statuses (``reconcile.py``), and write
only what differs. A per-namespace lock serialises reconciles, so two profiles
changing at once cannot write an older listing over a newer one.

Deletion needs no operator: profiles carry NO finalizer. kopf timers and
mandatory delete handlers always add one, so drift is checked by one loop per
operator (``drift_loop``) instead of a per-profile timer, and the delete handler
is optional. A profile deleted while the operator is gone (``helm uninstall``
removes the operator's Deployment and Role before custom resources; a namespace
deletion removes everything at once) therefore never hangs in Terminating, and
the garbage collector removes its ConfigMap and HPA: they carry a non-controller
ownerReference to every contributing profile. A running operator re-renders on
the DELETED event. A finalizer left by an older operator is removed by kopf.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kopf

from ibex_operator.config import OperatorConfig
from ibex_operator.crd import GROUP, KIND, PLURAL, VERSION
from ibex_operator.kube import (
    Credentials,
    KubeApiError,
    KubeClient,
    configmaps_path,
    hpas_path,
    profiles_path,
)
from ibex_operator.leadership import is_leader, peering_path
from ibex_operator.metrics import OperatorMetrics
from ibex_operator.reconcile import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SERVICE_LABEL,
    NamespacePlan,
    ProfileView,
    child_patch,
    plan_namespace,
    status_patch,
)

_log = logging.getLogger(__name__)
Logger = logging.Logger | logging.LoggerAdapter[Any]


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Change:
    kind: str
    name: str
    action: str  # created | updated | deleted


@dataclass(slots=True)
class ReconcileStats:
    reconciles: int = 0
    writes: int = 0
    last_success: str | None = None
    last_error: str | None = None
    last_by_namespace: dict[str, float] = field(default_factory=dict)


def _profile_ref(body: Mapping[str, Any]) -> kopf.Body:
    meta = body.get("metadata") or {}
    return kopf.Body(
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {
                "name": str(meta.get("name", "")),
                "namespace": str(meta.get("namespace", "")),
                "uid": str(meta.get("uid", "")),
            },
        }
    )


def _carries(body: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    own = (body.get("metadata") or {}).get("labels") or {}
    return all(own.get(k) == v for k, v in labels.items())


def _condition(status: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any]:
    for c in (status or {}).get("conditions") or ():
        if c.get("type") == type_:
            return dict(c)
    return {}


class Reconciler:
    def __init__(
        self,
        client: KubeClient,
        config: OperatorConfig,
        *,
        clock: Any = time.monotonic,
        metrics: OperatorMetrics | None = None,
        identity: str = "",
        priority: int = 0,
    ) -> None:
        self._client = client
        self._config = config
        self._clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self.stats = ReconcileStats()
        self.metrics = metrics or OperatorMetrics()
        self.identity = identity
        self.priority = priority

    async def leads(self) -> bool:
        """Whether this replica works (always, standalone). kopf pauses its own handlers on the
        peering; this answers for what kopf does not run: the drift loop."""
        if self._config.peering is None:
            return True
        namespace = next(iter(self._config.namespaces), "")
        peering = await self._client.get(peering_path(namespace, self._config.peering))
        status = (peering or {}).get("status") or {}
        leading = is_leader(status, self.identity, self.priority, datetime.datetime.now(datetime.UTC))
        self.metrics.leader.set(1 if leading else 0)
        return leading

    def recently_reconciled(self, namespace: str, within_s: float) -> bool:
        last = self.stats.last_by_namespace.get(namespace)
        return last is not None and self._clock() - last < within_s

    async def reconcile_namespace(self, namespace: str) -> list[Change]:
        lock = self._locks.setdefault(namespace, asyncio.Lock())
        async with lock:
            if self._client.closed:  # timers may still fire while the operator stops
                return []
            started = time.perf_counter()
            try:
                changes = await self._reconcile(namespace)
            except (KubeApiError, aiohttp.ClientError, TimeoutError) as exc:
                self.stats.last_error = f"{namespace}: {exc}"[:500]
                self.metrics.reconciles.labels("error").inc()
                raise kopf.TemporaryError(
                    f"reconcile of namespace {namespace} failed: {exc}", delay=5
                ) from exc
            finally:
                self.metrics.reconcile_seconds.observe(time.perf_counter() - started)
            self.metrics.reconciles.labels("success").inc()
            self.metrics.last_success.set(time.time())
            for change in changes:
                self.metrics.changes.labels(change.kind, change.action).inc()
            self.stats.reconciles += 1
            self.stats.writes += len(changes)
            self.stats.last_success = utc_now()
            self.stats.last_by_namespace[namespace] = self._clock()
            return changes

    async def _reconcile(self, namespace: str) -> list[Change]:
        selector = self._config.selector_labels
        bodies = await self._client.list(profiles_path(namespace), label_selector=self._config.selector_text)
        # Filter again: a server that ignored the selector must not hand us another release's profiles.
        bodies = [
            b
            for b in bodies
            if (b.get("metadata") or {}).get("namespace", namespace) == namespace and _carries(b, selector)
        ]
        plan = plan_namespace(
            namespace,
            (ProfileView.from_body(b) for b in bodies),
            self._config.default_service,
            utc_now(),
            render_hpa_objects=self._config.render_hpa,
            inflight_metric=self._config.inflight_metric,
            child_labels=selector,
        )
        changes = await self._apply_children(plan)
        changes += await self._delete_orphans(plan)
        by_name = {b["metadata"]["name"]: b for b in bodies}
        await self._apply_statuses(plan, by_name)
        if changes and self._config.post_events:
            self._post_changes(plan, by_name, changes)
        return changes

    async def _apply_children(self, plan: NamespacePlan) -> list[Change]:
        changes: list[Change] = []
        for objects in plan.services:
            for path_of, desired in ((configmaps_path, objects.configmap), (hpas_path, objects.hpa)):
                if desired is None:
                    continue
                name = desired["metadata"]["name"]
                actual = await self._client.get(path_of(plan.namespace, name))
                if actual is None:
                    await self._client.create(path_of(plan.namespace), desired)
                    changes.append(Change(desired["kind"], name, "created"))
                    continue
                patch = child_patch(actual, desired)
                if patch:
                    await self._client.merge_patch(path_of(plan.namespace, name), patch)
                    changes.append(Change(desired["kind"], name, "updated"))
        return changes

    async def _delete_orphans(self, plan: NamespacePlan) -> list[Change]:
        changes: list[Change] = []
        # Only our own children: another release's operator labels its children with its selector.
        mine = {MANAGED_BY_LABEL: MANAGED_BY, **self._config.selector_labels}
        selector = ",".join(f"{k}={v}" for k, v in sorted(mine.items()))
        for path_of, kind in ((configmaps_path, "ConfigMap"), (hpas_path, "HorizontalPodAutoscaler")):
            # An HPA we made while autoscaling was on goes once it is off.
            wanted = {s.service for s in plan.services if kind == "ConfigMap" or s.hpa is not None}
            for obj in await self._client.list(path_of(plan.namespace), label_selector=selector):
                labels = (obj.get("metadata") or {}).get("labels") or {}
                # Filter again: a label selector the server ignores must not delete others' objects.
                if not _carries(obj, mine) or SERVICE_LABEL not in labels:
                    continue
                if labels[SERVICE_LABEL] in wanted:
                    continue
                name = obj["metadata"]["name"]
                await self._client.delete(path_of(plan.namespace, name))
                changes.append(Change(kind, name, "deleted"))
        return changes

    async def _apply_statuses(self, plan: NamespacePlan, by_name: Mapping[str, Mapping[str, Any]]) -> None:
        for name in sorted(plan.statuses):
            body = by_name[name]
            desired = plan.statuses[name]
            patch = status_patch(body.get("status"), desired)
            if not patch:
                continue
            try:
                await self._client.merge_patch(
                    profiles_path(plan.namespace, name) + "/status", {"status": patch}
                )
            except KubeApiError as exc:
                if exc.status == 404:  # deleted since the listing; the DELETED event re-renders
                    continue
                raise
            if self._config.post_events:
                self._post_condition_changes(body, desired)

    def _post_condition_changes(self, body: Mapping[str, Any], desired: Mapping[str, Any]) -> None:
        for type_, warn_when in (("Ready", "False"), ("Conflict", "True")):
            old = _condition(body.get("status"), type_)
            new = _condition(desired, type_)
            if not new or (old.get("status"), old.get("reason")) == (new["status"], new["reason"]):
                continue
            kind = "Warning" if new["status"] == warn_when else "Normal"
            message = new["message"] or f"{type_} is {new['status']}"
            kopf.event(_profile_ref(body), type=kind, reason=new["reason"], message=message[:1000])

    def _post_changes(
        self, plan: NamespacePlan, by_name: Mapping[str, Mapping[str, Any]], changes: list[Change]
    ) -> None:
        text = ", ".join(f"{c.action} {c.kind} {c.name}" for c in changes)
        for name, status in sorted(plan.statuses.items()):
            if status.get("configMap") is None:
                continue
            touched = any(c.name in (status["configMap"], status["service"]) for c in changes)
            if touched and name in by_name:
                kopf.info(_profile_ref(by_name[name]), reason="Rendered", message=text[:1000])


def configure_settings(settings: kopf.OperatorSettings) -> None:
    # kopf state in annotations: the default also writes status.kopf, which the structural schema prunes.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # No cluster-wide CRD/namespace discovery: the namespaces are given, the CRD ships with the chart.
    settings.scanning.disabled = True
    # Our own events say what changed; kopf posts only its warnings and errors.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60


async def drift_loop(reconciler: Reconciler, config: OperatorConfig, logger: Logger) -> None:
    """Every ``drift_interval_s``: re-render each watched namespace (and each namespace a profile was
    seen in) unless it was reconciled within half an interval, repairing deleted or hand-edited
    children. One loop per operator, not a kopf timer per profile: timers force a finalizer."""
    while True:
        await asyncio.sleep(config.drift_interval_s)
        try:
            if not await reconciler.leads():
                continue  # another replica works; kopf has paused our handlers too
        except (KubeApiError, aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("reading the peering %s failed: %s", config.peering, exc)
            continue
        for namespace in sorted(set(config.namespaces) | set(reconciler.stats.last_by_namespace)):
            if reconciler.recently_reconciled(namespace, config.drift_interval_s / 2):
                continue
            try:
                changes = await reconciler.reconcile_namespace(namespace)
            except kopf.TemporaryError as exc:
                logger.warning("drift check of %s failed: %s", namespace, exc)
                continue
            for change in changes:
                reconciler.metrics.drift_repairs.inc()
                logger.warning("drift repaired: %s %s %s", change.action, change.kind, change.name)


def build_registry(
    config: OperatorConfig,
    credentials: Credentials,
    client: KubeClient | None = None,
    *,
    metrics: OperatorMetrics | None = None,
    identity: str = "",
    priority: int = 0,
) -> tuple[kopf.OperatorRegistry, Reconciler]:
    """A fresh kopf registry with every handler bound to ``config`` and one ``Reconciler``.
    ``identity``/``priority``: this replica's in the peering (``config.peering``)."""
    registry = kopf.OperatorRegistry()
    kube = client or KubeClient(credentials)
    reconciler = Reconciler(kube, config, metrics=metrics, identity=identity, priority=priority)

    @kopf.on.startup(registry=registry)
    def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings)
        settings.posting.enabled = config.post_events

    @kopf.on.login(registry=registry)
    def _login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return credentials.login(**kwargs)

    drift: dict[str, asyncio.Task[None]] = {}

    @kopf.on.startup(registry=registry, id="drift")
    async def _start_drift(logger: Logger, **_: Any) -> None:
        drift["task"] = asyncio.create_task(
            drift_loop(reconciler, config, logger), name="ibex-operator-drift"
        )

    @kopf.on.cleanup(registry=registry)
    async def _cleanup(**_: Any) -> None:
        task = drift.pop("task", None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await kube.close()

    # Only this release's profiles trigger a reconcile (the DELETED watch below stays unfiltered: a
    # re-render is cheap, and a profile relabelled away from us is caught there or by the drift loop).
    mine = config.selector_labels or None

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry, labels=mine)
    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=registry, labels=mine)
    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry, labels=mine)
    async def _reconcile(namespace: str | None, logger: Logger, **_: Any) -> None:
        changes = await reconciler.reconcile_namespace(namespace or "")
        for change in changes:
            logger.info("%s %s %s", change.action, change.kind, change.name)

    # Optional: kopf adds no finalizer for it. It runs when a deletion is held up by someone else's
    # finalizer (the plan leaves a profile with a deletionTimestamp out).
    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry, optional=True, labels=mine)
    async def _delete(namespace: str | None, logger: Logger, **_: Any) -> None:
        for change in await reconciler.reconcile_namespace(namespace or ""):
            logger.info("%s %s %s", change.action, change.kind, change.name)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def _deleted(type: str, namespace: str | None, **_: Any) -> None:
        # Gone for good (also when someone removed the finalizer by hand): render without it.
        if type == "DELETED" and namespace:
            await reconciler.reconcile_namespace(namespace)

    @kopf.on.probe(id="reconciler", registry=registry)
    def _probe(**_: Any) -> dict[str, Any]:
        s = reconciler.stats
        return {
            "reconciles": s.reconciles,
            "writes": s.writes,
            "lastSuccess": s.last_success,
            "lastError": s.last_error,
        }

    return registry, reconciler
