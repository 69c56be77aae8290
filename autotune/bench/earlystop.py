"""Early stop of a measured run that cannot matter, decided from what the engine already served.

Three reasons, each one a fact about the engine, never a guess about the client:

* ``slo_lost`` — enough completed requests already broke a bound that the whole run must miss it
  whatever the rest do. For a percentile ``q`` of ``n`` values (``np.percentile``, linear), the
  result exceeds ``X`` once the value at index ``floor((n − 1)·q)`` of the sorted values does, i.e.
  once at least ``n − floor((n − 1)·q)`` values exceed ``X``. That count grows with ``n``, so the
  bound uses the largest ``n`` the run can still reach (every planned request served; for ITL,
  one gap per planned output token): ``k_exceeding ≥ n_max − floor((n_max − 1)·q)``. A mean is
  lost once ``sum / n_max > X`` (the values are never negative), a population std once
  ``sqrt(SS / n_max) > X`` (more values can only add squared deviations), and the error rate
  once ``engine failures / planned > max_error_rate``.
* ``cannot_win`` — the run's output throughput, with a conservative upper bound, is below the
  incumbent's (the best served trial of the study). The bound: the steady part of the run (after
  the first full turnover of the concurrency slots) is cut into :data:`BATCHES` equal windows,
  each window's token rate is a batch mean, and the one-sided 99 % Student-t upper bound of their
  mean, raised by the study's measured run-to-run noise (``search/noise.py``; no noise measured:
  no cut), must be below the incumbent (what its configuration would score again). Batch
  means over windows of a second or more absorb most of the correlation that makes per-bucket
  intervals optimistic, and a steady-state rate is above the run's final tokens/duration (which
  includes the drain), so the test errs toward running on. It waits for :data:`MIN_REQUESTS`
  completed requests and :data:`MIN_SECONDS` seconds of steady state.
* ``server_dead`` — the engine process exited or its health endpoint stopped answering; the
  trial's watcher thread says so through :meth:`EarlyStop.request_stop`.

The load generator feeds every finished request to :meth:`EarlyStop.observe` and the live count
of streamed token chunks to :meth:`EarlyStop.tick`; when a decision stands it cancels what is in
flight. Requests unfinished at the stop are left out of the metrics (their tokens so far still
count toward the throughput of the window, see :mod:`autotune.bench.loadgen`).
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.bench.metrics import CLIENT, RequestRecord
from autotune.config import LATENCY_KEY, Workload

__all__ = [
    "CANNOT_WIN",
    "REASONS",
    "SERVER_DEAD",
    "SLO_LOST",
    "STOPPED_ERROR",
    "EarlyStop",
    "EarlyStopPolicy",
    "StopDecision",
    "percentile_lost",
    "throughput_upper_bound",
]

SLO_LOST, CANNOT_WIN, SERVER_DEAD = "slo_lost", "cannot_win", "server_dead"
REASONS = frozenset({SLO_LOST, CANNOT_WIN, SERVER_DEAD})
#: The error of a request the stop cut: it is left out of the run's records.
STOPPED_ERROR = "not finished: the run was stopped early"

# cannot_win waits for this many completed requests (the tokens-per-chunk ratio and the steady
# state need a few dozen) and this many seconds of steady state (eight batches of ≥ 0.375 s).
MIN_REQUESTS = 50
MIN_SECONDS = 3.0
BATCHES = 8
# One-sided 99 % Student-t quantiles by degrees of freedom.
_T99 = {4: 3.747, 5: 3.365, 6: 3.143, 7: 2.998, 8: 2.896, 9: 2.821, 10: 2.764, 15: 2.602, 20: 2.528, 30: 2.457}
# A streamed answer has at most one chunk per output token plus the chat role chunk and a final
# chunk: its ITL gaps number at most output_len + 1.
ITL_CHUNK_ALLOWANCE = 1


@dataclass(frozen=True)
class EarlyStopPolicy:
    """What may end one trial's runs early.

    Attributes:
        reasons: The stops allowed (a subset of :data:`REASONS`).
        incumbent: What the best served configuration's output throughput would be again
            (``cannot_win``; None: no stop).
        noise_margin: The study's measured run-to-run noise, allowed for on top of the bound
            (``cannot_win``; None: not measured, no stop).
        min_requests: ``cannot_win`` waits for this many completed requests.
        min_seconds: ... and this many seconds of steady state.
    """

    reasons: frozenset[str] = REASONS
    incumbent: float | None = None
    noise_margin: float | None = None
    min_requests: int = MIN_REQUESTS
    min_seconds: float = MIN_SECONDS

    def allows(self, reason: str) -> bool:
        return reason in self.reasons


@dataclass(frozen=True)
class StopDecision:
    reason: str
    at_requests: int  # requests completed when the run was stopped
    evidence: str

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "at_requests": self.at_requests, "evidence": self.evidence}


# ----------------------------------------------------------------------------------- the bounds
def percentile_lost(exceeding: int, n_max: int, q: float) -> bool:
    """Whether the ``q`` quantile (0–1, ``np.percentile``'s linear method) of at most ``n_max``
    values must exceed a bound that ``exceeding`` of them already exceed.

    The quantile lies between the sorted values at ``floor((n − 1)·q)`` and the next one; when
    every value from that index up exceeds the bound, so does the quantile. The index is
    computed with numpy's own float arithmetic (``q`` as ``percent / 100``), so the bound stops
    exactly where numpy's statistic of the full run would be over the bound.
    """
    if n_max <= 0 or exceeding <= 0:
        return False
    return exceeding >= n_max - math.floor((n_max - 1) * q)


def throughput_upper_bound(rates: Sequence[float]) -> float:
    """One-sided 99 % Student-t upper bound of the mean of batch rates (inf below 5 batches)."""
    if len(rates) < 5:
        return math.inf
    dof = len(rates) - 1
    t = next((_T99[d] for d in sorted(_T99) if dof <= d), 2.326)
    return statistics.fmean(rates) + t * statistics.stdev(rates) / math.sqrt(len(rates))


@dataclass
class _Tally:
    """One latency metric's values so far: what the bounds need, no list kept."""

    bound_ms: float
    count: int = 0
    exceeding: int = 0
    total: float = 0.0
    mean: float = 0.0
    m2: float = 0.0  # Welford's sum of squared deviations

    def add(self, seconds: float) -> None:
        value = seconds * 1000.0  # in ms, as the metrics compare it
        self.count += 1
        self.exceeding += value > self.bound_ms
        self.total += value
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)

    def lost(self, stat: str, n_max: int) -> bool:
        if stat == "mean":
            return self.total / n_max > self.bound_ms if n_max else False
        if stat == "std":
            return math.sqrt(self.m2 / n_max) > self.bound_ms if n_max else False
        q = 0.5 if stat == "median" else float(stat[1:]) / 100.0
        return percentile_lost(self.exceeding, n_max, q)


