"""What --trials buys, as the run's first line says it: only the stages the space leaves open."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from simstudy import unlaunched_job

from autotune.report.status import launch_plan

WORKLOAD = {"name": "w", "dataset": {"input_len": 128, "output_len": 64}, "num_prompts": 10}


def test_a_cpu_space_plans_only_its_scenario_trials(tmp_path: Path) -> None:
    # demo-vllm-cpu's shape: no memory or graph knob, the context length fixed by the space.
    space = {"params": {"max_running": {"type": "int", "low": 8, "high": 256}}, "fixed": {"context_len": 1024}}
    job = unlaunched_job(tmp_path, space, WORKLOAD)
    job = replace(job, study=job.study.model_copy(update={"trials": 6, "validation_runs": 3}))
    assert launch_plan(job) == (
        "2 runs of the engine's defaults (baseline and noise), then 6 scenario trials (the staged split of "
        "--trials 6), then 2 finalist(s) and the defaults × 3 fresh-engine re-run(s): at most 17 launches"
    )


def test_a_gpu_space_plans_every_stage(tmp_path: Path) -> None:
    space = {
        "params": {
            "memory_fraction": {"type": "float", "low": 0.8, "high": 0.96, "step": 0.02},
            "cuda_graph_max_bs": {"type": "categorical", "choices": [256, 512]},
            "max_running": {"type": "int", "low": 8, "high": 256},
        }
    }
    job = unlaunched_job(tmp_path, space, WORKLOAD)
    plan = launch_plan(job)
    assert "then a context run, up to " in plan and " memory probes, 2 graph sizes and " in plan
    assert plan.endswith("launches")
