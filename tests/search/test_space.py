"""Search space → Optuna: every type samples in range, conditional params honour conditions."""

import optuna

from autotune.config import SearchSpace, parse_model
from autotune.search.space import finite_points, suggest

SPACE = parse_model(
    SearchSpace,
    {
        "params": {
            "memory_fraction": {"type": "float", "low": 0.8, "high": 0.96, "step": 0.02},
            "max_running": {"type": "int", "low": 8, "high": 512, "log": True},
            "batched_tokens": {"type": "categorical", "choices": [512, 1024]},
            "spec": {"type": "bool"},
            "spec_tokens": {"type": "int", "low": 1, "high": 5, "condition": {"spec": True}},
            "lookup_max": {"type": "int", "low": 2, "high": 4, "condition": {"spec_tokens": 3}},
        }
    },
    "test",
)


def test_samples_stay_in_range_and_on_step() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(50):
        params = suggest(study.ask(), SPACE)
        assert 0.8 <= params["memory_fraction"] <= 0.96
        assert abs(params["memory_fraction"] * 50 - round(params["memory_fraction"] * 50)) < 1e-6
        assert 8 <= params["max_running"] <= 512
        assert params["batched_tokens"] in (512, 1024)


def test_conditional_params_only_when_condition_holds() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    seen_on = seen_off = False
    for _ in range(60):
        params = suggest(study.ask(), SPACE)
        if params["spec"]:
            seen_on = True
            assert "spec_tokens" in params
            assert ("lookup_max" in params) == (params["spec_tokens"] == 3)
        else:
            seen_off = True
            assert "spec_tokens" not in params and "lookup_max" not in params
    assert seen_on and seen_off


def test_enqueued_params_are_reproduced() -> None:
    study = optuna.create_study()
    study.enqueue_trial({"memory_fraction": 0.9, "max_running": 64, "batched_tokens": 512, "spec": False})
    params = suggest(study.ask(), SPACE)
    assert params == {"memory_fraction": 0.9, "max_running": 64, "batched_tokens": 512, "spec": False}


def test_finite_points_lists_active_parameters_only() -> None:
    space = parse_model(
        SearchSpace,
        {
            "params": {
                "spec": {"type": "bool"},
                "k": {"type": "int", "low": 1, "high": 3, "condition": {"spec": True}},
                "mem": {"type": "float", "low": 0.80, "high": 0.85, "step": 0.02},  # Optuna's grid ends at 0.84
            }
        },
        "space",
    )
    points = finite_points(space)
    assert points is not None and len(points) == (1 + 3) * 3
    assert {"spec": False, "mem": 0.84} in points and {"spec": True, "k": 3, "mem": 0.8} in points
    assert all(("k" in p) == p["spec"] for p in points)
    assert len({tuple(sorted(p.items())) for p in points}) == len(points)


def test_finite_points_gives_up_on_continuous_or_large_spaces() -> None:
    continuous = parse_model(SearchSpace, {"params": {"f": {"type": "float", "low": 0.5, "high": 0.9}}}, "space")
    assert finite_points(continuous) is None
    big = parse_model(SearchSpace, {"params": {"n": {"type": "int", "low": 1, "high": 100}}}, "space")
    assert finite_points(big, limit=99) is None
    points = finite_points(big, limit=100)
    assert points is not None and len(points) == 100
