"""The arrival schedule: vLLM's get_request, statistically and step by step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autotune.bench.arrivals import arrival_offsets


def vllm_reference(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> list[float]:
    """vLLM 0.32 serve.py get_request, transcribed (one gamma draw per request, then rescale)."""
    delay_ts: list[float] = []
    for _ in range(n):
        if burstiness == float("inf"):
            delay_ts.append(1.0 / rate)
        else:
            theta = 1.0 / (rate * burstiness)
            delay_ts.append(float(rng.gamma(shape=burstiness, scale=theta)))
    for i in range(1, len(delay_ts)):
        delay_ts[i] += delay_ts[i - 1]
    factor = (n / rate) / delay_ts[-1]
    return [d * factor for d in delay_ts]


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 3.0, math.inf])
def test_matches_vllm_algorithm(burstiness: float) -> None:
    ours = arrival_offsets(50, 7.0, burstiness, np.random.default_rng(3))
    ref = vllm_reference(50, 7.0, burstiness, np.random.default_rng(3))
    assert ours == pytest.approx(ref, rel=1e-12)


def test_infinite_rate_sends_everything_at_once() -> None:
    assert arrival_offsets(5, math.inf, 1.0, np.random.default_rng(0)).tolist() == [0.0] * 5


def test_last_request_lands_on_n_over_rate_and_schedule_is_monotonic() -> None:
    offsets = arrival_offsets(1000, 25.0, 1.0, np.random.default_rng(1))
    assert offsets[-1] == pytest.approx(40.0)
    assert np.all(np.diff(offsets) >= 0)
    assert offsets[0] > 0  # the first request waits one gap, as in vLLM


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gap_distribution_has_the_gamma_shape(burstiness: float) -> None:
    rate = 10.0
    offsets = arrival_offsets(40_000, rate, burstiness, np.random.default_rng(7))
    gaps = np.diff(np.concatenate(([0.0], offsets)))
    assert gaps.mean() == pytest.approx(1 / rate, rel=1e-9)  # exact after the rescale
    cv = gaps.std() / gaps.mean()  # gamma: CV = 1/sqrt(shape)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_constant_gaps_when_burstiness_is_infinite() -> None:
    gaps = np.diff(arrival_offsets(10, 4.0, math.inf, np.random.default_rng(0)))
    assert gaps == pytest.approx([0.25] * 9)


def test_same_seed_same_schedule_other_seed_differs() -> None:
    a = arrival_offsets(100, 5.0, 1.0, np.random.default_rng(11))
    b = arrival_offsets(100, 5.0, 1.0, np.random.default_rng(11))
    c = arrival_offsets(100, 5.0, 1.0, np.random.default_rng(12))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_rejects_non_positive_inputs() -> None:
    with pytest.raises(ValueError):
        arrival_offsets(0, 1.0, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError):
        arrival_offsets(3, 1.0, 0.0, np.random.default_rng(0))


def vllm_ramp_reference(n: int, strategy: str, start: float, end: float, rng: np.random.Generator) -> list[float]:
    """vLLM 0.32 _get_current_request_rate + get_request with a ramp-up (Poisson, no rescale)."""
    delays = []
    for i in range(n):
        progress = i / max(n - 1, 1)
        rate = start + (end - start) * progress if strategy == "linear" else start * (end / start) ** progress
        delays.append(float(rng.gamma(shape=1.0, scale=1.0 / rate)))
    return np.cumsum(delays).tolist()


@pytest.mark.parametrize("strategy", ["linear", "exponential"])
def test_ramp_up_matches_vllm_and_speeds_up(strategy: str) -> None:
    from autotune.bench.arrivals import ramp_rates, schedule
    from autotune.config import Arrival, RampUp

    ramp = RampUp(strategy=strategy, start_rps=2.0, end_rps=50.0)  # type: ignore[arg-type]
    ours = schedule(400, Arrival(ramp_up=ramp), np.random.default_rng(4))
    assert ours.tolist() == pytest.approx(vllm_ramp_reference(400, strategy, 2.0, 50.0, np.random.default_rng(4)))
    rates = ramp_rates(400, ramp)
    assert rates[0] == pytest.approx(2.0) and rates[-1] == pytest.approx(50.0)
    gaps = np.diff(ours)
    assert gaps[:100].mean() > 3 * gaps[-100:].mean()  # the rate ramps up over the run
