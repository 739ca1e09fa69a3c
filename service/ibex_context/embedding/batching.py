"""Worker threads that run a blocking embedding function over queued texts.

Two things a plain thread pool does not do, both measured on MiniLM (docs/adr/0011):

* **Queries waiting together run as one batch.** While a worker computes, the queries
  that arrive queue up; the next turn takes all of them (up to ``queries_per_turn``
  texts, by default ``max_batch``) in one inference. A batch of 4 short queries costs
  ~7.5 ms of CPU a text against ~11 ms alone (fp32, on the EPYC), and nobody waits for a
  batch to fill: a query alone runs alone, at once. (MiniLM's int8 queries run one a
  turn, ``queries_per_turn=1``: of mixed lengths they saved no CPU together, and each
  waited for its whole turn; ``embedding.minilm.QUERIES_PER_TURN``.)
* **Orgs take turns.** Queued queries wait per org (``submit``'s ``tenant``), and a
  turn takes them one at a time from the org served longest ago: an org that floods the
  process queues behind itself, and another org's query goes into the next turn
  however many of the flood's wait (a plain FIFO put it behind all of them).
* **A query nobody waits for any more is not computed** (``query_expiry``): a caller
  that searches with a stand-in vector once its own is late (``pipeline.retrieval``)
  leaves its query queued; computing it anyway would make every later query later.
* **Writes never hold a query up.** Texts to store are embedded by a thread of their
  own, the store worker, never by the query workers: a query does not wait for a
  write's inference (MiniLM in fp32 takes 10-90 ms of a core for one memory, longer
  than a call's whole deadline). The store worker runs under Linux's ``SCHED_IDLE``
  policy (``run_when_idle``): any other thread that wants its core takes the core at
  once, so writes are embedded in the time the calls leave free, however many are
  queued. A write of many texts is run a chunk of ``max_batch`` at a time.
* **Writes are not starved either.** Where the calls (or anything else on the core) leave
  it no idle time, a write that has waited ``store_overdue_after`` (1 s) is taken up by a
  query worker when it has no query: at the query workers' priority, a chunk at a time
  with queries first, as one worker took writes before. A core full for a second is
  overloaded anyway; its writes then slow down, and do not stop.
* **Writes take turns by org too.** Chunks are taken from the org served longest ago,
  so an org importing thousands of memories delays another org's write by a chunk a
  turn, not by its whole import (a FIFO of jobs put the other write behind every job
  the import had queued).
* **A job of more queries than a turn holds** runs on the query workers a chunk at a
  time, after the queries queued before each chunk.

* **Query workers may run below the event loop** (``nice``): an inference holds a core
  for milliseconds, the loop's work on each call for a fraction of one; with the
  workers' nice value raised, the loop takes the core first and answers on time
  (``lower_thread_priority``).

Each turn is all queries or all texts to store, and the embedding function is told
which: an embedder may embed queries with a cheaper model (MiniLM's int8 graph) than
the texts it stores.

A job whose future was cancelled before its turn is not computed.

Each turn's timings go to ``observe`` when given (``EmbeddingTurn``): how long its
oldest job queued, how long the inference took, and how much of that the worker thread
spent on a core. The difference is time the worker was ready but waited for a core or
for the GIL, which the process's other threads (the event loop, grpc's poller) hold.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from ibex_context.errors import QueryExpired
from ibex_context.models import FloatVector
from ibex_context.org_turns import OrgTurns

# (texts, whether they are queries) -> their vectors, in order.
EmbedBatch = Callable[[list[str], bool], list[FloatVector]]

_log = logging.getLogger(__name__)


def lower_thread_priority(by: int) -> None:
    """Raises the calling thread's nice value by ``by`` (at most to 19): Linux schedules
    each thread by its own. A worker that computes for milliseconds at a time then gives
    the core to the event loop whenever the loop has work, instead of taking its turn with
    it: the loop answers every call by its deadline, and its work (a few hundred
    microseconds a stage) delays an inference by little. The worker then yields to every
    other thread of nice 0 on its core, other processes' too: worth it where the process
    has its cores to itself (a container's cgroup). Raising one's own nice needs no
    privilege. Elsewhere than Linux, or at 0, nothing changes."""
    if by <= 0 or sys.platform != "linux":
        return
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + by))
    except OSError as exc:  # a sandbox that forbids it: the worker runs as the loop does
        _log.warning("embedding worker priority unchanged", extra={"error": type(exc).__name__})


def run_when_idle() -> None:
    """Puts the calling thread under Linux's ``SCHED_IDLE`` policy: it runs only on what
    the threads of the normal policy leave of its core, and any of them that wakes takes
    the core from it at once (a raised nice value only shrinks its share, and a woken
    thread may still wait for its slice to end). For work nobody waits on within a call's
    deadline. A thread may lower its own policy without privilege; where it cannot
    (elsewhere than Linux, or a sandbox that forbids it) it takes the lowest nice, 19."""
    if sys.platform != "linux":
        return
    try:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
    except OSError as exc:
        _log.warning("embedding store worker not idle-scheduled", extra={"error": type(exc).__name__})
        lower_thread_priority(19)


@dataclass(frozen=True, slots=True)
class EmbeddingTurn:
    """What one turn of a worker cost: seconds, by ``time.perf_counter`` and the worker
    thread's ``time.thread_time``."""

    query: bool
    texts: int
    queued: float  # from its oldest job's submission to the inference's start
    computing: float  # the inference, wall time
    on_cpu: float  # the worker thread's CPU time during it


TurnObserver = Callable[[EmbeddingTurn], None]


@dataclass(eq=False, slots=True)
class _Job:
    texts: list[str]
    future: Future[list[FloatVector]]
    query: bool
    tenant: str = ""
    submitted: float = field(default_factory=time.perf_counter)
    results: list[FloatVector | None] = field(default_factory=list)
    next_offset: int = 0  # bulk: the first text no worker has taken yet
    pending: int = 0  # bulk: texts taken and not yet computed, plus those not taken
    failed: bool = False


@dataclass(frozen=True, slots=True)
class _Turn:
    """What one worker computes in one call of the embedding function."""

    texts: list[str]
    # (job, offset in the job, how many texts), in ``texts`` order.
    parts: list[tuple[_Job, int, int]]
    query: bool

    @property
    def submitted(self) -> float:
        """When its oldest job was submitted."""
        return min(job.submitted for job, _, _ in self.parts)


class EmbeddingQueue:
    """``workers`` threads computing ``embed_batch`` over the queries handed to ``submit``,
    and one more over the texts to store."""

    def __init__(
        self,
        embed_batch: EmbedBatch,
        *,
        workers: int,
        max_batch: int,
        name: str,
        queries_per_turn: int | None = None,
        observe: TurnObserver | None = None,
        query_expiry: float | None = None,
        nice: int = 0,
        store_worker_idle: bool = True,
        store_overdue_after: float = 1.0,
    ) -> None:
        """``workers``: the query workers. ``queries_per_turn``: 1 for an embedding function
        that computes queries one at a time anyway, so each query's result is handed over as
        soon as it is computed. ``query_expiry``: seconds after its submission when a query
        still queued is no longer computed; its future fails with ``QueryExpired`` (its
        caller has moved on). ``nice``: how much lower than the process the query workers
        run (``lower_thread_priority``). ``store_worker_idle``: the store worker runs under
        ``SCHED_IDLE`` (``run_when_idle``); False: at the query workers' priority.
        ``store_overdue_after``: seconds after which a write still queued may be taken up
        by an idle query worker too."""
        if workers < 1 or max_batch < 1 or (queries_per_turn is not None and queries_per_turn < 1):
            raise ValueError("workers, max_batch and queries_per_turn must be at least 1")
        self._query_expiry = query_expiry
        self._queries_per_turn = queries_per_turn or max_batch
        self._embed_batch = embed_batch
        self._observe = observe
        self._max_batch = max_batch
        self._store_overdue_after = store_overdue_after
        # Queued per tenant, taken in turns (``org_turns``).
        self._queries: OrgTurns[_Job] = OrgTurns()
        self._query_chunks: OrgTurns[_Job] = OrgTurns()  # query jobs of more than a turn
        self._stored: OrgTurns[_Job] = OrgTurns()  # texts to store
        self._closed = False
        # One lock; the query workers and the store worker wait on conditions of their own,
        # so a write wakes the store worker and a query a query worker.
        self._lock = threading.Lock()
        self._query_ready = threading.Condition(self._lock)
        self._store_ready = threading.Condition(self._lock)
        at_query_priority = functools.partial(lower_thread_priority, nice)
        self._threads = [
            threading.Thread(
                target=self._work,
                args=(self._next_query_turn, at_query_priority),
                name=f"{name}-{i}",
                daemon=True,
            )
            for i in range(workers)
        ]
        self._threads.append(
            threading.Thread(
                target=self._work,
                args=(
                    self._next_store_turn,
                    run_when_idle if store_worker_idle else at_query_priority,
                ),
                name=f"{name}-store",
                daemon=True,
            )
        )
        for thread in self._threads:
            thread.start()

    def submit(self, texts: Sequence[str], *, query: bool, tenant: str = "") -> Future[list[FloatVector]]:
        """The vectors of ``texts`` (queries, or texts to store), in order, once a worker
        has computed them. ``tenant``: whose texts they are (queued per tenant)."""
        future: Future[list[FloatVector]] = Future()
        job = _Job(list(texts), future, query, tenant)
        if not job.texts:
            future.set_result([])
            return future
        with self._lock:
            if self._closed:
                raise RuntimeError("the embedding queue is closed")
            if query and len(job.texts) <= self._queries_per_turn:
                self._queries.add(tenant, job)
                self._query_ready.notify()
                return future
            job.results = [None] * len(job.texts)
            job.pending = len(job.texts)
            if query:
                self._query_chunks.add(tenant, job)
                self._query_ready.notify()
            else:
                self._stored.add(tenant, job)
                self._store_ready.notify()
                self._query_ready.notify()  # a query worker waiting idle times the write's overdue
        return future

    def close(self) -> None:
        """Stops the workers after their current turn; queued jobs are cancelled."""
        with self._lock:
            self._closed = True
            for job in (*self._queries, *self._query_chunks, *self._stored):
                job.future.cancel()
            self._queries.clear()
            self._query_chunks.clear()
            self._stored.clear()
            self._query_ready.notify_all()
            self._store_ready.notify_all()

    def _work(self, next_turn: Callable[[], _Turn | None], prioritise: Callable[[], None]) -> None:
        prioritise()
        while (turn := next_turn()) is not None:
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                vectors = self._embed_batch(turn.texts, turn.query)
            except BaseException as exc:  # handed to every job of the turn, never lost
                self._fail(turn, exc)
                continue
            timing = EmbeddingTurn(
                query=turn.query,
                texts=len(turn.texts),
                queued=started - turn.submitted,
                computing=time.perf_counter() - started,
                on_cpu=time.thread_time() - cpu,
            )
            self._deliver(turn, vectors)
            if self._observe is not None:
                try:
                    self._observe(timing)
                except Exception:  # an observer's failure must not stop the worker
                    _log.exception("embedding turn observer failed")

    def _next_query_turn(self) -> _Turn | None:
        with self._query_ready:
            while True:
                if self._closed:
                    return None
                turn = (
                    self._take_queries() or self._take_chunk(self._query_chunks) or self._take_overdue_write()
                )
                if turn is not None:
                    return turn
                # Woken by a query, or when the oldest write queued becomes overdue.
                oldest = min((job.submitted for job in self._stored), default=None)
                self._query_ready.wait(
                    None
                    if oldest is None
                    else max(0.001, oldest + self._store_overdue_after - time.perf_counter())
                )

    def _take_overdue_write(self) -> _Turn | None:
        """A chunk of a write queued over ``store_overdue_after`` ago, for a query worker."""
        overdue_before = time.perf_counter() - self._store_overdue_after
        return self._take_chunk(self._stored, lambda job: job.submitted <= overdue_before)

    def _next_store_turn(self) -> _Turn | None:
        with self._store_ready:
            while True:
                if self._closed:
                    return None
                turn = self._take_chunk(self._stored)
                if turn is not None:
                    return turn
                self._store_ready.wait()

    def _take_queries(self) -> _Turn | None:
        texts: list[str] = []
        parts: list[tuple[_Job, int, int]] = []
        room = self._queries_per_turn
        expiry = self._query_expiry
        expired_before = -math.inf if expiry is None else time.perf_counter() - expiry
        while room and (job := self._next_query(room)) is not None:
            if not job.future.set_running_or_notify_cancel():
                continue  # its caller has gone
            if job.submitted < expired_before:
                job.future.set_exception(QueryExpired(f"queued over {(expiry or 0) * 1000:.0f} ms"))
                continue
            parts.append((job, 0, len(job.texts)))
            texts.extend(job.texts)
            room -= len(job.texts)
        return _Turn(texts, parts, query=True) if parts else None

    def _next_query(self, room: int) -> _Job | None:
        """The first queued query of the org served longest ago whose first query fits
        in ``room`` texts (taken off its queue), or None."""
        head = self._queries.take(lambda first: len(first.texts) <= room)
        return None if head is None else head[1]

    def _take_chunk(self, jobs: OrgTurns[_Job], fits: Callable[[_Job], bool] | None = None) -> _Turn | None:
        """The next ``max_batch`` texts of the first of ``jobs`` of the org served longest ago
        (of the orgs whose first job ``fits``)."""
        while (head := jobs.first(fits)) is not None:
            tenant, job = head
            if job.next_offset == 0 and not job.future.set_running_or_notify_cancel():
                jobs.remove(tenant, job)  # its caller has gone: no turn taken
                continue
            start = job.next_offset
            count = min(self._max_batch, len(job.texts) - start)
            job.next_offset += count
            jobs.served(tenant)
            if job.next_offset == len(job.texts):
                jobs.remove(tenant, job)
            return _Turn(job.texts[start : start + count], [(job, start, count)], job.query)
        return None

    def _deliver(self, turn: _Turn, vectors: list[FloatVector]) -> None:
        at = 0
        for job, offset, count in turn.parts:
            computed = vectors[at : at + count]
            at += count
            if not job.results:  # a query: all of its texts were in this turn
                job.future.set_result(computed)
                continue
            with self._lock:
                job.results[offset : offset + count] = computed
                job.pending -= count
                done = job.pending == 0 and not job.failed
            if done:
                job.future.set_result([v for v in job.results if v is not None])

    def _fail(self, turn: _Turn, exc: BaseException) -> None:
        for job, _, _ in turn.parts:
            with self._lock:
                first = not job.failed
                job.failed = True
                # Its other chunks are not worth computing.
                (self._query_chunks if job.query else self._stored).remove(job.tenant, job)
            if first:
                job.future.set_exception(exc)
