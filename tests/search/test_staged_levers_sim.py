"""The staged study's levers on the simulated engine, end to end: the memory probes start at the
edge the defaults' start-up memory predicts, and an SLO the defaults break moves the knobs its
symptom points to from the first trial after the baseline, with the reason stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from simstudy import sim_engine, sim_job

from autotune.config import SearchSpace, parse_model
from autotune.search import trial as trial_module
from autotune.search.record import stage_state, trial_records
from autotune.search.stages import STEP, predict_memory_edge, slo_first_move
from autotune.search.storage import load_study
from autotune.search.tune import TuneJob, run_study

# One xdist group: under `make test` the module's shared staged study is built once, not on each worker.
pytestmark = [pytest.mark.sim, pytest.mark.slow, pytest.mark.xdist_group("staged-levers")]

# At 20× a modelled TPOT of 18 ms (64 sequences per decode step) reads 0.9 ms on the wall, and
# 10.5 ms (32 sequences) 0.53 ms: the bound breaks the defaults and a busy machine only adds time.
SPEEDUP = 20
TPOT_BOUND_MS = 0.6
WORKLOAD = {
    "name": "chat-small",
    "dataset": {"input_len": 512, "output_len": 64},
    "num_prompts": 64,
    "warmup_requests": 2,
    "arrival": {"concurrency": 64},
    "slos": {"p95_tpot_ms": TPOT_BOUND_MS},
}
SPACE = {
    "params": {
        "memory_fraction": {"type": "float", "low": 0.80, "high": 0.98, "step": STEP},
        "max_running": {"type": "categorical", "choices": [16, 32, 64]},
    }
}


def _job(tmp_path: Path) -> TuneJob:
    # A stats line every 0.1 modelled seconds (vLLM's VLLM_LOG_STATS_INTERVAL): the running peak
    # of 64 is in every run's log (when the lines arrive in time, see below).
    engine = sim_engine(speedup=SPEEDUP, env={"VLLM_LOG_STATS_INTERVAL": "0.1"})
    return sim_job(tmp_path, SPACE, engine=engine, workload=WORKLOAD, method="staged", trials=6, finalists=0)


@pytest.fixture(scope="module")
def staged_study(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trial_module, "GAUGE_INTERVAL_S", 0.05)  # the simulated runs last about a second
        job = _job(tmp_path_factory.mktemp("levers"))
        run_study(job)
    return load_study("t", job.storage_url)


def _by_stage(study: Any, stage: str) -> list[Any]:
    return [r for r in trial_records(study.trials) if r.stage == stage]


def _served(study: Any, stage: str) -> Any:
    """The stage's served run (a run the client could not judge is retried: several records)."""
    [served] = [r for r in _by_stage(study, stage) if r.outcome in ("ok", "slo_violation")]
    return served


def test_memory_probes_start_at_the_predicted_edge(staged_study: Any) -> None:
    baseline = _served(staged_study, "baseline")
    predicted = predict_memory_edge(baseline.facts, 0.80, 0.98)
    assert predicted is not None and predicted >= 0.90  # the log gave what the prediction needs
    probes = _by_stage(staged_study, "memory_edge")
    assert probes[0].probe == predicted
    state = stage_state(staged_study, "memory_edge")
    assert state is not None and state.edge is not None and f"predicts {predicted:.2f}" in (state.note or "")
    # Stepping up from 0.80 needs a probe per 0.02 to reach the same edge.
    assert len(probes) < round((state.edge - 0.80) / STEP) + 1


def test_the_slo_move_is_recorded_and_applied_from_the_context_run_on(staged_study: Any) -> None:
    baseline = _served(staged_study, "baseline")
    assert baseline.outcome == "slo_violation" and "p95_tpot_ms" in baseline.violations
    state = stage_state(staged_study, "slo_first")
    assert state is not None and state.fixed is not None and "TPOT over its bound" in (state.note or ""), state
    # Which run decides depends on timing: the running peak comes from the engine's stats lines
    # and gauges, and a loaded host can deliver the baseline's lines only after its facts were
    # read (then the baseline shows no peak and the context run, which runs the defaults too,
    # decides). Either way the move is the stages' rule applied to the deciding run's own record.
    decider = "baseline" if (state.note or "").startswith("the baseline run") else "context"
    assert (state.note or "").startswith(f"the {decider} run"), state.note
    decided = _served(staged_study, decider)
    expected = slo_first_move(decided.violations, decided.facts, parse_model(SearchSpace, SPACE, "space"))
    assert expected is not None and state.fixed == expected[0] and set(state.fixed) == {"max_running"}
    assert state.fixed["max_running"] < 64  # fewer sequences than the 64 the defaults ran
    moved = state.fixed["max_running"]
    context = _by_stage(staged_study, "context")
    if decider == "baseline":
        assert context and all(r.params["max_running"] == moved for r in context)
    else:
        assert context and all("max_running" not in (r.params or {}) for r in context)
    scenario = _by_stage(staged_study, "scenario")
    assert scenario and scenario[0].params is not None and scenario[0].params["max_running"] == moved
