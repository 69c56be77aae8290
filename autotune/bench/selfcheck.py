"""The load generator's self-check: did the client, not the server, limit the run?

Three signals, each cheap to collect during the run:

* event-loop lag, from a 10 ms timer: how late the loop wakes up is how late every timestamp it
  takes can be;
* send lag against the arrival schedule (finite request rates only);
* CPU share of the event-loop thread (``time.thread_time`` over wall time): near 100 % of one
  core means the single-threaded loop was saturated.

The verdict (``ClientCheck.kind``):

* ``cpu_bound``: the loop thread was busy nearly all the run (it could not keep up by itself);
* ``starved``: the loop woke late (p99 lag over the tolerance) while it was *not* busy, so it was
  waiting for a CPU that other processes held (on a small box, the engine);
* ``schedule_behind``: requests left later than the arrival schedule by more than the tolerance
  while the loop itself was neither busy nor late.

A low CPU share on its own is *not* starvation: a client waiting for a slow engine idles, and its
loop still wakes on time. Only the loop's lateness says that it could not run when it had to.

A run against the simulator is timed by the simulator's modelled stamps, not by the client's
clock, so a late wake-up no longer moves a timestamp (:func:`assess_modelled_client`), and a
late send moves no arrival either: the simulator holds its clock while a closed-loop run's freed
slot waits for the client's next request, and gates a paced run's arrivals at their modelled due
times (:mod:`autotune.bench.simclock`) — such a run is judged only by a send later than the
simulator waits for. What a late client still changes is a paced run under a concurrency cap,
which is not gated: there a send that leaves late arrives late in modelled time, by the
lateness times the speed-up, and the run is judged by that amplified lateness and by the
simulator's own clock: ``sim_behind`` when it ran slower than the asked speed-up, which packs
the arrivals denser than declared.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Literal

import numpy as np

from autotune.bench.simclock import GATE_LIMIT_S
from autotune.config import LATENCY_KEY

__all__ = [
    "ClientCheck",
    "LimitKind",
    "LoopLagProbe",
    "SimTiming",
    "assess_client",
    "assess_modelled_client",
    "lag_tolerance",
    "probe_loop",
]

LimitKind = Literal["", "starved", "cpu_bound", "schedule_behind", "sim_behind"]

# Loop lag (p99 of a 10 ms timer's wake-up delay) that is still noise, not a client limit. On a
# box shared with the engine the kernel's scheduler alone delays a waiting process by a time
# slice or two (CFS targets 6-24 ms of latency; a measured healthy run on 2 cores had an 11 ms
# p99), and on a GPU server a TTFT is tens to hundreds of ms. 50 ms is above that noise and a
# small fraction of the latencies an SLO is set on; a late wake-up shifts a timestamp by that
# much, it does not add up over a request (TPOT is a difference of two timestamps over n - 1).
LOOP_LAG_FLOOR_S = 0.050
# With a TTFT SLO the tolerance grows to this fraction of its tightest bound: a client that
# moves TTFT by less than a tenth of its bound cannot decide whether the SLO holds, and a tighter
# floor would flag runs that are fine for what is judged.
LOOP_LAG_SLO_FRACTION = 0.10
# When only throughput is judged, the p99 lag may reach this share of the run: even if every
# request waited that long once, the throughput would move by less than that share.
THROUGHPUT_STALL_SHARE = 0.01
CPU_SHARE_LIMIT = 0.90  # of one core: the event loop is single-threaded
# A simulator slower than asked packs a paced workload's arrivals denser than declared, by the
# shortfall: up to 10 % is inside the spread of repeated runs of one configuration (2–5 % in a
# quiet demo, 14–30 % on the shared real test bed, benchmarks/README.md); below it the run is marked.
SIM_CLOCK_SHARE = 0.90
LOOP_PROBE_INTERVAL_S = 0.01


@dataclass(frozen=True, slots=True)
class ClientCheck:
    """Whether the client, not the server, may have limited the run.

    Attributes:
        cpu_share: Event-loop thread CPU time over wall time during the measured run.
        p99_schedule_lag_ms: p99 of how late requests left against their planned time
            (meaningful for a finite request rate).
        p99_loop_lag_ms: p99 of the event loop's wake-up delay on a 10 ms timer.
        max_loop_lag_ms: Largest such delay.
        limited: Any threshold crossed.
        reason: One line naming each crossed threshold ("" when not limited).
        kind: Machine-readable main cause: ``starved``, ``cpu_bound``, ``schedule_behind``
            ("" when not limited).
        lag_tolerance_ms: The loop- and send-lag tolerance the run was judged by.
    """

    cpu_share: float
    p99_schedule_lag_ms: float
    p99_loop_lag_ms: float
    max_loop_lag_ms: float
    limited: bool
    reason: str
    kind: LimitKind = ""
    lag_tolerance_ms: float = LOOP_LAG_FLOOR_S * 1000.0


def _p99_ms(values: Sequence[float]) -> float:
    return float(np.percentile(values, 99)) * 1000.0 if len(values) else 0.0


def lag_tolerance(
    slos: Mapping[str, float] | None = None, *, latency_judged: bool = True, duration_s: float = 0.0
) -> float:
    """Seconds of p99 loop or send lag a run tolerates.

    ``max(LOOP_LAG_FLOOR_S, LOOP_LAG_SLO_FRACTION × the tightest TTFT bound)``, the bound taken
    from a workload's SLOs in ms (``p95_ttft_ms``, ``mean_ttft_ms``, ...; a ``std`` bound is no
    latency and is skipped). Sends are judged by the same tolerance: a late send and a late
    wake-up are the same stall seen from two places.
    """
    ttft_ms = [
        bound
        for key, bound in (slos or {}).items()
        if (m := LATENCY_KEY.match(key)) and m.group(3) == "ttft" and m.group(1) != "std"
    ]
    tight = min(ttft_ms, default=math.inf)
    from_slo = LOOP_LAG_SLO_FRACTION * tight / 1000.0 if math.isfinite(tight) else 0.0
    # Only throughput is judged (no latency SLO or objective): a late wake-up delays the next
    # send by that much, so what matters is the share of the run it can cost.
    from_duration = 0.0 if latency_judged else THROUGHPUT_STALL_SHARE * duration_s
    return max(LOOP_LAG_FLOOR_S, from_slo, from_duration)


def assess_client(
    cpu_share: float,
    schedule_lags: Sequence[float],
    loop_lags: Sequence[float],
    finite_rate: bool,
    tolerance_s: float = LOOP_LAG_FLOOR_S,
) -> ClientCheck:
    """Judge whether the client limited the run.

    Args:
        cpu_share: Loop-thread CPU seconds over wall seconds.
        schedule_lags: Per-request send delay against the arrival schedule (seconds).
        loop_lags: Event-loop wake-up delays (seconds).
        finite_rate: Whether the workload has a request rate; with ``inf`` every request is due
            at t = 0, so its "lag" is just the time to create the tasks.
        tolerance_s: p99 loop and send lag still taken as noise (:func:`lag_tolerance`).

    Returns:
        The check with its kind and a one-line reason naming every crossed threshold.
    """
    sched = _p99_ms(schedule_lags)
    loop = _p99_ms(loop_lags)
    limit_ms = tolerance_s * 1000.0
    busy = cpu_share >= CPU_SHARE_LIMIT
    late_loop = loop > limit_ms
    late_sends = finite_rate and sched > limit_ms
    reasons = []
    if busy:
        reasons.append(f"client event loop busy {cpu_share:.0%} of the run")
    if late_sends:
        reasons.append(f"p99 send lag {sched:.1f} ms behind the arrival schedule (tolerance {limit_ms:.0f} ms)")
    if late_loop:
        reasons.append(
            f"p99 event-loop lag {loop:.1f} ms (timestamps are late by that much; tolerance {limit_ms:.0f} ms)"
        )
        if not busy:
            # The loop had time to spare yet woke late: it was waiting for a CPU others held.
            reasons.append(
                f"the loop was idle {1 - cpu_share:.0%} of the run yet woke late: other processes took its CPU"
            )
    kind: LimitKind = ""
    if busy:
        kind = "cpu_bound"
    elif late_loop:
        kind = "starved"
    elif late_sends:
        kind = "schedule_behind"
    max_loop = max(loop_lags, default=0.0) * 1000.0
    return ClientCheck(cpu_share, sched, loop, max_loop, bool(reasons), "; ".join(reasons), kind, limit_ms)


@dataclass(frozen=True, slots=True)
class SimTiming:
    """What the simulator's stamps said about a run: the asked and the achieved speed-up, whether
    its clock was held for closed-loop hand-offs (then the achieved speed-up is lower by the
    holds, not by lag), and whether it gated a paced run's arrivals (then each request arrived at
    its modelled due time, however late it was sent, unless later than ``GATE_LIMIT_S``)."""

    speedup: float
    achieved: float
    held: bool = False
    gated: bool = False


def assess_modelled_client(
    cpu_share: float,
    schedule_lags: Sequence[float],
    loop_lags: Sequence[float],
    finite_rate: bool,
    tolerance_s: float,
    sim: SimTiming,
) -> ClientCheck:
    """Judge a run timed by the simulator's modelled stamps (see the module doc).

    Args:
        cpu_share: Loop-thread CPU seconds over wall seconds (reported; a busy loop shows up as
            late sends or hand-offs, which are judged).
        schedule_lags: Per-request wall-clock send delay against the (compressed) schedule.
        loop_lags: Event-loop wake-up delays (wall seconds).
        finite_rate: Whether the workload is paced (a request rate or ramp-up).
        tolerance_s: Send lag still taken as noise, in modelled seconds (:func:`lag_tolerance`).
        sim: The asked and achieved speed-ups.
    """
    scale = max(sim.achieved, 1e-9)
    loop = _p99_ms(loop_lags) * scale
    max_loop = max(loop_lags, default=0.0) * 1000.0 * scale
    if sim.gated:
        return _gated_check(cpu_share, _p99_ms(schedule_lags), loop, max_loop)
    sched = _p99_ms(schedule_lags) * scale
    limit_ms = tolerance_s * 1000.0
    reasons: list[str] = []
    kind: LimitKind = ""
    if finite_rate and not sim.held and sim.achieved < SIM_CLOCK_SHARE * sim.speedup:
        kind = "sim_behind"
        reasons.append(
            f"the simulator ran at {sim.achieved:.1f}x of the asked {sim.speedup:g}x (the host could not keep its "
            "modelled clock): arrivals came denser than the schedule"
        )
    if finite_rate and sched > limit_ms:
        kind = kind or "schedule_behind"
        reasons.append(
            f"p99 send lag {sched:.1f} modelled ms behind the arrival schedule (tolerance {limit_ms:.0f} ms)"
        )
    return ClientCheck(cpu_share, sched, loop, max_loop, bool(reasons), "; ".join(reasons), kind, limit_ms)


def _gated_check(cpu_share: float, sched_wall_ms: float, loop: float, max_loop: float) -> ClientCheck:
    """A gated run's sends moved no arrival unless one was later than the simulator waits for."""
    limit_ms = GATE_LIMIT_S * 1000.0
    if sched_wall_ms <= limit_ms:
        return ClientCheck(cpu_share, sched_wall_ms, loop, max_loop, False, "", "", limit_ms)
    reason = (
        f"p99 send lag {sched_wall_ms:.0f} wall ms behind the arrival schedule: past the {limit_ms:.0f} ms "
        "the simulator waits for a due request, so arrivals left their modelled schedule"
    )
    return ClientCheck(cpu_share, sched_wall_ms, loop, max_loop, True, reason, "schedule_behind", limit_ms)


class LoopLagProbe:
    """Measures how late the event loop wakes a 10 ms timer: the error on every timestamp."""

    def __init__(self) -> None:
        self.lags: list[float] = []

    async def run(self) -> None:
        while True:
            t = perf_counter()
            await asyncio.sleep(LOOP_PROBE_INTERVAL_S)
            self.lags.append(max(0.0, perf_counter() - t - LOOP_PROBE_INTERVAL_S))


@contextlib.asynccontextmanager
async def probe_loop() -> AsyncIterator[LoopLagProbe]:
    """Run a :class:`LoopLagProbe` for the duration of the block."""
    probe = LoopLagProbe()
    task = asyncio.create_task(probe.run())
    try:
        yield probe
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
