"""A release of charts/ibex-context installed with the real helm, and what stands in for the kubelet.

There is no kubelet: no container ever starts. The one pod Helm waits for is the migration hook
Job (pre-install, pre-upgrade). ``MigrationHook`` runs that Job's container command for real, as
the kubelet would: ``ibex-context`` (the image's entrypoint) with the Job's args, its environment
resolved from the Job's spec (values, and Secret keys read from the API server, so a Secret or
key the chart names but nobody created fails the install), against the test session's
PostgreSQL. Then it writes the Job's outcome to its status subresource (the job controller's
part): Complete on exit 0, Failed otherwise, and Helm goes on or stops as in a real cluster.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.kube import CHART, Cluster, KubeCommandError, Obj

# The image's ENTRYPOINT (Dockerfile): the Job's args follow it.
IMAGE_ENTRYPOINT = str(Path(sys.executable).parent / "ibex-context")
IMAGE_REPOSITORY = "registry.example.com/ibex-context"
# Helm's wait for the hook; the pytest time limit (120 s) is above it, so Helm's error is the one seen.
HOOK_TIMEOUT_S = 90.0


def fullname(release: str) -> str:
    return release if "ibex-context" in release else f"{release}-ibex-context"


def _finished(job: Obj) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or ()
    return any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class HookRun:
    job: str
    command: list[str]
    returncode: int
    output: str


@dataclass
class MigrationHook:
    """Watches one namespace for the release's migration Job and runs it (see the module doc)."""

    cluster: Cluster
    namespace: str
    release: str
    runs: list[HookRun] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def job_name(self) -> str:
        return f"{fullname(self.release)}-migrate"

    def serve(self) -> None:
        """Until stopped: run every new, unfinished migration Job (one per install and upgrade). The
        previous release's finished Job is left alone: Helm deletes it before creating the new one
        (before-hook-creation)."""
        done: set[str] = set()
        while not self._stop.wait(0.2):
            try:
                job = self.cluster.get("job", self.job_name, self.namespace)
                if job is None or job["metadata"]["uid"] in done or _finished(job):
                    continue
                if job["metadata"].get("deletionTimestamp"):
                    continue
                done.add(job["metadata"]["uid"])
                self._run(job)
            except Exception as exc:  # reported by Release.install, which fails the test
                self.errors.append(repr(exc))

    def stop(self) -> None:
        self._stop.set()

    def _run(self, job: Obj) -> None:
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        command = [*(container.get("command") or [IMAGE_ENTRYPOINT]), *(container.get("args") or [])]
        env = self._container_env(container.get("env") or ())
        started = _now()
        self._patch_status(job, {"startTime": started, "active": 1})
        result = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=HOOK_TIMEOUT_S, cwd=Path.home()
        )
        self.runs.append(
            HookRun(job["metadata"]["name"], command, result.returncode, result.stdout + result.stderr)
        )
        finished = _now()
        if result.returncode == 0:
            terminal = [
                {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": finished},
                {"type": "Complete", "status": "True", "lastTransitionTime": finished},
            ]
            status = {"succeeded": 1, "completionTime": finished}
        else:
            terminal = [
                {
                    "type": "FailureTarget",
                    "status": "True",
                    "lastTransitionTime": finished,
                    "reason": "BackoffLimitExceeded",
                },
                {
                    "type": "Failed",
                    "status": "True",
                    "lastTransitionTime": finished,
                    "reason": "BackoffLimitExceeded",
                },
            ]
            status = {"failed": 1}
        self._patch_status(
            job, {"startTime": started, "active": 0, "ready": 0, "conditions": terminal, **status}
        )

    def _patch_status(self, job: Obj, status: Mapping[str, Any]) -> None:
        self.cluster.kubectl(
            "patch", "job", job["metadata"]["name"], "-n", self.namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": status}),
        )  # fmt: skip

    def _container_env(self, entries: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        """The container's environment as the kubelet builds it (values and Secret/ConfigMap keys)."""
        env = {k: os.environ[k] for k in ("PATH", "HOME", "PYTHONPATH", "IBEX_GC_FREEZE") if k in os.environ}
        for entry in entries:
            if "value" in entry:
                env[entry["name"]] = str(entry["value"])
                continue
            source = entry["valueFrom"]
            ref = source.get("secretKeyRef") or source.get("configMapKeyRef")
            assert ref is not None, f"env {entry['name']}: only Secret and ConfigMap keys are resolved here"
            kind = "secret" if "secretKeyRef" in source else "configmap"
            obj = self.cluster.get(kind, ref["name"], self.namespace)
            data = (obj or {}).get("data") or {}
            if ref["key"] not in data:
                if ref.get("optional"):
                    continue
                # What the kubelet reports as CreateContainerConfigError: the pod would never start.
                raise AssertionError(f"env {entry['name']}: {kind} {ref['name']} has no key {ref['key']}")
            value = data[ref["key"]]
            env[entry["name"]] = base64.b64decode(value).decode() if kind == "secret" else value
        return env


class InstallFailed(Exception):
    """helm install or upgrade failed; ``hook`` says what the migration hook ran meanwhile."""

    def __init__(self, error: KubeCommandError, hook: MigrationHook) -> None:
        super().__init__(str(error))
        self.stderr = error.stderr
        self.hook = hook


@dataclass(frozen=True)
class Release:
    cluster: Cluster
    name: str
    namespace: str
    # Set on every install and upgrade, under the values each call adds (``prepare_release``).
    values: Mapping[str, Any] = field(default_factory=dict)

    @property
    def fullname(self) -> str:
        return fullname(self.name)

    def values_args(self, values: Mapping[str, Any]) -> list[str]:
        args = ["--set", f"image.repository={IMAGE_REPOSITORY}"]
        for key, value in {**self.values, **values}.items():
            args += ["--set-json", f"{key}={json.dumps(value)}"]
        return args

    def install(self, values: Mapping[str, Any] = {}, *, upgrade: bool = False) -> MigrationHook:
        """helm install (or upgrade) with ``values``; the migration hook runs meanwhile. Helm's own
        wait is for hooks only (no pod ever becomes ready here)."""
        hook = MigrationHook(self.cluster, self.namespace, self.name)
        runner = threading.Thread(target=hook.serve, daemon=True)
        runner.start()
        verb = ["upgrade"] if upgrade else ["install"]
        try:
            self.cluster.helm(
                *verb, self.name, str(CHART), "--namespace", self.namespace,
                "--timeout", f"{int(HOOK_TIMEOUT_S)}s", *self.values_args(values),
                timeout=HOOK_TIMEOUT_S + 30,
            )  # fmt: skip
        except KubeCommandError as exc:
            raise InstallFailed(exc, hook) from exc
        finally:
            hook.stop()
            runner.join(timeout=10)
            assert not hook.errors, f"the migration hook's stand-in failed: {hook.errors}"
        return hook

    def uninstall(self) -> None:
        self.cluster.helm(
            "uninstall", self.name, "--namespace", self.namespace, "--wait", "--timeout", "60s", timeout=90
        )

    def manifest(self) -> list[Obj]:
        import yaml

        text = self.cluster.helm("get", "manifest", self.name, "--namespace", self.namespace)
        return [doc for doc in yaml.safe_load_all(text) if doc]

    def hooks(self) -> list[Obj]:
        import yaml

        text = self.cluster.helm("get", "hooks", self.name, "--namespace", self.namespace)
        return [doc for doc in yaml.safe_load_all(text) if doc]


def create_namespace(cluster: Cluster, name: str) -> None:
    try:
        cluster.kubectl("create", "namespace", name)
    except KubeCommandError as exc:
        if "AlreadyExists" not in str(exc):
            raise