def _tallies(slos: Mapping[str, float]) -> dict[str, tuple[str, str, _Tally]]:
    """SLO key → (statistic, metric, its tally), e.g. ``p95_ttft_ms`` → (``p95``, ``ttft``, ...)."""
    out = {}
    for key, bound in slos.items():
        if (match := LATENCY_KEY.match(key)) is not None:
            out[key] = (match.group(1), match.group(3), _Tally(bound))
    return out


def _values(metric: str, r: RequestRecord) -> list[float]:
    if metric == "ttft":
        return [r.ttft]
    if metric == "e2el":
        return [r.latency]
    if metric == "tpot":
        return [] if (t := r.tpot) is None else [t]
    return list(r.itl)


@dataclass
class _Samples:
    """(time, cumulative token chunks) as the run streamed them."""

    times: list[float] = field(default_factory=list)
    chunks: list[float] = field(default_factory=list)

    def add(self, now: float, chunks: int) -> None:
        if not self.times or now > self.times[-1]:
            self.times.append(now)
            self.chunks.append(float(chunks))

    def at(self, t: float) -> float:
        """Chunks streamed by ``t`` (linear between samples)."""
        i = min(bisect.bisect_left(self.times, t), len(self.times) - 1)
        if i == 0 or self.times[i] <= t:
            return self.chunks[i]
        t0, t1 = self.times[i - 1], self.times[i]
        return self.chunks[i - 1] + (self.chunks[i] - self.chunks[i - 1]) * (t - t0) / (t1 - t0)


