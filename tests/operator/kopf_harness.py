"""Fixtures for the operator tests: the real kopf operator, in-process, against kmock.

Imported explicitly by the test modules: a ``conftest.py`` here would need a
``tests/operator/__init__.py``, and a package named ``operator`` shadows the stdlib.


kmock 0.8 workarounds (docs/adr/0004-context-profiles.md, k8s digest §2): namespace
scanning disabled (kmock cannot list /api/v1/namespaces), the tests set uid,
resourceVersion, generation and creationTimestamp themselves, and the operator is
started with ``spawn_tasks`` and stopped with ``run_tasks(ignored=...)`` because
``kopf.operator()`` would cancel pytest-asyncio's own tasks on exit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import warnings
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import kmock as kmock_lib
import kopf
import pytest
from ibex_operator.config import OperatorConfig
from ibex_operator.crd import GROUP, KIND, PLURAL, VERSION
from ibex_operator.handlers import Reconciler, build_registry
from ibex_operator.kube import Credentials

NAMESPACE = "team-a"
CR_RESOURCE = f"{GROUP}/{VERSION}/{PLURAL}"
DRIFT_INTERVAL_S = 0.5


@pytest.fixture()
def k8s(kmock: Any) -> Any:
    with warnings.catch_warnings():
        # kmock 0.8 reads its bundle with importlib.resources.read_binary (deprecated).
        warnings.filterwarnings("ignore", "read_binary is deprecated", DeprecationWarning)
        kmock.resources.load_bundled()  # namespaces, CRDs, configmaps, events, autoscaling/v2 HPAs
    kmock.resources[CR_RESOURCE] = kmock.ResourceInfo(
        kind=KIND,
        singular="contextprofile",
        namespaced=True,
        shortnames={"cprof"},
        verbs={"get", "list", "watch", "create", "patch", "update", "delete"},
        subresources={"status"},
    )
    return kmock


@dataclass(frozen=True)
class RunningOperator:
    reconciler: Reconciler
    liveness_url: str


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def default_operator_config() -> OperatorConfig:
    """The tests run with the in-flight metric on (as with a custom-metrics adapter)."""
    return OperatorConfig(
        namespaces=(NAMESPACE,),
        default_service="ibex-context",
        drift_interval_s=DRIFT_INTERVAL_S,
        inflight_metric=True,
    )


@pytest.fixture()
def operator_config() -> OperatorConfig:
    """The operator's configuration; a test module overrides this fixture to change it."""
    return default_operator_config()


@pytest.fixture()
async def operator(k8s: Any, operator_config: OperatorConfig) -> AsyncIterator[RunningOperator]:
    server = str(k8s.url).rstrip("/")
    liveness_url = f"http://127.0.0.1:{free_port()}/healthz"
    config = dataclasses.replace(operator_config, liveness_endpoint=liveness_url)
    registry, reconciler = build_registry(config, Credentials(lambda **_: kopf.ConnectionInfo(server=server)))
    stop, ready = asyncio.Event(), asyncio.Event()
    tasks = await kopf.spawn_tasks(
        registry=registry,
        standalone=True,
        namespaces=[NAMESPACE],
        stop_flag=stop,
        ready_flag=ready,
        liveness_endpoint=config.liveness_endpoint,
    )
    await asyncio.wait_for(ready.wait(), 10)
    yield RunningOperator(reconciler, liveness_url)
    stop.set()
    runner = asyncio.create_task(kopf.run_tasks(tasks, ignored=asyncio.all_tasks() - set(tasks)))
    deadline = asyncio.get_running_loop().time() + 15
    while not runner.done() and asyncio.get_running_loop().time() < deadline:
        await asyncio.wait([runner], timeout=0.05)
        if all(t.done() for t in tasks):
            # kmock replays stale events, so kopf may spawn a timer after its daemon killer exited;
            # run_tasks gives such hung tasks a fixed 5 s before cancelling them. Cancel kopf's now.
            for task in asyncio.all_tasks() - {runner, asyncio.current_task()}:
                if _is_kopf_task(task):
                    task.cancel()
    await asyncio.wait_for(runner, 1)


def _is_kopf_task(task: asyncio.Task[Any]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and "/kopf/" in code.co_filename


async def eventually(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll until ``predicate`` is truthy; lookup and assertion errors count as "not yet"."""
    deadline = asyncio.get_running_loop().time() + timeout
    last_exc: Exception | None = None
    while asyncio.get_running_loop().time() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except (KeyError, TypeError, IndexError, AssertionError) as exc:
            last_exc = exc
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout}s (last error: {last_exc!r})")


def key(resource: str, name: str) -> Any:
    return (kmock_lib.resource(resource), NAMESPACE, name)
