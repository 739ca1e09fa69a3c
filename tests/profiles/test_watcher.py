"""Hot reload from a ConfigMap-shaped directory, swapped the way the kubelet does it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from ibex_context.errors import ConfigurationError
from ibex_context.profiles.registry import ProfileStore
from ibex_context.profiles.watcher import ProfileWatcher, ReloadOutcome

from .volumes import ConfigMapVolume

# Selector ids are UUIDs, as requests carry them.
A = "aaaaaaaa-0000-4000-8000-000000000000"
ORG = "cccccccc-0000-4000-8000-000000000000"


def profiles(*entries: dict[str, Any]) -> str:
    return json.dumps(
        {"apiVersion": "context.ibex.dev/v1alpha1", "kind": "ContextProfileSet", "profiles": list(entries)}
    )


def weighted(name: str, relevance: float) -> dict[str, Any]:
    return {"name": name, "selector": {"default": True}, "scoring": {"weights": {"relevance": relevance}}}


class Harness:
    def __init__(self, root: Path) -> None:
        self.volume = ConfigMapVolume(root)
        self.store = ProfileStore()
        self.outcomes: list[ReloadOutcome] = []
        self.now = 1000.0
        self.watcher = ProfileWatcher(
            self.volume.path, self.store, self.outcomes.append, interval_s=0.01, clock=lambda: self.now
        )

    def relevance(self) -> float:
        return self.store.resolve("org", "agent").scoring.weights.relevance


@pytest.fixture()
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def test_a_missing_file_at_start_up_means_the_built_in_defaults(h: Harness, caplog: Any) -> None:
    with caplog.at_level(logging.WARNING):
        assert h.watcher.load_initial() is ReloadOutcome.MISSING
    assert h.store.resolve("o", "a").name == "builtin-default"
    assert h.watcher.status.source == "builtin" and h.watcher.status.profile_count == 0
    assert "using the built-in default profile" in caplog.text
    assert h.watcher.poll() is None  # still missing: reported once, not every poll
    # Expected before the operator renders the ConfigMap: no ERROR in every pod's start-up log.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_file_that_vanishes_after_a_load_is_logged_as_an_error(h: Harness, caplog: Any) -> None:
    h.volume.publish(profiles(weighted("good", 0.6)))
    h.watcher.load_initial()
    h.volume.remove()
    with caplog.at_level(logging.INFO):
        assert h.watcher.poll() is ReloadOutcome.MISSING
    assert [r.levelno for r in caplog.records] == [logging.ERROR], caplog.text


def test_an_invalid_file_at_start_up_fails_loudly(h: Harness) -> None:
    h.volume.publish(profiles({"name": "x", "selector": {}}))
    with pytest.raises(ConfigurationError, match="'x': selector"):
        h.watcher.load_initial()


def test_a_kubelet_swap_is_picked_up_on_the_next_poll(h: Harness) -> None:
    h.volume.publish(profiles(weighted("v1", 0.4)))
    assert h.watcher.load_initial() is ReloadOutcome.OK
    first = h.watcher.status
    assert (first.source, first.last_ok, first.profile_count, first.loaded_at) == ("file", True, 1, 1000.0)
    assert h.relevance() == 0.4
    assert h.watcher.poll() is None  # nothing changed

    h.now = 2000.0
    h.volume.publish(
        profiles(
            weighted("v2", 0.9),
            {"name": "agent", "selector": {"agentIds": [A]}},
        )
    )
    assert h.watcher.poll() is ReloadOutcome.OK
    assert h.relevance() == 0.9
    assert h.store.resolve("org", A).name == "agent"
    status = h.watcher.status
    assert (status.profile_count, status.loaded_at) == (2, 2000.0)
    assert status.checksum != first.checksum
    assert h.outcomes == [ReloadOutcome.OK, ReloadOutcome.OK]


def test_a_bad_file_is_rejected_the_old_profiles_stay_and_the_outcome_is_reported(
    h: Harness, caplog: Any
) -> None:
    h.volume.publish(profiles(weighted("good", 0.4)))
    h.watcher.load_initial()
    good_checksum = h.watcher.status.checksum

    bad = profiles(
        weighted("good", 0.4),
        {"name": "secret-sauce", "selector": {"agentIds": ["TOPSECRET"]}, "deadlines": {"assemblyMs": 999}},
    )
    h.volume.publish(bad)
    with caplog.at_level(logging.INFO):
        assert h.watcher.poll() is ReloadOutcome.INVALID
    assert h.relevance() == 0.4
    status = h.watcher.status
    assert status.last_ok is False and status.last_outcome is ReloadOutcome.INVALID
    assert status.last_error is not None and "deadlines.assemblyMs" in status.last_error
    assert (status.checksum, status.profile_count, status.loaded_at) == (good_checksum, 1, 1000.0)
    assert "TOPSECRET" not in caplog.text  # the log names the field, never the content
    assert h.watcher.poll() is None  # the same bad file is reported once

    h.volume.publish(profiles(weighted("fixed", 0.7)))
    assert h.watcher.poll() is ReloadOutcome.OK
    assert h.relevance() == 0.7 and h.watcher.status.last_ok
    assert h.outcomes == [ReloadOutcome.OK, ReloadOutcome.INVALID, ReloadOutcome.OK]


def test_a_file_that_disappears_later_keeps_the_last_good_profiles(h: Harness) -> None:
    h.volume.publish(profiles(weighted("good", 0.6)))
    h.watcher.load_initial()
    h.volume.remove()
    assert h.watcher.poll() is ReloadOutcome.MISSING
    assert h.relevance() == 0.6 and h.watcher.status.last_error == "file not found"
    assert h.watcher.poll() is None

    h.volume.publish(profiles(weighted("good", 0.6)))  # the same content comes back
    assert h.watcher.poll() is ReloadOutcome.OK
    assert h.watcher.status.last_ok


def test_an_in_place_edit_of_a_plain_file_is_picked_up_too(tmp_path: Path) -> None:
    path = tmp_path / "profiles.json"
    path.write_text(profiles(weighted("a", 0.3)))
    store = ProfileStore()
    watcher = ProfileWatcher(path, store)
    watcher.load_initial()
    path.write_text(
        profiles(
            weighted("a", 0.35),
            weighted("b", 0.1) | {"selector": {"orgIds": [ORG]}},
        )
    )
    assert watcher.poll() is ReloadOutcome.OK
    assert store.resolve("x", "y").scoring.weights.relevance == 0.35


def test_a_failing_callback_does_not_stop_reloads(h: Harness) -> None:
    def explode(_outcome: ReloadOutcome) -> None:
        raise RuntimeError("metrics backend down")

    watcher = ProfileWatcher(h.volume.path, h.store, explode)
    h.volume.publish(profiles(weighted("a", 0.5)))
    assert watcher.load_initial() is ReloadOutcome.OK
    assert h.relevance() == 0.5


async def test_the_background_task_reloads_without_being_asked(h: Harness) -> None:
    h.volume.publish(profiles(weighted("v1", 0.4)))
    h.watcher.load_initial()
    h.watcher.start()
    try:
        h.volume.publish(profiles(weighted("v2", 0.8)))
        for _ in range(500):
            if h.relevance() == 0.8:
                break
            await asyncio.sleep(0.01)
        assert h.relevance() == 0.8
    finally:
        await h.watcher.stop()
    h.volume.publish(profiles(weighted("v3", 0.1)))
    await asyncio.sleep(0.05)
    assert h.relevance() == 0.8  # stopped: no more reloads


def test_an_unreadable_file_is_reported_once_and_the_profiles_stay(h: Harness) -> None:
    h.volume.publish(profiles(weighted("good", 0.6)))
    h.watcher.load_initial()
    h.volume.path.unlink()
    os.symlink("profiles.json", h.volume.path)  # a symlink loop: stat fails with ELOOP, even for root
    assert h.watcher.poll() is ReloadOutcome.UNREADABLE
    assert h.watcher.status.last_error == "OSError"
    assert h.watcher.poll() is None
    assert h.relevance() == 0.6
    h.volume.path.unlink()
    os.symlink("..data/profiles.json", h.volume.path)
    assert h.watcher.poll() is ReloadOutcome.OK