class EarlyStop:
    """Watches one measured run and decides whether it may end now (see the module doc).

    Args:
        policy: The stops allowed and the incumbent.
        workload: The run's workload (its SLOs, error bound, objective, concurrency).
    """

    def __init__(self, policy: EarlyStopPolicy, workload: Workload):
        self.policy, self.workload = policy, workload
        self._lock = threading.Lock()
        self._decision: StopDecision | None = None
        self._tallies = _tallies(workload.slos)
        self.planned = 0
        self._itl_room = 0  # ITL gaps the requests not yet finished can still add
        self._itl_exact = True  # False once an answer had more chunks than the allowance
        self.completed = self.engine_failures = 0
        self._output_tokens = self._chunks = 0
        self._completions: list[float] = []
        self._samples: dict[int, _Samples] = {}  # per event loop (worker) that streams
        self._t0 = 0.0

    # -- fed by the load generator
    def begin(self, t0: float, output_lens: Sequence[int]) -> None:
        """The measured phase starts at ``t0``, its planned requests asking these output lengths."""
        self._t0, self.planned = t0, len(output_lens)
        self._itl_room = sum(n + ITL_CHUNK_ALLOWANCE for n in output_lens)

    def observe(self, record: RequestRecord) -> None:
        """A finished request (successful or not)."""
        with self._lock:
            self._itl_room -= record.expected_output_len + ITL_CHUNK_ALLOWANCE
            if not record.success:
                self.engine_failures += record.failure_side != CLIENT
                return
            self.completed += 1
            self._completions.append(record.end_time)
            self._output_tokens += record.output_len
            self._chunks += record.n_chunks
            if len(record.itl) > record.expected_output_len + ITL_CHUNK_ALLOWANCE:
                self._itl_exact = False
            for _, metric, tally in self._tallies.values():
                for value in _values(metric, record):
                    tally.add(value)

    def sample(self, at: float, chunks: int, source: int = 0) -> None:
        """Token chunks one event loop (``source``: a worker) had streamed by monotonic time ``at``."""
        with self._lock:
            series = self._samples.setdefault(source, _Samples())
            if not series.times:
                series.add(self._t0, 0)
            series.add(at, chunks)

    def tick(self, now: float, chunks: int | None = None) -> StopDecision | None:
        """The decision, once there is one; ``chunks``: this event loop's live count at ``now``."""
        if chunks is not None:
            self.sample(now, chunks)
        with self._lock:
            if self._decision is None:
                self._decision = self._slo_lost() or self._cannot_win()
            return self._decision

    def request_stop(self, reason: str, evidence: str) -> None:
        """Stop for a reason seen outside the run (the engine died); callable from any thread."""
        with self._lock:
            if self._decision is None and self.policy.allows(reason):
                self._decision = StopDecision(reason, self.completed, evidence)

    @property
    def decision(self) -> StopDecision | None:
        with self._lock:
            return self._decision

    # -- the bounds
    def _slo_lost(self) -> StopDecision | None:
        if not self.policy.allows(SLO_LOST) or not self.planned:
            return None
        for key, (stat, metric, tally) in sorted(self._tallies.items()):
            n_max = self._n_max(metric, tally)
            if n_max is not None and tally.lost(stat, n_max):
                bound = self.workload.slos[key]
                return StopDecision(SLO_LOST, self.completed, _slo_evidence(key, stat, bound, tally, n_max))
        limit = self.workload.max_error_rate
        if self.engine_failures / self.planned > limit:
            evidence = (
                f"error_rate: {self.engine_failures} engine-side failures of {self.planned} planned requests "
                f"> max_error_rate {limit:g}"
            )
            return StopDecision(SLO_LOST, self.completed, evidence)
        return None

    def _n_max(self, metric: str, tally: _Tally) -> int | None:
        """The most values of ``metric`` the finished run can hold (None: not known for sure)."""
        if metric != "itl":
            return self.planned
        return tally.count + max(self._itl_room, 0) if self._itl_exact else None

    def _cannot_win(self) -> StopDecision | None:
        incumbent, margin = self.policy.incumbent, self.policy.noise_margin
        if not self.policy.allows(CANNOT_WIN) or incumbent is None or margin is None:
            return None
        if not self._judges_output_throughput():
            return None
        steady_from, now = self._steady_from(), self._known_until()
        if self.completed < self.policy.min_requests or steady_from is None:
            return None
        if now - steady_from < self.policy.min_seconds:
            return None
        rates = self._batch_rates(steady_from, now)
        per_chunk = max(1.0, self._output_tokens / self._chunks) if self._chunks else 1.0
        upper = throughput_upper_bound(rates) * per_chunk * (1 + margin)
        if upper >= incumbent:
            return None
        mean = statistics.fmean(rates) * per_chunk
        evidence = (
            f"output_throughput {mean:,.1f} tok/s over {now - steady_from:.1f} s of steady state; its 99 % upper "
            f"bound +{margin:.1%} noise ({upper:,.1f}) is below the incumbent's {incumbent:,.1f}"
        )
        return StopDecision(CANNOT_WIN, self.completed, evidence)

    def _judges_output_throughput(self) -> bool:
        terms = self.workload.objective.terms
        return len(terms) == 1 and terms[0].metric == "output_throughput" and terms[0].direction == "maximize"

    def _steady_from(self) -> float | None:
        """When the first full turnover of the concurrency slots completed (None: not yet). An
        uncapped run turns over once a tenth of its requests finished."""
        slots = self.workload.arrival.concurrency or math.ceil(self.planned / 10)
        turnover = max(1, min(slots, self.planned // 4))
        if len(self._completions) < turnover:
            return None
        return max(self._t0, sorted(self._completions)[turnover - 1])

    def _known_until(self) -> float:
        """The latest time every event loop has reported its chunks for: past it, a rate would
        miss the tokens of the loops not yet heard from (and look lower than it is)."""
        return min((series.times[-1] for series in self._samples.values()), default=self._t0)

    def _batch_rates(self, start: float, end: float) -> list[float]:
        width = (end - start) / BATCHES
        edges = [start + i * width for i in range(BATCHES + 1)]
        counts = [sum(series.at(t) for series in self._samples.values()) for t in edges]
        return [(b - a) / width for a, b in itertools.pairwise(counts)]


def _slo_evidence(key: str, stat: str, bound: float, tally: _Tally, n_max: int) -> str:
    if stat in ("mean", "std"):
        return f"{key}: {tally.count} values so far put the {stat} over {n_max} values above {bound:g} ms already"
    return f"{key}: {tally.exceeding} of at most {n_max} values already exceed {bound:g} ms"
