"""The embedding queue (``embedding.batching``): queued queries run together, orgs'
queries in turns, a write's texts a few at a time on a store worker of their own that
never holds a query up, each turn all queries or all texts to store, abandoned jobs are
not computed."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError, Future

import numpy as np
import pytest
from ibex_context.embedding.batching import EmbeddingQueue, EmbeddingTurn
from ibex_context.errors import QueryExpired
from ibex_context.models import FloatVector

WAIT = 5.0  # seconds: every wait is bounded


class Recorder:
    """An embedding function that records each turn's texts and the thread it ran on;
    ``hold`` blocks the next turns (of queries, or of texts to store, when ``query`` is
    given) until ``release`` is set."""

    def __init__(self) -> None:
        self.turns: list[list[str]] = []
        self.kinds: list[bool] = []  # each turn: were its texts queries?
        self.threads: list[str] = []  # each turn: the worker thread's name
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.held: bool | None = None  # which turns ``hold`` blocks; None: all
        self.fail_on: str | None = None

    def hold(self, *, query: bool | None = None) -> None:
        self.held = query
        self.started.clear()
        self.release.clear()

    def __call__(self, texts: list[str], query: bool) -> list[FloatVector]:
        self.turns.append(list(texts))
        self.kinds.append(query)
        self.threads.append(threading.current_thread().name)
        if self.held is None or self.held == query:
            self.started.set()
            assert self.release.wait(WAIT)
        if self.fail_on in texts:
            raise RuntimeError("inference failed")
        return [np.full(2, float(len(t)), dtype=np.float32) for t in texts]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def queue(recorder: Recorder) -> Iterator[EmbeddingQueue]:
    q = EmbeddingQueue(recorder, workers=1, max_batch=4, name="test-embed")
    yield q
    recorder.release.set()
    q.close()


def lengths(future: Future[list[FloatVector]]) -> list[float]:
    return [float(v[0]) for v in future.result(WAIT)]


def test_each_job_gets_its_own_vectors_in_order(queue: EmbeddingQueue) -> None:
    assert lengths(queue.submit(["a", "bbb", "cc"], query=True)) == [1, 3, 2]
    assert queue.submit([], query=True).result(WAIT) == []


def test_queries_that_queue_behind_a_turn_run_together_in_the_next(
    queue: EmbeddingQueue, recorder: Recorder
) -> None:
    recorder.hold()
    first = queue.submit(["first"], query=True)
    assert recorder.started.wait(WAIT)
    waiting = [queue.submit([text], query=True) for text in ("x", "yy", "zzz", "wwww", "vvvvv")]
    recorder.release.set()
    assert lengths(first) == [5]
    assert [lengths(f) for f in waiting] == [[1], [2], [3], [4], [5]]
    # Four fit a turn; the fifth waits for the next one.
    assert recorder.turns == [["first"], ["x", "yy", "zzz", "wwww"], ["vvvvv"]]


def test_a_flooding_orgs_queries_do_not_hold_another_orgs_query_back(
    queue: EmbeddingQueue, recorder: Recorder
) -> None:
    recorder.hold()
    first = queue.submit(["a0"], query=True, tenant="org-a")
    assert recorder.started.wait(WAIT)
    flood = [queue.submit([f"a{i}"], query=True, tenant="org-a") for i in range(1, 10)]
    quiet = queue.submit(["b0"], query=True, tenant="org-b")
    recorder.release.set()
    assert lengths(quiet) == [2] and lengths(first) == [2]
    assert all(lengths(f) == [2] for f in flood)
    # org-b arrived behind nine of org-a's queries and still runs in the next turn.
    assert recorder.turns[1] == ["b0", "a1", "a2", "a3"]


def test_orgs_waiting_together_alternate_within_a_turn(queue: EmbeddingQueue, recorder: Recorder) -> None:
    recorder.hold()
    first = queue.submit(["start"], query=True, tenant="org-c")
    assert recorder.started.wait(WAIT)
    a = [queue.submit([f"a{i}"], query=True, tenant="org-a") for i in range(3)]
    b = [queue.submit([f"b{i}"], query=True, tenant="org-b") for i in range(3)]
    recorder.release.set()
    for future in (first, *a, *b):
        future.result(WAIT)
    assert recorder.turns[1:] == [["a0", "b0", "a1", "b1"], ["a2", "b2"]]


def test_an_org_whose_queue_just_emptied_still_counts_as_just_served(
    queue: EmbeddingQueue, recorder: Recorder
) -> None:
    recorder.hold()
    first = queue.submit(["a0"], query=True, tenant="org-a")  # org-a served, its queue empty
    assert recorder.started.wait(WAIT)
    again = queue.submit(["a1"], query=True, tenant="org-a")
    other = queue.submit(["b0"], query=True, tenant="org-b")
    recorder.release.set()
    for future in (first, again, other):
        future.result(WAIT)
    assert recorder.turns[1] == ["b0", "a1"]


def test_a_query_does_not_wait_for_a_write_being_embedded(queue: EmbeddingQueue, recorder: Recorder) -> None:
    recorder.hold(query=False)
    write = queue.submit([f"m{i}" for i in range(10)], query=False)
    assert recorder.started.wait(WAIT)  # the write's first chunk is being computed, and stays
    query = queue.submit(["question"], query=True)
    assert lengths(query) == [8]
    assert not write.done()
    recorder.release.set()
    assert lengths(write) == [2.0] * 10
    assert recorder.turns == [
        ["m0", "m1", "m2", "m3"],
        ["question"],
        ["m4", "m5", "m6", "m7"],
        ["m8", "m9"],
    ]
    assert recorder.kinds == [False, True, False, False]
    assert recorder.threads == ["test-embed-store", "test-embed-0", "test-embed-store", "test-embed-store"]


def test_an_orgs_import_does_not_hold_another_orgs_write_behind_all_of_it(
    queue: EmbeddingQueue, recorder: Recorder
) -> None:
    """Org A imports three calls of ten memories; org B's write of two, queued after them,
    used to wait for all of A's eight chunks (a FIFO of jobs)."""
    recorder.hold()
    imports = [queue.submit([f"a{j}.{i}" for i in range(10)], query=False, tenant="org-a") for j in range(3)]
    assert recorder.started.wait(WAIT)  # A's first chunk is being computed
    write = queue.submit(["b0", "b1"], query=False, tenant="org-b")
    recorder.release.set()
    assert lengths(write) == [2.0, 2.0]
    assert all(len(lengths(f)) == 10 for f in imports)
    assert recorder.turns[1] == ["b0", "b1"]
    assert sum(len(t) for t in recorder.turns) == 32 and not any(recorder.kinds)


