"""The operator as the chart's Deployment runs it, as a process (no kubelet runs its pod).

``start_operator`` takes the Deployment the release stored on the API server and starts its
container's command with that container's environment (values; metadata.namespace from the
downward API), logged in with a token of the Deployment's ServiceAccount (``kubectl create
token``): the operator has exactly the RBAC the chart grants it. Only its listening ports move
(to free loopback ports) so that several replicas share this machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cluster.kube import Cluster, Obj

STOP_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class OperatorProcess:
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def crash(self) -> None:
        """SIGKILL: no goodbye to the peering object, as when a node dies."""
        self.process.kill()
        self.process.wait(5)


def _command(container: Mapping[str, Any]) -> list[str]:
    words: list[str] = [*container["command"], *(container.get("args") or [])]
    program, args = words[0], words[1:]
    # The image's console script, from the environment these tests run in.
    installed = Path(sys.executable).parent / program
    return [str(installed) if installed.exists() else program, *args]


def _environment(container: Mapping[str, Any], namespace: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in container.get("env") or ():
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
            continue
        field_path = entry["valueFrom"]["fieldRef"]["fieldPath"]
        assert field_path == "metadata.namespace", f"env {entry['name']}: unsupported {field_path}"
        env[entry["name"]] = namespace
    return env


def start_operator(cluster: Cluster, deployment: Obj, log_dir: Path, tag: str) -> OperatorProcess:
    namespace = deployment["metadata"]["namespace"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "operator"]
    as_pod = cluster.as_service_account(namespace, pod["serviceAccountName"], log_dir)
    env = {
        **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "PYTHONPATH", "LANG")},
        **_environment(container, namespace),
        "KUBECONFIG": str(as_pod.kubeconfig),
        "IBEX_OPERATOR_METRICS_PORT": str(free_port()),
        "IBEX_OPERATOR_LIVENESS": f"http://127.0.0.1:{free_port()}/healthz",
        "IBEX_OPERATOR_LOG_FORMAT": "plain",
    }
    log = log_dir / f"operator-{tag}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(_command(container), env=env, stdout=out, stderr=subprocess.STDOUT)
    return OperatorProcess(process, log)
