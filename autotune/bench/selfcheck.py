"""The load generator's self-check: did the client, not the server, limit the run?

Three signals, each cheap to collect during the run:

* CPU share of the event-loop thread (``time.thread_time`` over wall time): near 100 % of one
  core means the single-threaded loop was saturated;
* event-loop lag, from a 10 ms timer: how late the loop wakes up is how late every timestamp it
  takes can be; a large lag with a low CPU share means the process was waiting for a CPU that
  other processes held;
* send lag against the arrival schedule (finite request rates only).

A lag of a few ms shifts every timestamp by that much, which is already a large error on a GPU's
10-30 ms decode step (bench-clients.md §6 proposes 5 ms).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from time import perf_counter

import numpy as np

__all__ = ["ClientCheck", "LoopLagProbe", "assess_client", "probe_loop"]

SCHEDULE_LAG_P99_LIMIT_S = 0.005
LOOP_LAG_P99_LIMIT_S = 0.005
CPU_SHARE_LIMIT = 0.90  # of one core: the event loop is single-threaded
STARVED_CPU_SHARE = 0.5
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
    """

    cpu_share: float
    p99_schedule_lag_ms: float
    p99_loop_lag_ms: float
    max_loop_lag_ms: float
    limited: bool
    reason: str


def _p99_ms(values: Sequence[float]) -> float:
    return float(np.percentile(values, 99)) * 1000.0 if len(values) else 0.0


def assess_client(
    cpu_share: float, schedule_lags: Sequence[float], loop_lags: Sequence[float], finite_rate: bool
) -> ClientCheck:
    """Judge whether the client limited the run.

    Args:
        cpu_share: Loop-thread CPU seconds over wall seconds.
        schedule_lags: Per-request send delay against the arrival schedule (seconds).
        loop_lags: Event-loop wake-up delays (seconds).
        finite_rate: Whether the workload has a request rate; with ``inf`` every request is due
            at t = 0, so its "lag" is just the time to create the tasks.

    Returns:
        The check with a one-line reason naming every crossed threshold.
    """
    sched = _p99_ms(schedule_lags)
    loop = _p99_ms(loop_lags)
    reasons = []
    if cpu_share >= CPU_SHARE_LIMIT:
        reasons.append(f"client event loop busy {cpu_share:.0%} of the run")
    if finite_rate and sched > SCHEDULE_LAG_P99_LIMIT_S * 1000:
        reasons.append(f"p99 send lag {sched:.1f} ms behind the arrival schedule")
    if loop > LOOP_LAG_P99_LIMIT_S * 1000:
        reasons.append(f"p99 event-loop lag {loop:.1f} ms (timestamps are late by that much)")
        if cpu_share < STARVED_CPU_SHARE:
            # A lagging loop that was mostly off the CPU was waiting to be scheduled, not working.
            reasons.append(f"the client ran only {cpu_share:.0%} of the time: other processes took its CPU")
    max_loop = max(loop_lags, default=0.0) * 1000.0
    return ClientCheck(cpu_share, sched, loop, max_loop, bool(reasons), "; ".join(reasons))


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
