"""Run a workload through the model without a server, in modelled time only.

The same scheduler, KV pool and step-time model the server uses, stepped as fast as the CPU
allows: a closed-loop client keeps ``concurrency`` requests in flight until ``requests`` have
finished. Used by the calibration checks and usable by a planner to pre-screen candidates
(an estimate, like everything the simulator reports).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune_sim.perf import PerfModel
from autotune_sim.scheduler import Scheduler, SimRequest

__all__ = ["OfflineResult", "simulate"]


@dataclass(frozen=True)
class OfflineResult:
    """Outcome of an offline run (modelled seconds)."""

    duration_s: float
    output_tokens: int
    preemptions: int
    retractions: int
    max_running: int
    mean_ttft_s: float

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s else 0.0


def simulate(
    scheduler: Scheduler,
    perf: PerfModel,
    *,
    requests: int,
    concurrency: int,
    prompt: Callable[[int], Sequence[int]],
    output_len: int,
    max_steps: int = 1_000_000,
) -> OfflineResult:
    """Drive ``requests`` requests of ``output_len`` tokens (prompt ``prompt(i)``) to completion."""
    t = 0.0
    submitted = finished = tokens = peak_running = 0
    in_flight = 0
    ttfts: list[float] = []
    for _ in range(max_steps):
        while in_flight < concurrency and submitted < requests:
            req = SimRequest(submitted, prompt(submitted), output_len, "length", output_len, submitted)
            req.arrival = t
            scheduler.add(req)
            submitted += 1
            in_flight += 1
        batch = scheduler.schedule(t)
        if batch is None or not batch.items:
            if finished == requests:
                break
            raise RuntimeError("the scheduler cannot make progress (KV pool smaller than one request?)")
        t += perf.step_time(batch.shape)
        peak_running = max(peak_running, len(scheduler.running))
        for req in scheduler.commit(batch):
            tokens += 1
            if req.first_token < 0:
                req.first_token = t
                ttfts.append(t - req.arrival)
            if req.generated >= req.output_len:
                scheduler.finish(req)
                finished += 1
                in_flight -= 1
        scheduler.prune()
        if finished == requests:
            break
    stats = scheduler.stats
    return OfflineResult(
        duration_s=t,
        output_tokens=tokens,
        preemptions=stats.preemptions,
        retractions=stats.retracted_requests,
        max_running=peak_running,
        mean_ttft_s=sum(ttfts) / len(ttfts) if ttfts else 0.0,
    )
