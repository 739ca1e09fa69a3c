"""Hot reload of the profiles file mounted from the operator's ConfigMap.

The kubelet updates a ConfigMap volume by writing a new ``..<timestamp>``
directory and renaming a temporary symlink over ``..data``; ``profiles.json``
is a symlink through ``..data``. So following the path with ``stat`` sees a new
inode after every update. The watcher polls that (one ``stat`` per interval:
cheaper than an inotify dependency and it works on every volume type), reads
and validates the whole file when it changed, and swaps the store's registry
in one assignment. A bad or vanished file keeps the last good set; the outcome
goes to ``on_reload`` (the reload metric) and to ``status`` (the health page).
Log lines carry the path, checksum and error location, never file content.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from ibex_context_client.tasks import cancel_and_wait

from ibex_context.errors import ConfigurationError
from ibex_context.profiles.loader import load_profiles_file
from ibex_context.profiles.registry import ProfileRegistry, ProfileStore

_log = logging.getLogger(__name__)


class ReloadOutcome(enum.StrEnum):
    """Label values of ``ibex_context_profile_reloads_total{outcome}``."""

    OK = "ok"
    INVALID = "invalid"
    MISSING = "missing"
    UNREADABLE = "unreadable"


@dataclass(frozen=True, slots=True)
class WatcherStatus:
    path: str
    source: Literal["file", "builtin"]
    last_ok: bool
    last_outcome: ReloadOutcome | None
    last_error: str | None
    loaded_at: float | None
    profile_count: int
    checksum: str | None


_Signature = tuple[str, int, int, int, int]


def _signature(path: Path) -> _Signature:
    # realpath changes on every kubelet swap; inode/mtime/size catch in-place edits.
    st = os.stat(path)
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class ProfileWatcher:
    def __init__(
        self,
        path: Path,
        store: ProfileStore,
        on_reload: Callable[[ReloadOutcome], None] = lambda _outcome: None,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._path = path
        self._store = store
        self._on_reload = on_reload
        self._interval_s = interval_s
        self._clock = clock
        self._signature: _Signature | None = None
        self._task: asyncio.Task[None] | None = None
        self._status = WatcherStatus(
            path=str(path),
            source="builtin",
            last_ok=True,
            last_outcome=None,
            last_error=None,
            loaded_at=None,
            profile_count=0,
            checksum=None,
        )

    @property
    def status(self) -> WatcherStatus:
        return self._status

    def load_initial(self) -> ReloadOutcome:
        """Load at start-up. A missing file means the built-in defaults; a bad one raises.

        Raises ConfigurationError for an invalid file: starting with settings nobody
        asked for would hide the mistake, and the operator never renders a bad file.
        """
        outcome = self.poll()
        if outcome is ReloadOutcome.INVALID or outcome is ReloadOutcome.UNREADABLE:
            raise ConfigurationError(f"profiles file {self._path}: {self._status.last_error}")
        if outcome is ReloadOutcome.MISSING:
            _log.warning("profiles file %s not found; using the built-in default profile", self._path)
        return outcome or ReloadOutcome.OK

    def poll(self) -> ReloadOutcome | None:
        """Check the file once; reload if it changed. Returns None when nothing changed."""
        try:
            signature = _signature(self._path)
        except FileNotFoundError:
            if self._signature is None and self._status.last_outcome is ReloadOutcome.MISSING:
                return None
            self._signature = None
            # Never loaded yet (e.g. the operator has not rendered the ConfigMap): expected, not an error.
            # A file that vanishes after a load stays an ERROR.
            never_loaded = self._status.source != "file"
            return self._report(
                ReloadOutcome.MISSING, "file not found", level=logging.INFO if never_loaded else logging.ERROR
            )
        except OSError as exc:
            return self._report_once(ReloadOutcome.UNREADABLE, type(exc).__name__)
        if signature == self._signature:
            return None
        try:
            profile_set = load_profiles_file(self._path)
        except FileNotFoundError:
            # Swapped away between stat and read; the next poll sees the new file.
            return None
        except ConfigurationError as exc:
            self._signature = signature
            return self._report(ReloadOutcome.INVALID, str(exc))
        except OSError as exc:
            return self._report_once(ReloadOutcome.UNREADABLE, type(exc).__name__)
        self._signature = signature
        if profile_set.checksum == self._status.checksum and self._status.last_ok:
            return None
        self._store.swap(ProfileRegistry(profile_set.bindings))
        self._status = WatcherStatus(
            path=str(self._path),
            source="file",
            last_ok=True,
            last_outcome=ReloadOutcome.OK,
            last_error=None,
            loaded_at=self._clock(),
            profile_count=len(profile_set.bindings),
            checksum=profile_set.checksum,
        )
        conflicts = self._store.current.conflicts
        _log.info(
            "profiles loaded from %s: %d profiles, checksum %s, %d conflicts",
            self._path,
            len(profile_set.bindings),
            profile_set.checksum[:12],
            len(conflicts),
        )
        self._notify(ReloadOutcome.OK)
        return ReloadOutcome.OK

    def _report_once(self, outcome: ReloadOutcome, error: str) -> ReloadOutcome | None:
        # An unreadable file stays unreadable for a while: report it once, not every poll.
        # Forget the signature so the same file, readable again, is read and reported OK.
        self._signature = None
        if (self._status.last_outcome, self._status.last_error) == (outcome, error):
            return None
        return self._report(outcome, error)

    def _report(self, outcome: ReloadOutcome, error: str, *, level: int = logging.ERROR) -> ReloadOutcome:
        # The current registry stays: a bad or vanished file never replaces a good set.
        self._status = replace(self._status, last_ok=False, last_outcome=outcome, last_error=error)
        _log.log(
            level,
            "profiles reload from %s: %s (%s); keeping the %d profiles in use",
            self._path,
            outcome.value,
            error,
            self._status.profile_count,
        )
        self._notify(outcome)
        return outcome

    def _notify(self, outcome: ReloadOutcome) -> None:
        try:
            self._on_reload(outcome)
        except Exception:
            _log.exception("profiles reload callback failed")

    async def run(self) -> None:
        """Poll forever; cancel the task to stop."""
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                self.poll()
            except Exception:  # a bug here must not end hot reload for the life of the process
                _log.exception("profiles watcher poll failed")

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="ibex-profile-watcher")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
