"""Length distributions: bounds, vLLM's uniform numbers, caps of unbounded shapes, histograms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autotune.bench.lengths import draw, sample_lengths
from autotune.config import (
    Dataset,
    EmpiricalLength,
    FixedLength,
    LognormalLength,
    NormalLength,
    UniformLength,
    Workload,
    parse_model,
)

RNG = np.random.default_rng


def test_uniform_is_vllms_range_ratio_with_the_same_numbers() -> None:
    d = UniformLength(dist="uniform", mean=100, range_ratio=0.5)
    got = draw(d, 4000, RNG(0))
    assert got.min() == 50 and got.max() == 150 and (d.low, d.high) == (50, 150)
    assert np.array_equal(got, RNG(0).integers(50, 151, size=4000))


def test_uniform_subtracts_specials_from_the_centre_like_vllm() -> None:
    d = UniformLength(dist="uniform", mean=101, range_ratio=0.5)
    got = draw(d, 2000, RNG(1), minus=1)
    assert got.min() == 50 and got.max() == 150


def test_lognormal_is_clipped_to_its_p999_cap() -> None:
    d = LognormalLength(dist="lognormal", median=200, sigma=1.0)
    cap = math.ceil(200 * math.exp(3.090232306167813))
    assert d.high == cap
    got = draw(d, 50_000, RNG(2))
    assert got.max() == cap and got.min() >= 1
    assert abs(np.median(got) - 200) < 10
    assert 0.0003 < np.mean(got == cap) < 0.003  # about 0.1 % of the mass sits on the cap


def test_normal_respects_explicit_bounds() -> None:
    d = NormalLength(dist="normal", mean=300, std=100, min=100, max=400)
    got = draw(d, 10_000, RNG(3))
    assert got.min() == 100 and got.max() == 400
    assert abs(got.mean() - 290) < 10  # clipping the upper tail pulls the mean down


def test_empirical_draws_inside_bins_with_their_weights() -> None:
    bins = [[10, 20, 3], {"low": 1000, "high": 1000, "weight": 1}]
    d = parse_model(Dataset, {"input": {"dist": "empirical", "bins": bins}}, "x")
    dist = d.input_dist
    assert isinstance(dist, EmpiricalLength) and (dist.low, dist.high) == (10, 1000)
    got = draw(dist, 20_000, RNG(4))
    small = got[got < 1000]
    assert small.min() == 10 and small.max() == 20
    assert abs(np.mean(got == 1000) - 0.25) < 0.02


def test_bare_integer_is_a_fixed_length() -> None:
    d = parse_model(Dataset, {"input": 77, "output": 5}, "x")
    assert d.input_dist == FixedLength(value=77)
    ins, outs = sample_lengths(d, 3, RNG(0))
    assert ins.tolist() == [77] * 3 and outs.tolist() == [5] * 3


def test_output_lengths_are_at_least_one() -> None:
    d = parse_model(Dataset, {"output": {"dist": "normal", "mean": 2, "std": 5}}, "x")
    _, outs = sample_lengths(d, 5000, RNG(5))
    assert outs.min() == 1


@pytest.mark.parametrize(
    ("dataset", "endpoint", "longest"),
    [
        ({"input_len": 100, "output_len": 10, "range_ratio": 0.5, "prefix_len": 20}, "completions", 20 + 150 + 15),
        ({"input": {"dist": "lognormal", "median": 100, "sigma": 0.5, "max": 900}, "output": 64}, "completions", 964),
        ({"input": {"dist": "empirical", "bins": [[1, 10, 1], [500, 700, 1]]}, "output": 8}, "chat", 708 + 16),
        (
            {"kind": "multi_turn", "turns": {"dist": "uniform", "mean": 4, "range_ratio": 0.5}, "input_len": 50,
             "output_len": 20, "prefix_len": 100},
            "chat",
            100 + 6 * 70 + 6 * 16,
        ),
    ],
)  # fmt: skip
def test_longest_request_covers_every_distribution(dataset: dict, endpoint: str, longest: int) -> None:
    w = parse_model(Workload, {"endpoint": endpoint, "dataset": dataset}, "x")
    assert w.longest_request_tokens == longest
    if w.dataset.kind == "random":  # no draw ever exceeds it
        ins, outs = sample_lengths(w.dataset, 20_000, RNG(6))
        assert w.dataset.prefix_len + int((ins + outs).max()) <= longest
