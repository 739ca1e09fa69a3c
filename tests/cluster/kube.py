"""The real API server of scripts/test-cluster, driven with the real kubectl and helm.

``Cluster`` runs kubectl and helm against the admin kubeconfig the script wrote (or a
ServiceAccount's, ``as_service_account``). Every call has a time limit; ``eventually`` polls
with one too. No Kubernetes client library: what an installer types is what the tests run.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "ibex-context"
KUBECONFIG_VARIABLE = "IBEX_TEST_CLUSTER_KUBECONFIG"
KUBECTL_VARIABLE = "IBEX_TEST_CLUSTER_KUBECTL"
COMMAND_TIMEOUT_S = 60.0

Obj = dict[str, Any]
T = TypeVar("T")


class KubeCommandError(Exception):
    def __init__(self, args: Sequence[str], result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(f"{' '.join(args)} exited {result.returncode}: {result.stderr.strip()[:2000]}")
        self.stderr = result.stderr
        self.returncode = result.returncode


@dataclass(frozen=True)
class Cluster:
    kubeconfig: Path
    kubectl_bin: str
    helm_bin: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def run(
        self, program: str, *args: str, input: str | None = None, timeout: float = COMMAND_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [program, *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            cwd=REPO,
            timeout=timeout,
        )

    def kubectl(self, *args: str, input: str | None = None, timeout: float = COMMAND_TIMEOUT_S) -> str:
        result = self.run(self.kubectl_bin, *args, input=input, timeout=timeout)
        if result.returncode != 0:
            raise KubeCommandError(["kubectl", *args], result)
        return result.stdout

    def kubectl_result(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """kubectl whose failure the caller examines (a refusal is the expected outcome)."""
        return self.run(self.kubectl_bin, *args, input=input)

    def helm(self, *args: str, timeout: float = COMMAND_TIMEOUT_S) -> str:
        result = self.run(self.helm_bin, *args, timeout=timeout)
        if result.returncode != 0:
            raise KubeCommandError(["helm", *args], result)
        return result.stdout

    def get(self, kind: str, name: str, namespace: str) -> Obj | None:
        result = self.run(self.kubectl_bin, "get", kind, name, "-n", namespace, "-o", "json")
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise KubeCommandError(["kubectl", "get", kind, name], result)
        found: Obj = json.loads(result.stdout)
        return found

    def list(self, kind: str, namespace: str, selector: str | None = None) -> list[Obj]:
        args = ["get", kind, "-n", namespace, "-o", "json"]
        if selector:
            args += ["-l", selector]
        items: list[Obj] = json.loads(self.kubectl(*args))["items"]
        return items

    def apply(self, manifest: Mapping[str, Any], *extra: str) -> str:
        return self.kubectl("apply", "-f", "-", *extra, input=yaml.safe_dump(dict(manifest)))

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        secret = self.get("secret", name, namespace)
        if secret is None or key not in (secret.get("data") or {}):
            return None
        return base64.b64decode(secret["data"][key]).decode()

    def server_version(self) -> str:
        version: str = json.loads(self.kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"]
        return version

    def as_service_account(self, namespace: str, name: str, directory: Path) -> Cluster:
        """The same server with a token of ServiceAccount ``namespace/name`` (``kubectl create token``):
        what a pod of that ServiceAccount authenticates as, so its RBAC applies."""
        token = self.kubectl("create", "token", name, "-n", namespace, "--duration", "1h").strip()
        config = yaml.safe_load(self.kubectl("config", "view", "--raw", "--minify", "-o", "yaml"))
        user = f"system:serviceaccount:{namespace}:{name}"
        config["users"] = [{"name": user, "user": {"token": token}}]
        config["contexts"][0]["context"]["user"] = user
        path = directory / f"{namespace}-{name}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return Cluster(path, self.kubectl_bin, self.helm_bin)


def eventually(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.25) -> T:
    """Poll until ``predicate`` returns a truthy value; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except (KeyError, IndexError, TypeError, AssertionError, KubeCommandError) as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")
        time.sleep(interval)


def condition(obj: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or ():
        if c.get("type") == type_:
            found: Mapping[str, Any] = c
            return found
    return None
