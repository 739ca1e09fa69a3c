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
* slots are not the core. When the calls ask for more CPU than the process may use
  (``IBEX_ADMISSION_CPU_BUSY`` of it: the CPU it uses, ``server/cpu.py``, scaled by its calls
  over those admitted) and other orgs are active, an org sending well over its weighted
  share of the calls holds at most its share of the process's cores (one call at least),
  and starts a call only onto a free core, never beside another org's call. A flood then
  runs one call at a time, between a quiet org's calls, and the quiet org's calls keep
  their deadline (a slot share alone left a quiet org 67.7 % FULL beside a flood;
  ADR-0014). At an even load no org sends much over its share, and calls are admitted as
  before;
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
# Arrivals are counted over about this long (exponentially averaged): long enough that an
# even load's shares stay near the weights (at 15 RPS an org's share of 60 wanders by ~3
# points), short enough that a flood is told apart within a second.
_RATE_SECONDS = 5.0
# An org sending this many times its weighted share of the calls is a heavy asker.
_HEAVY = 1.5


class _Org:
    __slots__ = (
        "arrived",
        "burst",
        "counted",
        "inflight",
        "last_seen",
        "rate",
        "refilled_at",
        "tokens",
        "weight",
    )

    def __init__(self, now: float) -> None:
        self.inflight = 0
        # Its calls (admitted or not), averaged over ~``_RATE_SECONDS``, as of
        # ``FairAdmission._counted_at``.
        self.arrived = 0.0
        self.last_seen = now
        self.weight = 0.0
        # Whether ``weight`` is in ``FairAdmission._active_weight``.
        self.counted = False
        self.rate = 0.0
        self.burst = 1.0
        self.tokens = 0.0
        self.refilled_at = now


class FairAdmission:
    """Admits or sheds each AssembleContext call by its org; ``release`` when an admitted call ends.

    ``limit`` 0 means no concurrency limit (rate limits still hold). ``default_rate`` is the
    rate limit of an org whose profile sets none (0: none). ``cpu``: the process's CPU meter,
    and ``cpu_busy`` the share of its CPU asked for above which orgs share its cores (none:
    slots only).
    """

    def __init__(
        self,
        limit: int,
        *,
        active_seconds: float = 2.0,
        default_rate: float = 0.0,
        cpu: CpuMeter | None = None,
        cpu_busy: float = 0.9,
        on_shed: Callable[[Reason], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        if active_seconds <= 0:
            raise ValueError("active_seconds must be > 0")
        if default_rate < 0:
            raise ValueError("default_rate must be >= 0")
        if cpu_busy <= 0:
            raise ValueError("cpu_busy must be > 0")
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
        # Every org's calls, and those admitted, averaged like ``_Org.arrived``; an org's
        # own count is decayed lazily: ``_decay`` is what every count has decayed by since
        # the start, and an org's ``arrived`` is stored divided by it.
        self._arrived = 0.0
        self._admitted = 0.0
        self._counted_at = clock()
        self._decay = 1.0
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
        self._count_arrival(org, now)
        reason = self._refused(org, admission, now)
        if reason is not None:
            if self._on_shed is not None:
                self._on_shed(reason)
            return reason
        if org.rate:
            org.tokens -= 1.0
        self._admitted += 1.0
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
        if self._over_core_share(org):
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

    def _count_arrival(self, org: _Org, now: float) -> None:
        if now > self._counted_at:
            decay = math.exp(-(now - self._counted_at) / _RATE_SECONDS)
            self._arrived *= decay
            self._admitted *= decay
            self._decay *= decay
            self._counted_at = now
            if self._decay < 1e-100:  # rescale the stored counts before they underflow
                for each in self._orgs.values():
                    each.arrived *= self._decay
                self._decay = 1.0
        self._arrived += 1.0
        org.arrived += 1.0 / self._decay

    def _over_core_share(self, org: _Org) -> bool:
        """A heavy asker while the calls ask for more CPU than the process has to spare:
        at its share of the cores, or wanting a core another call holds.

        Both tests read what is asked, not what is admitted, so holding an org back does
        not change whether it is held back: a **heavy asker** sends over ``_HEAVY`` times
        its weighted share of the process's calls; the **CPU asked for** is the CPU the
        process uses scaled by its calls over those admitted. (Tests that read what an org
        got, its shed calls or calls in flight, fed back: an org held back looked heavier,
        and at an even 60 RPS 12 % of calls were shed.) The cheap tests first: the meter
        reads two clocks once a window.
        """
        if self._cpu is None or self._alone(org):
            return False
        weight_share = org.weight / self._active_weight
        if org.arrived * self._decay < _HEAVY * weight_share * self._arrived:
            return False
        asked = self._cpu.busy() * self._arrived / max(self._admitted, 1.0)
        if asked < self._cpu_busy:
            return False
        share = max(1, math.floor(self._core_slots * weight_share + _EPSILON))
        return org.inflight >= share or self._running >= self._core_slots

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
