"""Engine counters and latency histograms, in modelled seconds, shared by both dialects.

The dialects render these under their own metric names (``vllm:…`` / ``sglang:…``). The numbers
are modelled GPU time, the time autotune's client measures a simulated run in (it reads the
modelled stamps of :mod:`autotune_sim.openai`).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["EngineStats", "Histogram", "one_two_five"]

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREEMPTION_BUCKETS = (0, 1, 2, 5, 10, 20, 50)


def one_two_five(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50 … up to ``limit`` (vLLM's token-count buckets)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class Histogram:
    """A Prometheus histogram: cumulative buckets are built at render time."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le label, cumulative count) pairs, ``+Inf`` last."""
        out: list[tuple[str, int]] = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out


@dataclass
class EngineStats:
    """Everything the metrics endpoints and the periodic log lines report."""

    max_model_len: int
    created: float = field(default_factory=time.time)
    requests_total: int = 0
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    generation_tokens: int = 0
    prefill_tokens_computed: int = 0
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    retracted_requests: int = 0
    retracted_input_tokens: int = 0
    retracted_output_tokens: int = 0
    # Forward passes by SGLang's mode label: decode_cuda_graph, decode_none, prefill_cuda_graph, prefill_none.
    graph_passes: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    wall_lag_s: float = 0.0
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0, "error": 0})
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    prefill_time: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    decode_time: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    inference_time: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_BUCKETS))
    request_preemptions: Histogram = field(default_factory=lambda: Histogram(PREEMPTION_BUCKETS))
    request_prompt_tokens: Histogram = field(init=False)
    request_generation_tokens: Histogram = field(init=False)

    def __post_init__(self) -> None:
        buckets = one_two_five(self.max_model_len)
        self.request_prompt_tokens = Histogram(buckets)
        self.request_generation_tokens = Histogram(buckets)
