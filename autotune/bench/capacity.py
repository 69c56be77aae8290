"""Capacity search: the highest request rate (or concurrency) whose SLOs still hold.

"Max goodput under SLO" is what people size a deployment by. The search runs the workload at one
load level per run, each a full :func:`~autotune.bench.loadgen.run_workload` (warm-up, fresh
prompts, prefix-cache reset) against the same server:

1. **Start**: ``capacity.start``, else the workload's own rate (or concurrency); for a rate
   search without either, one saturation run (all requests at once, under the workload's
   concurrency cap) measures the request throughput the server can reach at all, and the search
   starts there (guidellm's sweep starts from the same measurement).
2. **Bracket**: double after a pass, halve after a failure, until one level passed and a higher
   one failed (or ``high`` passed, or ``low`` failed).
3. **Bisect** (geometric mean for rates, integer midpoint for concurrency) until the failing
   level is within ``rel_tol`` of the passing one, or ``max_runs`` runs were spent.
4. **Confirm** (``capacity.confirm``): run the level found once more. Near the edge a level
   passes or fails by chance (the tail of TTFT is noisy at high utilisation); a failure here
   makes it the new failing level and the bisection goes on below it.

A level *holds* when every workload SLO holds, the error rate is within ``max_error_rate``, and
the run was not cut by its deadline. Rate levels run open loop (no client concurrency cap), so
queueing shows in TTFT and E2EL where users would see it; a rate search therefore needs a TTFT
or E2EL SLO: with only TPOT/ITL bounds, a queue can grow without limit while every bound holds.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from autotune.bench.loadgen import BenchProgress, run_workload
from autotune.bench.metrics import slo_violations
from autotune.bench.result import BenchResult
from autotune.config import LATENCY_KEY, Arrival, CapacitySearch, Workload
from autotune.errors import ConfigError

__all__ = ["CapacityResult", "CapacityRun", "check_capacity_slos", "judge", "search_capacity", "search_capacity_async"]

Dimension = Literal["request_rate", "concurrency"]
DEFAULT_BOUNDS: dict[str, tuple[float, float]] = {"request_rate": (0.1, 10_000.0), "concurrency": (1.0, 4096.0)}
MIN_REQUESTS_PER_RUN = 20
CONCURRENCY_WAVES = 2  # a concurrency run sends at least this many requests per slot
QUEUE_VISIBLE = ("ttft", "e2el")  # SLO metrics that grow with the server's queue


@dataclass(frozen=True)
class CapacityRun:
    """One run of the search.

    Attributes:
        level: Request rate (req/s) or concurrency of the run; ``inf`` for the saturation run.
        passed: Whether the SLOs held (always False for the saturation run: it is not judged).
        violations: ``{metric: measured − bound}`` of each missed bound (``error_rate``,
            ``deadline`` included).
        metrics: The run's result (``BenchResult.to_json()``: vLLM's keys).
        client_limited: The client self-check flagged the run.
    """

    level: float
    passed: bool
    violations: dict[str, float]
    metrics: dict[str, Any]
    client_limited: bool


@dataclass
class CapacityResult:
    """What the search found.

    Attributes:
        dimension: ``request_rate`` or ``concurrency``.
        value: The highest level that held (0 when none did).
        next_step_failed: A level at most ``rel_tol`` above ``value`` was run and failed (and
            ``value`` held again when confirmed), i.e. the search converged on the edge.
        upper: The lowest level that failed (None when none did).
        runs: Every run, in order.
        stop_reason: ``converged``, ``max_runs``, ``at_high`` (``high`` held) or ``below_low``
            (``low`` failed).
    """

    dimension: Dimension
    value: float
    next_step_failed: bool
    upper: float | None
    runs: list[CapacityRun] = field(default_factory=list)
    stop_reason: str = "converged"

    @property
    def best(self) -> CapacityRun | None:
        """The passing run at ``value`` (None when nothing held)."""
        held = [r for r in self.runs if r.passed and r.level == self.value]
        return held[-1] if held else None

    def to_json(self) -> dict[str, Any]:
        best = self.best
        return {
            "dimension": self.dimension,
            "value": self.value,
            "next_step_failed": self.next_step_failed,
            "upper": self.upper,
            "stop_reason": self.stop_reason,
            "request_goodput": best.metrics.get("request_goodput") if best else None,
            "output_throughput": best.metrics.get("output_throughput") if best else None,
            "runs": [
                {
                    "level": r.level if math.isfinite(r.level) else "inf",
                    "passed": r.passed,
                    "violations": r.violations,
                    "client_limited": r.client_limited,
                    "metrics": r.metrics,
                }
                for r in self.runs
            ],
        }


def judge(result: BenchResult, workload: Workload) -> dict[str, float]:
    """The bounds a run missed: its SLOs, the error rate, and a deadline cut (``{}`` = it held)."""
    metrics = result.metrics
    over = slo_violations(metrics, workload.slos)
    error_rate = float(metrics["error_rate"])
    if error_rate > workload.max_error_rate:
        over["error_rate"] = error_rate - workload.max_error_rate
    if result.deadline_hit:
        over["deadline"] = math.inf
    return over


def check_capacity_slos(workload: Workload, dimension: Dimension) -> None:
    """Refuse, in one line, a workload whose SLOs cannot tell a level that holds from one that fails."""
    metrics = {m.group(3) for key in workload.slos if (m := LATENCY_KEY.match(key))}
    if not metrics:
        raise ConfigError(f"workload {workload.name}: a capacity search needs SLOs (e.g. p95_ttft_ms: 1000)")
    if dimension == "request_rate" and not metrics & set(QUEUE_VISIBLE):
        raise ConfigError(
            f"workload {workload.name}: a request-rate capacity search needs a TTFT or E2EL SLO "
            "(TPOT/ITL bounds can hold while the queue grows without limit); add e.g. p95_ttft_ms"
        )


class _Search:
    """State of one search: the runs made and the bracket they give."""

    def __init__(self, settings: CapacitySearch) -> None:
        self.s = settings
        self.dimension: Dimension = settings.dimension
        default_low, default_high = DEFAULT_BOUNDS[self.dimension]
        self.low = settings.low or default_low
        self.high = settings.high or default_high
        self.runs: list[CapacityRun] = []

    @property
    def integer(self) -> bool:
        return self.dimension == "concurrency"

    @property
    def failed(self) -> float | None:
        """The lowest level that failed (a later failure of a passed level counts)."""
        levels = [r.level for r in self.runs if not r.passed and math.isfinite(r.level)]
        return min(levels, default=None)

    @property
    def passed(self) -> float | None:
        """The highest level that passed below every failure."""
        ceiling = self.failed if self.failed is not None else math.inf
        return max((r.level for r in self.runs if r.passed and r.level < ceiling), default=None)

    def clamp(self, level: float) -> float:
        level = min(max(level, self.low), self.high)
        return float(max(1, round(level))) if self.integer else level

    def narrow(self) -> bool:
        """Whether the failing level is within ``rel_tol`` (one step, for integers) of the passing one."""
        passed, failed = self.passed, self.failed
        if passed is None or failed is None:
            return False
        if self.integer:
            return failed - passed <= max(1.0, math.floor(passed * self.s.rel_tol))
        return failed <= passed * (1 + self.s.rel_tol) * (1 + 1e-9)

    def _confirmed(self, level: float) -> bool:
        return not self.s.confirm or sum(r.passed and r.level == level for r in self.runs) >= 2

    def next_level(self, last: float) -> float | None:
        """The next level to run, or None when the search is over."""
        passed, failed = self.passed, self.failed
        if passed is not None and failed is not None:
            if self.narrow():
                return None if self._confirmed(passed) else passed
            return float(math.floor((passed + failed) / 2)) if self.integer else math.sqrt(passed * failed)
        if failed is None:  # everything so far held: go up
            return None if last >= self.high else self.clamp(last * 2)
        return None if last <= self.low else self.clamp(last / 2)

    def result(self) -> CapacityResult:
        passed, failed = self.passed, self.failed
        converged = self.narrow() and passed is not None and self._confirmed(passed)
        if converged:
            reason = "converged"
        elif passed is not None and failed is None and passed >= self.high:
            reason = "at_high"
        elif passed is None and failed is not None and failed <= self.low:
            reason = "below_low"
        else:
            reason = "max_runs"
        return CapacityResult(self.dimension, passed or 0.0, converged, failed, self.runs, reason)


def _at_level(workload: Workload, dimension: Dimension, level: float, seconds: float | None) -> Workload:
    """The workload at one load level (see the module docstring for the run sizes)."""
    w = workload
    if dimension == "concurrency":
        c = int(level)
        arrival = Arrival(concurrency=c, burstiness=w.arrival.burstiness)
        n = max(w.num_prompts, CONCURRENCY_WAVES * c)
    else:
        arrival = Arrival(request_rate=level, burstiness=w.arrival.burstiness)
        n = max(MIN_REQUESTS_PER_RUN, math.ceil(level * seconds)) if seconds else w.num_prompts
    return w.model_copy(update={"arrival": arrival, "num_prompts": n})


async def search_capacity_async(
    base_url: str,
    workload: Workload,
    *,
    model: str | None = None,
    api_key: str | None = None,
    settings: CapacitySearch | None = None,
    on_run: Callable[[CapacityRun], None] | None = None,
    workers: int | None = None,
    on_progress: Callable[[BenchProgress], None] | None = None,
) -> CapacityResult:
    """Find the highest load level of ``workload`` whose SLOs hold (see the module docstring).

    Args:
        base_url: Server root.
        workload: The workload; its SLOs and ``max_error_rate`` judge every level.
        model: Model id; default: the server's first.
        api_key: Sent as ``Authorization: Bearer``.
        settings: Search settings; default ``workload.capacity``.
        on_run: Called after each run (progress).
        workers: Client worker processes per run (default: automatic).
        on_progress: Passed to every run (live request and chunk counts).

    Returns:
        The level found, every run with its metrics, and whether the next step up failed.

    Raises:
        ConfigError: The workload has no SLO the search can use.
        BenchmarkError: As :func:`~autotune.bench.loadgen.run_workload`.
    """
    s = settings or workload.capacity
    check_capacity_slos(workload, s.dimension)
    search = _Search(s)

    async def run(level: float) -> CapacityRun:
        w = _at_level(workload, s.dimension, level, s.seconds_per_run) if math.isfinite(level) else workload
        result = await run_workload(base_url, w, model=model, api_key=api_key, workers=workers, on_progress=on_progress)
        over = judge(result, workload)
        entry = CapacityRun(level, math.isfinite(level) and not over, over, result.to_json(), result.client_limited)
        search.runs.append(entry)
        if on_run is not None:
            on_run(entry)
        return entry

    level: float | None = await _start(workload, s, search, run)
    while level is not None and len(search.runs) < s.max_runs:
        await run(level)
        level = search.next_level(level)
    return search.result()


async def _start(workload: Workload, s: CapacitySearch, search: _Search, run: Callable[[float], Any]) -> float:
    if s.start is not None:
        return search.clamp(s.start)
    own = workload.arrival.concurrency if s.dimension == "concurrency" else workload.arrival.request_rate
    if own is not None and math.isfinite(own):
        return search.clamp(float(own))
    if s.dimension == "concurrency":
        return search.clamp(8.0)
    saturation: CapacityRun = await run(math.inf)
    reached = float(saturation.metrics.get("request_throughput") or search.low)
    return search.clamp(reached)


def search_capacity(base_url: str, workload: Workload, **options: Any) -> CapacityResult:
    """:func:`search_capacity_async` for synchronous callers (runs its own event loop); the
    keyword options are the same.

    Raises:
        RuntimeError: Called from inside a running event loop.
        ConfigError: The workload has no SLO the search can use.
        BenchmarkError: As :func:`~autotune.bench.loadgen.run_workload`.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("search_capacity was called inside an event loop; await search_capacity_async instead")
    return asyncio.run(search_capacity_async(base_url, workload, **options))
