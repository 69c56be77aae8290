"""When each request leaves: ``vllm bench serve``'s ``get_request`` schedule, precomputed.

The gaps are gamma-distributed with shape ``burstiness`` and mean ``1/rate`` (burstiness 1 is a
Poisson process, < 1 burstier, ``inf`` constant), cumulated, then rescaled so that the last
request is due exactly at ``N / rate``; vLLM does this to keep throughput comparable across seeds.
A rate of ``inf`` sends everything at t = 0. The dispatcher sleeps to these absolute offsets
(never to relative gaps, which would accumulate the event loop's wake-up error).

A ramp-up (``--ramp-up-strategy linear|exponential``) gives request ``i`` the rate
``start + (end − start)·p`` or ``start·(end/start)^p`` with ``p = i/(N−1)``, draws its gap with that
rate, and is not rescaled (as in vLLM).

One difference from vLLM: vLLM samples with the global ``np.random`` state seeded by ``--seed``;
we use a generator of our own so the schedule does not depend on what else drew numbers first.
The distribution is the same, the individual numbers are not.
"""

from __future__ import annotations

import math

import numpy as np

from autotune.config import Arrival, RampUp

__all__ = ["arrival_offsets", "ramp_rates", "schedule"]


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


def ramp_rates(n: int, ramp: RampUp) -> np.ndarray:
    """The rate of each of ``n`` requests under a ramp-up (vLLM's ``_get_current_request_rate``)."""
    progress = np.arange(n) / max(n - 1, 1)
    if ramp.strategy == "linear":
        rates: np.ndarray = ramp.start_rps + (ramp.end_rps - ramp.start_rps) * progress
    else:
        rates = ramp.start_rps * (ramp.end_rps / ramp.start_rps) ** progress
    return rates


def _ramp_offsets(n: int, ramp: RampUp, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    rates = ramp_rates(n, ramp)
    constant = math.isinf(burstiness)
    gaps = 1.0 / rates if constant else rng.gamma(shape=burstiness, scale=1.0 / (rates * burstiness))
    offsets: np.ndarray = np.cumsum(gaps)
    return offsets


def schedule(n: int, arrival: Arrival, rng: np.random.Generator) -> np.ndarray:
    """Planned send time of each of ``n`` requests (or sessions) under ``arrival``.

    A ramp-up takes precedence over ``request_rate`` (the config refuses both).
    """
    if arrival.ramp_up is not None:
        return _ramp_offsets(n, arrival.ramp_up, arrival.burstiness, rng)
    return arrival_offsets(n, arrival.request_rate, arrival.burstiness, rng)
