"""Fair admission: which AssembleContext calls a process assembles when several orgs call it.

A process assembles at most ``limit`` calls at once (``IBEX_MAX_CONCURRENT_ASSEMBLIES``);
a call it does not assemble is answered at once with the caller's messages (pass-through,
ADR-0007). One pool for everyone let one org's flood turn every other org's calls into
pass-through answers. Here the pool is shared by the orgs that called in the last
``active_seconds`` (``IBEX_ORG_ACTIVE_SECONDS``), by weight (a ContextProfile's
``admission.weight``, 1 by default):

* an org's **share** is ``max(1, floor(limit * weight / active weight))`` slots; alone, the
  whole pool;
* while a slot is free, every call is assembled (below saturation nothing changes), except
  that for half a second after the pool was full an org over its share does not take the
  last free slot: under a flood a quiet org's call then runs beside fewer of the flood's;
* once the pool is full, a call of an org **at or over its share** is shed with
  ``org_over_share`` (``overloaded`` for an org alone, as before), and a call of an org
  **within its share** is assembled above the limit (never above twice it) if an org over
  its share holds part of the pool: a quiet org is not made to wait for a flood to finish,
  and the flood's next calls are shed until the process is back under the limit;
* slots are not the core. While the process's CPU is **busy** (``IBEX_ADMISSION_CPU_BUSY``
  of what it may use, ``server/cpu.py``; and for a second after) and other orgs are
  active, the cores are shared: an org that **asks** for well over its weighted share of
  the process's cores (its calls in flight averaged over about a second, scaled up by its
  calls over those admitted) holds at most that share (one call at least), and starts a
  call only onto a free core, never beside another org's call. A flood then runs one call
  at a time, between a quiet org's calls, and the quiet org's calls keep their deadline (a
  slot share alone left a quiet org 67.7 % FULL beside a flood; ADR-0014). At an even load
  no org asks for much over its share, and calls are admitted as before;
* an org may also have a **rate limit** (a token bucket: ``admission.ratePerSecond`` and
  ``burst``, default ``IBEX_ORG_RATE_LIMIT``): a call over it is shed with ``org_over_rate``,
  whether or not the process is busy.

The decision is a few dictionary reads and additions; shares are computed, and the orgs
holding slots (at most twice the limit) walked, only when the pool is full. Orgs that
stopped calling are forgotten by a sweep every quarter of ``active_seconds``. State is per
process: with N replicas behind a balancer each org's rate limit and share hold per replica
(docs/adr/0014-fair-admission.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ibex_context.pipeline.outcome import Reason
from ibex_context.profiles.schema import Admission
from ibex_context.server.cpu import CpuMeter

__all__ = ["FairAdmission"]

# Weights are floats: "alone" means no other weight worth counting.
_EPSILON = 1e-9
# How long a process found full counts as saturated. Under a flood the pool is full
# continuously; at a moderate rate it is full now and then for a moment, and shedding the
# calls of an org over its share then costs calls the single pool assembled (57 against 12
# a minute at 50 RPS from four orgs, with the last slot always kept free).
_SATURATED_FOR_SECONDS = 0.5
# How long a process found CPU-busy shares its cores: a flood held to one call at a time
# leaves the CPU a little under the mark, and would flood again at once without it.
_CPU_BUSY_FOR_SECONDS = 1.0
# An org asking for this many times its share of the cores is held to it: at an even
# load an org's ask wanders around its share (by a third at 60 RPS over four orgs); a
# flood asks for several times it.
_HEAVY = 1.5
# The time constant of an org's usage (its calls in flight, exponentially averaged).
_USAGE_SECONDS = 1.0


class _Org:
    __slots__ = (
        "admitted",
        "arrived",
        "burst",
        "counted",
        "inflight",
        "last_seen",
        "rate",
        "refilled_at",
        "tokens",
        "usage",
        "usage_at",
        "weight",
    )

    def __init__(self, now: float) -> None:
        self.inflight = 0
        # Its calls in flight averaged over ~``_USAGE_SECONDS`` (as of ``usage_at``).
        self.usage = 0.0
        self.usage_at = now
        # Its calls, and those of them admitted, exponentially averaged like ``usage``: their
        # ratio is how much more it asks for than it gets.
        self.arrived = 0.0
        self.admitted = 0.0
        self.last_seen = now
        self.weight = 0.0
        # Whether ``weight`` is in ``FairAdmission._active_weight``.
        self.counted = False
        self.rate = 0.0
        self.burst = 1.0
        self.tokens = 0.0
        self.refilled_at = now


def _settle_usage(org: _Org, now: float) -> None:
    """``org``'s averages brought to ``now`` (``inflight`` unchanged since ``usage_at``)."""
    if now == org.usage_at:
        return
    decay = math.exp(-(now - org.usage_at) / _USAGE_SECONDS)
    org.usage = org.inflight + (org.usage - org.inflight) * decay
    org.arrived *= decay
    org.admitted *= decay
    org.usage_at = now


