"""Draw token lengths from a workload's length distributions.

``uniform`` reproduces vLLM's random dataset (``datasets/utils.py get_sampling_params``): integers
uniform in ``[floor(L(1−r)), ceil(L(1+r))]`` from the given generator, input lengths first, then
output lengths, so a ``default_rng(seed)`` gives vLLM's numbers. ``normal`` and ``lognormal`` round
their samples and clip them to ``[min, max]`` (``max`` defaults to the 99.9th percentile, so the
longest request is known before the run); ``empirical`` picks a bin by weight, then a length
uniform inside it.
"""

from __future__ import annotations

import math

import numpy as np

from autotune.config import (
    Dataset,
    EmpiricalLength,
    FixedLength,
    LognormalLength,
    NormalLength,
    UniformLength,
)
from autotune.errors import BenchmarkError

__all__ = ["draw", "sample_lengths"]

AnyLength = FixedLength | UniformLength | NormalLength | LognormalLength | EmpiricalLength


def draw(dist: AnyLength, n: int, rng: np.random.Generator, minus: int = 0, at_least: int = 0) -> np.ndarray:
    """``n`` integer lengths from ``dist``.

    Args:
        dist: The distribution.
        n: How many.
        rng: Generator (consumed exactly as vLLM does for ``uniform``).
        minus: Tokens to take off every length first (the special tokens a server adds to a text
            prompt); for ``uniform`` it comes off the centre before the range, as in vLLM.
        at_least: Floor of every length (vLLM raises the uniform range's bounds to it).

    Returns:
        An int64 array.
    """
    if isinstance(dist, UniformLength):
        centre = max(0, dist.mean - minus)
        low = max(math.floor(centre * (1 - dist.range_ratio)), at_least)
        high = max(math.ceil(centre * (1 + dist.range_ratio)), at_least)
        return rng.integers(low, high + 1, size=n)
    if isinstance(dist, FixedLength):
        raw = np.full(n, dist.value, dtype=np.int64)
    elif isinstance(dist, NormalLength):
        raw = np.clip(np.rint(rng.normal(dist.mean, dist.std, size=n)), dist.low, dist.high).astype(np.int64)
    elif isinstance(dist, LognormalLength):
        samples = rng.lognormal(math.log(dist.median), dist.sigma, size=n)
        raw = np.clip(np.rint(samples), dist.low, dist.high).astype(np.int64)
    else:
        raw = _empirical(dist, n, rng)
    return np.maximum(raw - minus, at_least)


def _empirical(dist: EmpiricalLength, n: int, rng: np.random.Generator) -> np.ndarray:
    weights = np.array([b.weight for b in dist.bins], dtype=float)
    picks = rng.choice(len(dist.bins), size=n, p=weights / weights.sum())
    lows = np.array([b.low for b in dist.bins])[picks]
    highs = np.array([b.high for b in dist.bins])[picks]
    out: np.ndarray = rng.integers(lows, highs + 1)
    return out


def sample_lengths(
    dataset: Dataset, n: int, rng: np.random.Generator, num_special_tokens: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Input and output lengths of ``n`` requests, as vLLM's random dataset draws them.

    Args:
        dataset: Length distributions and shared prefix.
        n: Number of requests.
        rng: Generator; vLLM uses ``np.random.default_rng(seed)`` and draws input lengths first.
        num_special_tokens: Tokens the server adds to a text prompt; subtracted from the input
            length so that the server's count lands on the drawn length (vLLM does the same).

    Returns:
        ``(input_lens, output_lens)``; input lengths exclude ``prefix_len`` and the specials,
        output lengths are at least 1.

    Raises:
        BenchmarkError: Some prompt would have no token at all.
    """
    input_lens = draw(dataset.input_dist, n, rng, minus=num_special_tokens)
    output_lens = draw(dataset.output_dist, n, rng, at_least=1)
    if n and dataset.prefix_len + int(input_lens.min()) < 1:
        raise BenchmarkError(
            f"the input lengths leave no prompt token after {num_special_tokens} special token(s); "
            "raise the input length or prefix_len"
        )
    return input_lens, output_lens
