"""How well one run pins down its output throughput: a confidence interval from per-second buckets.

A run of a few seconds ranks nothing: on the 2-core test bed 200 prompts ended in 2–4 s, and two
runs of one server differed by more than the configurations being compared. The tuner therefore
asks each run how stable its throughput estimate is, and lengthens a run whose estimate is not
(see :func:`autotune.search.trial` ``_valid_run``).

The estimate: each successful request's output tokens are spread evenly over its decode window
(first token to last), summed into one-second buckets; the first and last buckets (ramp-up and
drain) are dropped; the half-width of a 95 % interval on the mean bucket, relative to the mean,
is the run's stability. Buckets of one run are correlated, so the interval is optimistic; it is a
floor on the noise, which is what deciding "too short" needs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MIN_BUCKETS", "ThroughputInterval", "throughput_interval"]

BUCKET_S = 1.0
MIN_BUCKETS = 5  # fewer steady one-second buckets than this: the run is too short to say
_T95 = {4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


@dataclass(frozen=True)
class ThroughputInterval:
    """Output tokens/s over the run's steady buckets.

    Attributes:
        mean: Mean tokens per second of the steady buckets.
        half_width: Half-width of the 95 % interval (tokens/s); ``inf`` when too few buckets.
        buckets: Steady one-second buckets used.
    """

    mean: float
    half_width: float
    buckets: int

    @property
    def relative(self) -> float:
        """Half-width over the mean (``inf`` when unknown)."""
        return self.half_width / self.mean if self.mean > 0 else math.inf

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "half_width": self.half_width, "relative": self.relative, "buckets": self.buckets}


def _t95(dof: int) -> float:
    """Student's t quantile (two-sided 95 %), from a small table; 1.96 past it."""
    for limit in sorted(_T95):
        if dof <= limit:
            return _T95[limit]
    return 1.96


def throughput_interval(run: Mapping[str, Any]) -> ThroughputInterval:
    """The interval of a run's output throughput, from its per-request arrays
    (``start_times``, ``ttfts``, ``latencies``, ``output_lens``; written with ``detailed=True``)."""
    windows = _decode_windows(run)
    if not windows:
        return ThroughputInterval(0.0, math.inf, 0)
    t0 = min(a for a, _, _ in windows)
    n = math.ceil((max(b for _, b, _ in windows) - t0) / BUCKET_S)
    buckets = [0.0] * max(n, 1)
    for a, b, tokens in windows:
        _spread(buckets, (a - t0) / BUCKET_S, (b - t0) / BUCKET_S, tokens)
    steady = buckets[1:-1]
    if len(steady) < MIN_BUCKETS:
        return ThroughputInterval(sum(buckets) / (n * BUCKET_S), math.inf, len(steady))
    mean = statistics.fmean(steady) / BUCKET_S
    half = _t95(len(steady) - 1) * statistics.stdev(steady) / BUCKET_S / math.sqrt(len(steady))
    return ThroughputInterval(mean, half, len(steady))


def _decode_windows(run: Mapping[str, Any]) -> list[tuple[float, float, int]]:
    """(first token time, last token time, output tokens) of each request that produced tokens."""
    columns: Sequence[Sequence[Any]] = [run.get(k) or [] for k in ("start_times", "ttfts", "latencies", "output_lens")]
    out = []
    for start, ttft, latency, tokens in zip(*columns, strict=False):
        if start and ttft is not None and latency is not None and tokens:
            out.append((start + ttft, start + max(latency, ttft), int(tokens)))
    return out


def _spread(buckets: list[float], a: float, b: float, tokens: int) -> None:
    """Add ``tokens`` evenly over [a, b) (bucket units); a zero-length window lands in one bucket."""
    if b - a <= 1e-9:
        buckets[min(int(a), len(buckets) - 1)] += tokens
        return
    rate = tokens / (b - a)
    i = int(a)
    while i < b and i < len(buckets):
        overlap = min(b, i + 1) - max(a, i)
        buckets[i] += rate * max(overlap, 0.0)
        i += 1
