"""AUTOTUNE_SIM_* settings and the fault specification."""

from __future__ import annotations

import random
import statistics

import pytest

from autotune_sim.settings import FaultPlan, SettingsError, launch_factor, load_settings


def test_defaults() -> None:
    s = load_settings({})
    assert s.gpu.name == "H100-80GB" and s.num_gpus == 8 and s.speedup == 1.0 and s.noise == 0.0
    assert s.vllm_version == "0.32.0" and s.sglang_version == "0.5.23" and s.faults == FaultPlan()
    assert s.weight_read_s(2.5e9) == pytest.approx(2.0)  # a second to open, then 2.5 GB/s


def test_the_weight_read_rate_is_read_and_a_bad_one_is_refused() -> None:
    assert load_settings({"AUTOTUNE_SIM_LOAD_GBPS": "0.75"}).weight_read_s(7.5e9) == pytest.approx(11.0)
    with pytest.raises(SettingsError, match="AUTOTUNE_SIM_LOAD_GBPS"):
        load_settings({"AUTOTUNE_SIM_LOAD_GBPS": "fast"})


@pytest.mark.parametrize(
    ("env", "gpus"),
    [
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, 2),
        ({"CUDA_VISIBLE_DEVICES": "5"}, 1),
        ({"CUDA_VISIBLE_DEVICES": ""}, 8),
        ({"CUDA_VISIBLE_DEVICES": "0,1", "AUTOTUNE_SIM_NUM_GPUS": "4"}, 4),
    ],
)
def test_the_node_has_the_gpus_the_engine_can_see(env: dict[str, str], gpus: int) -> None:
    assert load_settings(env).num_gpus == gpus


def test_values_and_engine_variables_are_read() -> None:
    s = load_settings(
        {
            "AUTOTUNE_SIM_GPU": "a100-40gb",
            "AUTOTUNE_SIM_SPEEDUP": "50",
            "AUTOTUNE_SIM_SEED": "7",
            "VLLM_LOG_STATS_INTERVAL": "5",
            "HOME": "/root",
        }
    )
    assert s.gpu.name == "A100-40GB" and s.speedup == 50 and s.seed == 7
    assert dict(s.engine_env) == {"VLLM_LOG_STATS_INTERVAL": "5"}


def test_fault_spec_parses_every_fault() -> None:
    plan = FaultPlan.parse(
        "crash_after_requests=50, crash_after_s=5,hang_startup,slow_startup_s=30,"
        "hang_after_requests=20,drop_connections=0.05,oom_after_requests=3,oom_at_batch_tokens=8000"
    )
    assert plan == FaultPlan(50, 5.0, True, 30.0, 20, 0.05, 3, 8000)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AUTOTUNE_SIM_GPU": "V100"}, "not a preset"),
        ({"AUTOTUNE_SIM_SPEEDUP": "fast"}, "not a number"),
        ({"AUTOTUNE_SIM_SPEEDUP": "0"}, "at least"),
        ({"AUTOTUNE_SIM_FAULT": "explode"}, "unknown fault 'explode'"),
        ({"AUTOTUNE_SIM_FAULT": "crash_after_requests=soon"}, "needs a number"),
    ],
)
def test_bad_settings_say_what_is_wrong(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(env)


def test_each_launch_draws_its_own_speed_when_launch_noise_is_set() -> None:
    assert load_settings({}).launch_factor == 1.0
    factors = {load_settings({"AUTOTUNE_SIM_LAUNCH_NOISE": "0.1"}).launch_factor for _ in range(20)}
    assert len(factors) == 20  # afresh per launch, whatever the seed
    draws = [launch_factor(0.15, random.Random(seed)) for seed in range(2000)]
    assert min(draws) >= 0.5
    spread = statistics.pstdev(draws)
    assert 0.13 < spread < 0.17
    with pytest.raises(SettingsError, match="AUTOTUNE_SIM_LAUNCH_NOISE"):
        load_settings({"AUTOTUNE_SIM_LAUNCH_NOISE": "-0.1"})