def test_orgs_writing_together_take_a_chunk_each_in_turn(queue: EmbeddingQueue, recorder: Recorder) -> None:
    recorder.hold()
    first = queue.submit(["start"], query=False, tenant="org-c")
    assert recorder.started.wait(WAIT)
    a = queue.submit([f"a{i}" for i in range(8)], query=False, tenant="org-a")
    b = queue.submit([f"b{i}" for i in range(6)], query=False, tenant="org-b")
    recorder.release.set()
    for future in (first, a, b):
        future.result(WAIT)
    assert recorder.turns[1:] == [
        ["a0", "a1", "a2", "a3"], ["b0", "b1", "b2", "b3"], ["a4", "a5", "a6", "a7"], ["b4", "b5"],
    ]  # fmt: skip


def test_a_job_cancelled_before_its_turn_is_not_computed(queue: EmbeddingQueue, recorder: Recorder) -> None:
    recorder.hold()
    first = queue.submit(["first"], query=True)
    assert recorder.started.wait(WAIT)
    abandoned = queue.submit(["abandoned"], query=True)
    abandoned_write = queue.submit([f"m{i}" for i in range(6)], query=False)
    assert abandoned.cancel() and abandoned_write.cancel()
    kept = queue.submit(["kept"], query=True)
    recorder.release.set()
    assert lengths(first) == [5] and lengths(kept) == [4]
    assert recorder.turns == [["first"], ["kept"]]


def test_a_query_queued_past_its_expiry_is_not_computed_and_fails_as_expired(recorder: Recorder) -> None:
    queue = EmbeddingQueue(recorder, workers=1, max_batch=4, name="test-embed", query_expiry=0.05)
    try:
        recorder.hold()
        first = queue.submit(["first"], query=True)
        assert recorder.started.wait(WAIT)
        stale = queue.submit(["stale"], query=True)
        write = queue.submit(["stored"], query=False)  # writes have no expiry
        time.sleep(0.1)  # the worker is held past the query's expiry
        fresh = queue.submit(["fresh"], query=True)
        recorder.release.set()
        with pytest.raises(QueryExpired, match="queued over 50 ms"):
            stale.result(WAIT)
        assert lengths(first) == [5] and lengths(fresh) == [5] and lengths(write) == [6]
        assert ["stale"] not in recorder.turns and ["fresh"] in recorder.turns
    finally:
        recorder.release.set()
        queue.close()