class FairAdmission:
    """Admits or sheds each AssembleContext call by its org; ``release`` when an admitted call ends.

    ``limit`` 0 means no concurrency limit (rate limits still hold). ``default_rate`` is the
    rate limit of an org whose profile sets none (0: none). ``cpu``: the process's CPU meter,
    and ``cpu_busy`` the fraction above which orgs share its cores (none: slots only).
    """

    def __init__(
        self,
        limit: int,
        *,
        active_seconds: float = 2.0,
        default_rate: float = 0.0,
        cpu: CpuMeter | None = None,
        cpu_busy: float = 0.6,
        on_shed: Callable[[Reason], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        if active_seconds <= 0:
            raise ValueError("active_seconds must be > 0")
        if default_rate < 0:
            raise ValueError("default_rate must be >= 0")
        if not 0 < cpu_busy <= 1:
            raise ValueError("cpu_busy must be in (0, 1]")
        self._limit = limit
        self._active_seconds = active_seconds
        self._default_rate = default_rate
        self._on_shed = on_shed
        self._cpu = cpu
        self._cpu_busy = cpu_busy
        # The calls that share the cores: one a core the process may use (at least one).
        self._core_slots = max(1, min(limit or 1, math.floor(cpu.cpus))) if cpu is not None else 0
        self._clock = clock
        self._running = 0
        self._cpu_busy_at = -math.inf
        self._orgs: dict[str, _Org] = {}
        # The orgs with calls in flight: at most ``running`` of them.
        self._busy: dict[str, _Org] = {}
        self._active_weight = 0.0
        self._active_orgs = 0
        self._next_sweep = clock() + active_seconds / 4
        # When the pool was last found full (admission refused or lent a slot above it).
        self._saturated_at = -math.inf

    @property
    def running(self) -> int:
        return self._running

    @property
    def active_orgs(self) -> int:
        """Orgs sharing the process now (called within ``active_seconds`` or in flight)."""
        return self._active_orgs

    def admit(self, org_id: str, admission: Admission) -> Reason | None:
        """None: assemble the call (then ``release(org_id)``); else the reason to shed it with."""
        now = self._clock()
        if now >= self._next_sweep:
            self._sweep(now)
        org = self._orgs.get(org_id)
        if org is None:
            org = self._orgs[org_id] = _Org(now)
        org.last_seen = now
        weight = admission.weight
        if not org.counted:
            org.counted = True
            org.weight = weight
            self._active_weight += weight
            self._active_orgs += 1
        elif org.weight != weight:  # its profile changed
            self._active_weight += weight - org.weight
            org.weight = weight
        _settle_usage(org, now)
        org.arrived += 1.0
        reason = self._refused(org, admission, now)
        if reason is not None:
            if self._on_shed is not None:
                self._on_shed(reason)
            return reason
        if org.rate:
            org.tokens -= 1.0
        org.admitted += 1.0
        org.inflight += 1
        if org.inflight == 1:
            self._busy[org_id] = org
        self._running += 1
        return None

    def release(self, org_id: str) -> None:
        self._running -= 1
        org = self._busy.get(org_id)
        if org is None:
            return
        _settle_usage(org, self._clock())
        org.inflight -= 1
        if org.inflight == 0:
            del self._busy[org_id]

    def _refused(self, org: _Org, admission: Admission, now: float) -> Reason | None:
        if self._over_rate(org, admission, now):
            return Reason.ORG_OVER_RATE
        limit = self._limit
        running = self._running
        if not limit:
            return None
        if self._over_core_share(org, now):
            return Reason.ORG_OVER_SHARE
        if running < limit:
            if now - self._saturated_at > _SATURATED_FOR_SECONDS:
                return None
            # Full a moment ago, and will be again: an org over its share leaves the last
            # slot to the others (a quiet org's call then runs beside fewer of the flood's).
            if running + 1 < limit or org.inflight < self._share(org) or self._alone(org):
                return None
            return Reason.ORG_OVER_SHARE
        self._saturated_at = now
        # Saturated: the calls of an org over its share are the ones shed.
        if org.inflight < self._share(org):
            # Taken from an org over its share, a slot is lent, not lost.
            if running < 2 * limit and any(o.inflight > self._share(o) for o in self._busy.values()):
                return None
            return Reason.OVERLOADED
        if self._alone(org):  # its share is the pool
            return Reason.OVERLOADED
        return Reason.ORG_OVER_SHARE

    def _over_core_share(self, org: _Org, now: float) -> bool:
        """While the CPU is busy and others are active, an org **asking** for well over its
        share of the cores: at that share, or wanting a core another call holds.

        What an org asks for is the time its calls would hold a core if all were admitted:
        its calls in flight (``usage``, averaged over a second) scaled by its calls over
        those admitted. At an even load every org asks for about its share and nothing
        changes; a flood asks for several times its share however few of its calls are
        admitted, so holding it back does not make it look light (an org counted heavy only
        while shed let the flood in again each time it stopped being shed, and counting its
        shed calls at an even load shed more of them, a spiral: 12 % of 60 RPS). The cheap
        tests first: the meter reads two clocks once a window.
        """
        if self._cpu is None or self._alone(org):
            return False
        fair = self._core_slots * org.weight / self._active_weight
        asked = org.usage * org.arrived / max(org.admitted, 1.0)
        if asked < _HEAVY * fair:
            return False
        if self._cpu.busy() >= self._cpu_busy:
            self._cpu_busy_at = now
        elif now - self._cpu_busy_at > _CPU_BUSY_FOR_SECONDS:
            return False
        return org.inflight >= max(1, math.floor(fair + _EPSILON)) or self._running >= self._core_slots

    def _alone(self, org: _Org) -> bool:
        return self._active_weight - org.weight <= _EPSILON

    def _share(self, org: _Org) -> int:
        if self._alone(org):
            return self._limit
        return max(1, math.floor(self._limit * org.weight / self._active_weight + _EPSILON))

    def _over_rate(self, org: _Org, admission: Admission, now: float) -> bool:
        rate = self._default_rate if admission.rate_per_second is None else admission.rate_per_second
        if not rate:
            org.rate = 0.0
            return False
        burst = float(admission.burst) if admission.burst is not None else max(1.0, rate)
        if org.rate != rate or org.burst != burst:  # first call, or its profile changed: a full bucket
            org.rate, org.burst, org.tokens, org.refilled_at = rate, burst, burst, now
        else:
            org.tokens = min(burst, org.tokens + (now - org.refilled_at) * rate)
            org.refilled_at = now
        return org.tokens < 1.0

    def _sweep(self, now: float) -> None:
        """Orgs quiet for ``active_seconds`` stop sharing; those whose bucket has refilled are forgotten."""
        self._next_sweep = now + self._active_seconds / 4
        quiet_since = now - self._active_seconds
        weight, count = 0.0, 0
        for org_id, org in list(self._orgs.items()):
            if org.inflight == 0 and org.last_seen < quiet_since:
                org.counted = False
                refilled = not org.rate or org.tokens + (now - org.refilled_at) * org.rate >= org.burst
                if refilled:
                    del self._orgs[org_id]
            else:
                weight += org.weight
                count += 1
        # Summed again, not adjusted: no float drift however long the process runs.
        self._active_weight, self._active_orgs = weight, count
