"""When each request leaves: ``vllm bench serve``'s ``get_request`` schedule, precomputed.

The gaps are gamma-distributed with shape ``burstiness`` and mean ``1/rate`` (burstiness 1 is a
Poisson process, < 1 burstier, ``inf`` constant), cumulated, then rescaled so that the last
request is due exactly at ``N / rate``; vLLM does this to keep throughput comparable across seeds.
A rate of ``inf`` sends everything at t = 0. The dispatcher sleeps to these absolute offsets
(never to relative gaps, which would accumulate the event loop's wake-up error).

One difference from vLLM: vLLM samples with the global ``np.random`` state seeded by ``--seed``;
we use a generator of our own so the schedule does not depend on what else drew numbers first.
The distribution is the same, the individual numbers are not.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["arrival_offsets"]


def arrival_offsets(n: int, request_rate: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """Planned send time of each request, in seconds after the run starts.

    Args:
        n: Number of requests (> 0).
        request_rate: Mean requests per second; ``inf`` sends all at t = 0.
        burstiness: Gamma shape (> 0); ``inf`` gives constant gaps of ``1/rate``.
        rng: Source of randomness (seed it for a reproducible schedule).

    Returns:
        A non-decreasing array of ``n`` offsets; the last one is ``n / request_rate`` unless the
        rate is infinite (all zeros).

    Raises:
        ValueError: ``n``, ``request_rate`` or ``burstiness`` is not positive.
    """
    if n <= 0 or not request_rate > 0 or not burstiness > 0:
        raise ValueError(f"need n > 0, rate > 0, burstiness > 0 (got {n}, {request_rate}, {burstiness})")
    if math.isinf(request_rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / request_rate)
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    offsets: np.ndarray = np.cumsum(gaps)
    if offsets[-1] == 0:  # vLLM skips the rescale in this (practically impossible) case too
        return offsets
    # vLLM rescales so the last send lands on N/rate (a raw sum is 1-2 % off, seed-dependent).
    scaled: np.ndarray = offsets * ((n / request_rate) / offsets[-1])
    return scaled