def test_a_flooding_orgs_backlog_expires_behind_itself_not_a_quiet_orgs_query(recorder: Recorder) -> None:
    queue = EmbeddingQueue(recorder, workers=1, max_batch=4, name="test-embed", query_expiry=0.05)
    try:
        recorder.hold()
        first = queue.submit(["first"], query=True, tenant="flood")
        assert recorder.started.wait(WAIT)
        flood = [queue.submit([f"f{i}"], query=True, tenant="flood") for i in range(12)]
        time.sleep(0.1)  # the flood's backlog is past its expiry
        quiet = queue.submit(["quiet"], query=True, tenant="quiet")
        recorder.release.set()
        assert lengths(first) == [5] and lengths(quiet) == [5]
        for future in flood:
            with pytest.raises(QueryExpired):
                future.result(WAIT)
        assert all(f"f{i}" not in turn for turn in recorder.turns for i in range(12))
    finally:
        recorder.release.set()
        queue.close()


def test_without_an_expiry_a_query_waits_as_long_as_it_takes(
    queue: EmbeddingQueue, recorder: Recorder
) -> None:
    recorder.hold()
    first = queue.submit(["first"], query=True)
    assert recorder.started.wait(WAIT)
    waiting = queue.submit(["waiting"], query=True)
    time.sleep(0.1)
    recorder.release.set()
    assert lengths(first) == [5] and lengths(waiting) == [7]


def test_a_failed_turn_fails_every_job_in_it_and_only_those(
    queue: EmbeddingQueue, recorder: Recorder
) -> None:
    recorder.hold()
    first = queue.submit(["first"], query=True)
    assert recorder.started.wait(WAIT)
    recorder.fail_on = "bad"
    bad, neighbour = queue.submit(["bad"], query=True), queue.submit(["neighbour"], query=True)
    recorder.release.set()
    assert lengths(first) == [5]
    for future in (bad, neighbour):
        with pytest.raises(RuntimeError, match="inference failed"):
            future.result(WAIT)
    recorder.fail_on = None
    assert lengths(queue.submit(["after"], query=True)) == [5]


def test_a_write_whose_chunk_fails_fails_once_and_its_other_chunks_are_dropped(
    queue: EmbeddingQueue, recorder: Recorder
) -> None:
    recorder.fail_on = "m1"
    write = queue.submit([f"m{i}" for i in range(12)], query=False)
    with pytest.raises(RuntimeError):
        write.result(WAIT)
    recorder.fail_on = None
    assert lengths(queue.submit(["after"], query=True)) == [5]
    assert ["m4", "m5", "m6", "m7"] not in recorder.turns


def test_closing_cancels_what_is_queued_and_refuses_more(queue: EmbeddingQueue, recorder: Recorder) -> None:
    recorder.hold()
    queue.submit(["first"], query=True)
    assert recorder.started.wait(WAIT)
    queued = queue.submit(["queued"], query=True)
    queue.close()
    recorder.release.set()
    with pytest.raises(CancelledError):
        queued.result(WAIT)
    with pytest.raises(RuntimeError, match="closed"):
        queue.submit(["late"], query=True)


def test_a_write_is_embedded_while_queries_wait_and_never_shares_their_turn(
    queue: EmbeddingQueue, recorder: Recorder
) -> None:
    recorder.hold(query=True)
    first = queue.submit(["first"], query=True)
    assert recorder.started.wait(WAIT)
    stored = queue.submit(["memory"], query=False)
    asked = [queue.submit([text], query=True) for text in ("q1", "q2")]
    assert lengths(stored) == [6]  # on the store worker, while the query worker is held
    recorder.release.set()
    assert [lengths(f) for f in asked] == [[2], [2]] and lengths(first) == [5]
    assert recorder.turns == [["first"], ["memory"], ["q1", "q2"]]
    assert recorder.kinds == [True, False, True]


