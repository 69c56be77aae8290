"""Shipped feature spaces on the simulator: each runs a trial, conditional knobs stay off the
command line when their condition is off, JSON-field knobs fold into one flag, and the quality
guard records agreement with the baseline's greedy answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from simstudy import sim_engine, sim_job

from autotune.config import EngineSettings, SearchSpace, Workload, load_yaml, parse_model
from autotune.engines.vllm import VllmAdapter
from autotune.search.storage import load_study
from autotune.search.trial import TrialSpec, run_trial
from autotune.search.tune import TuneJob, run_study

pytestmark = [pytest.mark.sim, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = {
    "dataset": {"input_len": 256, "output_len": 32},
    "num_prompts": 32,
    "warmup_requests": 1,
    "arrival": {"concurrency": 16},
}
# The features and DeepSeek spaces run on the simulator with an MoE preset where they need one.
SPACES = {
    "vllm-features": ("vllm", "meta-llama/Llama-3.1-8B-Instruct"),
    "sglang-features": ("sglang", "meta-llama/Llama-3.1-8B-Instruct"),
    "deepseek-vllm": ("vllm", "Qwen/Qwen3-30B-A3B"),
    "deepseek-sglang": ("sglang", "Qwen/Qwen3-30B-A3B"),
}


def _engine(dialect: str, model: str) -> EngineSettings:
    return sim_engine(dialect, model=model)


def _job(tmp_path: Path, space: SearchSpace, engine: EngineSettings, workload: dict[str, Any], **study: Any) -> TuneJob:
    return sim_job(tmp_path, space, engine=engine, workload=workload, method="search", finalists=0, **study)


@pytest.mark.parametrize("name", sorted(SPACES))
def test_shipped_feature_space_runs_a_trial_on_the_sim(name: str, tmp_path: Path) -> None:
    dialect, model = SPACES[name]
    space = load_yaml(ROOT / "search_spaces" / f"{name}.yaml", SearchSpace)
    job = _job(tmp_path, space, _engine(dialect, model), WORKLOAD, trials=2, baseline=False, seed=1)
    run_study(job)
    trials = load_study("t", job.storage_url).trials
    # Every trial is classified by its flags (a DeepSeek layout can leave no KV room on one GPU:
    # kv_insufficient), never an unexplained crash; at least one is served.
    assert all(t.user_attrs["outcome"] != "crash" for t in trials), [t.user_attrs["reason"] for t in trials]
    served = [t for t in trials if t.user_attrs["outcome"] == "ok"]
    assert served and served[0].user_attrs["metrics"]["output_throughput"] > 0


def _argv(trial: Any) -> list[str]:
    return list(json.loads((Path(trial.user_attrs["trial_dir"]) / "argv.json").read_text())["argv"])


def test_conditional_knobs_never_reach_the_engine_when_their_condition_is_off(tmp_path: Path) -> None:
    space = load_yaml(ROOT / "search_spaces" / "vllm-features.yaml", SearchSpace)
    engine = _engine("vllm", "meta-llama/Llama-3.1-8B-Instruct")
    job = _job(tmp_path, space, engine, WORKLOAD, trials=6, baseline=False, seed=5, sampler="random")
    run_study(job)
    seen = set()
    for trial in load_study("t", job.storage_url).trials:
        params, argv, flags = trial.params, _argv(trial), trial.user_attrs["flags"]
        chunked, method = params["chunked_prefill"], params["speculative_config.method"]
        seen.add((chunked, method))
        for flag in ("--max-num-batched-tokens", "--long-prefill-token-threshold"):
            assert (flag in argv) == chunked and (flag in flags) == chunked
        if method is None:
            assert "--speculative-config" not in argv
            assert not any(k.startswith("speculative_config.") and k != "speculative_config.method" for k in params)
        else:
            spec = json.loads(argv[argv.index("--speculative-config") + 1])
            assert spec == {
                "method": "ngram",
                "num_speculative_tokens": params["speculative_config.num_speculative_tokens"],
                "prompt_lookup_max": params["speculative_config.prompt_lookup_max"],
                "prompt_lookup_min": params["speculative_config.prompt_lookup_min"],
            }
    # Both sides of each condition were sampled, so the assertions above checked something.
    assert {c for c, _ in seen} == {False, True} and {m for _, m in seen} == {None, "ngram"}


def test_quality_agreement_is_recorded_against_the_baseline(tmp_path: Path) -> None:
    space = parse_model(SearchSpace, {"params": {"max_running": {"type": "int", "low": 8, "high": 64}}}, "s")
    workload = {**WORKLOAD, "quality_min_agreement": 0.9}
    job = _job(tmp_path, space, _engine("vllm", "meta-llama/Llama-3.1-8B-Instruct"), workload, trials=1, seed=1)
    run_study(job)
    baseline, noise, search = load_study("t", job.storage_url).trials
    assert noise.user_attrs["stage"] == "noise" and noise.user_attrs["facts"]["quality_agreement"] == 1.0
    reference = Path(baseline.user_attrs["trial_dir"]) / "greedy.json"
    assert len(json.loads(reference.read_text())["outputs"]) > 0
    assert "quality_agreement" not in baseline.user_attrs["facts"]  # the reference itself
    # The simulator's answers do not depend on these knobs: the trial agrees fully and is feasible.
    assert search.user_attrs["facts"]["quality_agreement"] == 1.0
    assert search.user_attrs["constraints"]["quality"] == pytest.approx(-0.1)
    assert search.user_attrs["outcome"] == "ok"


def test_answers_that_drift_from_the_baseline_make_the_trial_infeasible(tmp_path: Path) -> None:
    # The simulator has no output-changing knob, so the reference is made to differ: every
    # stored answer is altered after its first half.
    engine = _engine("vllm", "meta-llama/Llama-3.1-8B-Instruct")
    workload = parse_model(Workload, {**WORKLOAD, "quality_min_agreement": 0.9}, "workload")
    adapter = VllmAdapter(engine)
    base = run_trial(TrialSpec(0, "baseline", {}, tmp_path / "0"), adapter, workload)
    stored = json.loads((tmp_path / "0" / "greedy.json").read_text())
    stored["outputs"] = [o[: len(o) // 2] + "#" * (len(o) - len(o) // 2) for o in stored["outputs"]]
    drifted = tmp_path / "drifted.json"
    drifted.write_text(json.dumps(stored))
    trial = run_trial(TrialSpec(1, "search", {}, tmp_path / "1", quality_reference=drifted), adapter, workload)
    assert str(base.outcome) == "ok"
    assert trial.facts["quality_agreement"] == pytest.approx(0.5, abs=0.07)
    assert trial.score is not None and trial.score.violations["quality"] > 0
    assert str(trial.outcome) == "slo_violation"
