"""Redis as platform teams run it, on this machine: a Redis Cluster of a few primaries
and a Sentinel set (a primary, a replica, three sentinels), all ``redis-server``
child processes (``embedded.RedisProcess``: stopped with their owner, no
persistence). For tests and for trying the service against either.

Every wait here is bounded; a set that does not come up raises StoreUnavailable
naming the directory of its logs.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

from ibex_context.devtools.embedded import RedisProcess, redis_server_binary
from ibex_context.errors import StoreUnavailable

SENTINEL_MASTER = "ibex"


def _wait_for(condition: Callable[[], bool], timeout: float, what: str, logs: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            if condition():
                return
        time.sleep(0.05)
    raise StoreUnavailable(f"{what} within {timeout} s; see the logs under {logs}")


def _client(port: int, password: str | None = None) -> redis.Redis:
    return redis.Redis(port=port, password=password, socket_timeout=2.0, socket_connect_timeout=1.0)


class RedisClusterProcesses:
    """``primaries`` cluster nodes on 127.0.0.1 (no replicas), the 16384 slots spread
    over them by ``redis-cli --cluster create``. ``url`` names the first (a seed).
    A node stopped and started again (same port, same ``nodes.conf``) serves its
    slots again, empty."""

    def __init__(self, data_dir: Path, primaries: int = 3) -> None:
        self.data_dir = data_dir
        self.nodes = [
            RedisProcess(
                data_dir / f"node{index}",
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    # A node down fails its own slots only (the others keep serving).
                    "--cluster-require-full-coverage",
                    "no",
                ),
            )
            for index in range(primaries)
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def start(self, timeout: float = 60.0) -> None:
        for node in self.nodes:
            node.start()
        cli = redis_server_binary().with_name("redis-cli")
        addresses = [f"127.0.0.1:{port}" for port in self.ports]
        created = subprocess.run(
            [str(cli), "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if created.returncode != 0:
            (self.data_dir / "cluster-create.log").write_bytes(created.stdout + created.stderr)
            raise StoreUnavailable(
                f"redis-cli --cluster create failed; see {self.data_dir / 'cluster-create.log'}"
            )

        def every_node_ok() -> bool:
            for port in self.ports:
                with _client(port) as node:
                    if node.cluster("INFO").get("cluster_state") != "ok":
                        return False
            return True

        _wait_for(every_node_ok, timeout, "the cluster did not report cluster_state:ok", self.data_dir)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class RedisSentinelSet:
    """A primary, one replica of it and three sentinels monitoring it as
    ``SENTINEL_MASTER`` (quorum 2, a primary is down after 1 s unanswered).
    ``sentinels`` are ``host:port`` entries, as IBEX_REDIS_SENTINELS takes them.
    ``password``: the primary's and the replica's (requirepass, masterauth, and the
    sentinels' auth-pass); ``sentinel_password``: the sentinels' own."""

    def __init__(
        self, data_dir: Path, *, password: str | None = None, sentinel_password: str | None = None
    ) -> None:
        self.data_dir = data_dir
        self.password = password
        self.sentinel_password = sentinel_password
        self._auth = ("--requirepass", password, "--masterauth", password) if password else ()
        self.primary = RedisProcess(data_dir / "primary", extra_args=self._auth)
        self.replica: RedisProcess | None = None
        self.sentinel_processes: list[RedisProcess] = []

    @property
    def sentinels(self) -> list[str]:
        return [f"127.0.0.1:{process.port}" for process in self.sentinel_processes]

    @property
    def servers(self) -> list[RedisProcess]:
        return [self.primary, *([self.replica] if self.replica is not None else [])]

    def start(self, timeout: float = 60.0) -> None:
        self.primary.start()
        self.replica = RedisProcess(
            self.data_dir / "replica",
            extra_args=(*self._auth, "--replicaof", "127.0.0.1", str(self.primary.port)),
        )
        self.replica.start()
        for index in range(3):
            directory = self.data_dir / f"sentinel{index}"
            directory.mkdir(parents=True, exist_ok=True)
            config = directory / "sentinel.conf"  # sentinels rewrite it: one each
            lines = [
                f"sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {self.primary.port} 2",
                f"sentinel down-after-milliseconds {SENTINEL_MASTER} 1000",
                f"sentinel failover-timeout {SENTINEL_MASTER} 10000",
            ]
            if self.password:
                lines.append(f"sentinel auth-pass {SENTINEL_MASTER} {self.password}")
            if self.sentinel_password:
                # Its own password, which it also uses with the other sentinels.
                lines += [
                    f"requirepass {self.sentinel_password}",
                    f"sentinel sentinel-pass {self.sentinel_password}",
                ]
            config.write_text("\n".join(lines) + "\n")
            sentinel = RedisProcess(directory, config_file=config, extra_args=("--sentinel",))
            sentinel.start()
            self.sentinel_processes.append(sentinel)

        def ready() -> bool:
            with _client(self.replica.port if self.replica else 0, self.password) as replica:
                if replica.info("replication").get("master_link_status") != "up":
                    return False
            for process in self.sentinel_processes:
                with _client(process.port, self.sentinel_password) as sentinel:
                    # Each knows the replica and the two other sentinels: a failover can run.
                    if len(sentinel.sentinel_slaves(SENTINEL_MASTER)) < 1:
                        return False
                    if len(sentinel.sentinel_sentinels(SENTINEL_MASTER)) < 2:
                        return False
            return True

        _wait_for(ready, timeout, "the sentinels did not see the replica and each other", self.data_dir)

    def primary_port(self) -> int:
        """The port of the primary the sentinels name now."""
        with _client(self.sentinel_processes[0].port, self.sentinel_password) as sentinel:
            _host, port = sentinel.sentinel_get_master_addr_by_name(SENTINEL_MASTER)
        return int(port)

    def failover(self, timeout: float = 60.0) -> int:
        """Forces a failover (SENTINEL FAILOVER) and waits until the replica is the
        primary, every sentinel names it and the old primary replicates from it;
        returns the new primary's port."""
        old = self.primary_port()
        with _client(self.sentinel_processes[0].port, self.sentinel_password) as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", SENTINEL_MASTER)

        def switched() -> bool:
            ports = set()
            for process in self.sentinel_processes:
                with _client(process.port, self.sentinel_password) as sentinel:
                    ports.add(int(sentinel.sentinel_get_master_addr_by_name(SENTINEL_MASTER)[1]))
            if ports == {old} or len(ports) != 1:
                return False
            (new,) = ports
            with _client(new, self.password) as primary:
                if primary.info("replication").get("role") != "master":
                    return False
            with _client(old, self.password) as demoted:
                return bool(demoted.info("replication").get("master_link_status") == "up")

        _wait_for(switched, timeout, "the sentinels did not fail over", self.data_dir)
        return self.primary_port()

    def stop(self) -> None:
        for process in [*self.sentinel_processes, *self.servers]:
            process.stop()


@contextlib.contextmanager
def redis_cluster(data_dir: Path, primaries: int = 3) -> Iterator[RedisClusterProcesses]:
    cluster = RedisClusterProcesses(data_dir, primaries)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def redis_sentinel_set(
    data_dir: Path, *, password: str | None = None, sentinel_password: str | None = None
) -> Iterator[RedisSentinelSet]:
    sentinels = RedisSentinelSet(data_dir, password=password, sentinel_password=sentinel_password)
    try:
        sentinels.start()
        yield sentinels
    finally:
        sentinels.stop()