def test_a_query_job_larger_than_a_turn_runs_in_chunks_as_queries_on_a_query_worker(
    queue: EmbeddingQueue, recorder: Recorder
) -> None:
    many = queue.submit([f"q{i}" for i in range(6)], query=True)
    assert lengths(many) == [2.0] * 6
    assert recorder.turns == [["q0", "q1", "q2", "q3"], ["q4", "q5"]]
    assert recorder.kinds == [True, True]
    assert recorder.threads == ["test-embed-0", "test-embed-0"]


def test_each_turn_reports_its_queueing_inference_and_cpu_time(recorder: Recorder) -> None:
    turns: list[EmbeddingTurn] = []
    queue = EmbeddingQueue(recorder, workers=1, max_batch=4, name="test-embed", observe=turns.append)
    try:
        recorder.hold(query=False)
        first = queue.submit(["first"], query=False)
        assert recorder.started.wait(WAIT)
        stored = queue.submit(["memory"], query=False)
        time.sleep(0.02)  # "memory" queues behind "first" for at least this long
        recorder.release.set()
        lengths(first), lengths(stored)
        asked = queue.submit(["question"], query=True)
        lengths(asked)
        deadline = time.monotonic() + WAIT
        while len(turns) < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
    finally:
        recorder.release.set()
        queue.close()
    assert [(t.query, t.texts) for t in turns] == [(False, 1), (False, 1), (True, 1)]
    assert turns[1].queued >= 0.02
    # The first turn was held (blocked, off the CPU) for the 20 ms: wall time, not CPU time.
    assert turns[0].computing >= 0.02 > turns[0].on_cpu >= 0.0


def test_a_failing_observer_does_not_stop_the_worker(recorder: Recorder) -> None:
    def broken(turn: EmbeddingTurn) -> None:
        raise ValueError("observer bug")

    queue = EmbeddingQueue(recorder, workers=1, max_batch=4, name="test-embed", observe=broken)
    try:
        assert lengths(queue.submit(["one"], query=True)) == [3]
        assert lengths(queue.submit(["two"], query=True)) == [3]
    finally:
        queue.close()


def test_with_one_query_a_turn_each_query_is_handed_over_when_computed(recorder: Recorder) -> None:
    queue = EmbeddingQueue(recorder, workers=1, max_batch=4, queries_per_turn=1, name="test-embed")
    try:
        recorder.hold()
        first = queue.submit(["first"], query=True)
        assert recorder.started.wait(WAIT)
        waiting = [queue.submit([text], query=True) for text in ("x", "yy", "zzz")]
        several = queue.submit(["q1", "q2"], query=True)  # more than a turn: chunks, still queries
        recorder.release.set()
        assert [lengths(f) for f in (first, *waiting, several)] == [[5], [1], [2], [3], [2, 2]]
    finally:
        recorder.release.set()
        queue.close()
    assert recorder.turns == [["first"], ["x"], ["yy"], ["zzz"], ["q1", "q2"]]
    assert recorder.kinds == [True] * 5


def _nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.parametrize("nice", [0, 5])
def test_workers_run_lower_than_the_process_by_their_nice(nice: int) -> None:
    seen: list[int] = []

    def embed(texts: list[str], query: bool) -> list[FloatVector]:
        seen.append(_nice_of_this_thread())
        return [np.zeros(4, dtype=np.float32) for _ in texts]

    queue = EmbeddingQueue(embed, workers=1, max_batch=4, name="nice-test", nice=nice)
    try:
        queue.submit(["a question"], query=True).result(timeout=WAIT)
    finally:
        queue.close()
    # The thread's own value: the process (this thread) keeps its priority.
    assert seen == [min(19, _nice_of_this_thread() + nice)]


def _policy_of_this_thread() -> int:
    return os.sched_getscheduler(threading.get_native_id())


def _priorities_by_kind(*, nice: int, store_worker_idle: bool = True) -> dict[bool, tuple[int, int]]:
    """Each kind of turn's (scheduling policy, nice) as its worker thread saw them."""
    seen: dict[bool, tuple[int, int]] = {}

    def embed(texts: list[str], query: bool) -> list[FloatVector]:
        seen[query] = (_policy_of_this_thread(), _nice_of_this_thread())
        return [np.zeros(4, dtype=np.float32) for _ in texts]

    queue = EmbeddingQueue(
        embed, workers=1, max_batch=4, name="policy-test", nice=nice, store_worker_idle=store_worker_idle
    )
    try:
        queue.submit(["a question"], query=True).result(timeout=WAIT)
        queue.submit(["a memory"], query=False).result(timeout=WAIT)
    finally:
        queue.close()
    return seen


def test_the_store_worker_runs_only_on_what_the_other_threads_leave_of_the_core() -> None:
    seen = _priorities_by_kind(nice=5)
    assert seen[False][0] == os.SCHED_IDLE
    assert seen[True] == (_policy_of_this_thread(), min(19, _nice_of_this_thread() + 5))


def test_the_store_worker_not_idle_runs_at_the_query_workers_priority() -> None:
    seen = _priorities_by_kind(nice=5, store_worker_idle=False)
    assert seen[False] == seen[True] == (_policy_of_this_thread(), min(19, _nice_of_this_thread() + 5))


def test_a_write_the_store_worker_does_not_reach_is_taken_up_by_an_idle_query_worker_once_overdue() -> None:
    """As where the core has no idle time for the store worker: its turn never ends here."""
    release = threading.Event()
    ran: list[tuple[str, str]] = []

    def embed(texts: list[str], query: bool) -> list[FloatVector]:
        ran.append((texts[0], threading.current_thread().name))
        if threading.current_thread().name.endswith("-store"):
            assert release.wait(WAIT)
        return [np.zeros(4, dtype=np.float32) for _ in texts]

    queue = EmbeddingQueue(embed, workers=1, max_batch=4, name="overdue-test", store_overdue_after=0.05)
    try:
        starved = queue.submit(["w1"], query=False)
        deadline = time.monotonic() + WAIT
        while not ran and time.monotonic() < deadline:
            time.sleep(0.001)
        submitted = time.monotonic()
        write = queue.submit(["w2"], query=False)
        write.result(WAIT)
        assert time.monotonic() - submitted >= 0.05  # not before it was overdue
        assert not starved.done()
    finally:
        release.set()
        queue.close()
    assert ran == [("w1", "overdue-test-store"), ("w2", "overdue-test-0")]


def test_where_the_idle_policy_is_refused_the_store_worker_takes_the_lowest_nice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sandbox may refuse sched_setscheduler: the store worker still yields to the calls."""

    def refuse(pid: int, policy: int, param: os.sched_param) -> None:
        raise PermissionError("sched_setscheduler refused")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    seen = _priorities_by_kind(nice=0)
    assert seen[False] == (_policy_of_this_thread(), 19)
    assert seen[True] == (_policy_of_this_thread(), _nice_of_this_thread())


def test_an_orgs_overdue_import_on_a_query_worker_holds_another_orgs_query_for_one_chunk_at_most() -> None:
    """The hand-off shares the query worker the way one worker took writes before: queries
    first, the import a chunk at a time, so a flooding org cannot keep another's query waiting."""
    release_store, release_chunk, chunk_started = threading.Event(), threading.Event(), threading.Event()
    ran: list[tuple[str, str]] = []

    def embed(texts: list[str], query: bool) -> list[FloatVector]:
        name = threading.current_thread().name
        ran.append((texts[0], name))
        if name.endswith("-store"):
            assert release_store.wait(WAIT)  # a core with no idle time: the store worker never gets on
        elif texts[0] == "a0":
            chunk_started.set()
            assert release_chunk.wait(WAIT)
        return [np.zeros(4, dtype=np.float32) for _ in texts]

    queue = EmbeddingQueue(embed, workers=1, max_batch=4, name="handoff-test", store_overdue_after=0.01)
    try:
        queue.submit(["s0"], query=False, tenant="org-c")
        deadline = time.monotonic() + WAIT
        while not ran and time.monotonic() < deadline:
            time.sleep(0.001)
        imported = queue.submit([f"a{i}" for i in range(8)], query=False, tenant="org-a")
        assert chunk_started.wait(WAIT)  # the import's first chunk, overdue, on the query worker
        asked = queue.submit(["question"], query=True, tenant="org-b")
        release_chunk.set()
        asked.result(WAIT)
        imported.result(WAIT)
    finally:
        release_store.set()
        release_chunk.set()
        queue.close()
    assert ran == [
        ("s0", "handoff-test-store"),
        ("a0", "handoff-test-0"),
        ("question", "handoff-test-0"),
        ("a4", "handoff-test-0"),
    ]
