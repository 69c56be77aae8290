"""The search-efficiency benchmark: its harness, and a check that holds every case where it stands.

The benchmark runs the product's own methods (``StudyRun`` and its stages) on the simulator in
this process. The all-cases check runs a cut-down version of it (fewer requests per run, fewer
seeds) and fails when a case where staged costs the fewest modelled engine-seconds to 97 % of the
optimum stops winning, or a case where it loses loses by more than its recorded margin.
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from benchmark_loader import load_benchmark

from autotune.outcomes import Outcome
from autotune.search.stages import peak_requests, peak_workload

SEEDS = 3
BUDGET = 30
# Every case, with the requests per run the check uses (fewer than the benchmark's, to stay fast).
PROMPTS = {
    "qwen7b-l4-offline": 128,
    "llama8b-4090-chat-kvdtype": 96,
    "llama8b-h100-chat-p95": 128,
    "llama8b-a100-40-longctx": 24,
    "qwen3moe-h100-tp2-offline": 128,
    "qwen72b-tp4-h100-chat": 128,
    "sglang-llama8b-h100-chat": 160,
    "sglang-qwen7b-l4-offline": 128,
    "llama70b-tp2-h100-offline": 128,
}
# Where each case stands at these settings (GPU-class noise, 3 seeds, 30 search trials): seeds of
# staged that reached 97 %, and staged's median engine-seconds to 97 % over the better of TPE and
# random (≤ 1: staged wins). Recorded from the run below; a change may improve them, never worsen
# them beyond the slack.
RECORDED: dict[str, tuple[int, float]] = {
    "qwen7b-l4-offline": (3, 0.0),  # TPE and random never reach 97 % here
    "llama8b-4090-chat-kvdtype": (3, 1.45),
    "llama8b-h100-chat-p95": (3, 3.50),
    "llama8b-a100-40-longctx": (3, 1.0),  # the defaults are at 99 %: every method reaches on trial 1
    "qwen3moe-h100-tp2-offline": (3, 1.0),
    "qwen72b-tp4-h100-chat": (3, 0.97),
    "sglang-llama8b-h100-chat": (3, 0.30),
    "sglang-qwen7b-l4-offline": (0, 1.0),  # nobody reaches 97 % (the optimum OOMs under the peak shape)
    "llama70b-tp2-h100-offline": (3, 0.71),
}
SLACK = 1.10


@pytest.fixture(scope="module")
def se() -> Any:
    return load_benchmark("search_efficiency")


def _shrunk(se: Any, name: str, prompts: int) -> Any:
    base = next(c for c in se.CASES if c.name == name)
    workload = base.workload.model_copy(update={"num_prompts": prompts})
    return se.Case(base.name, base.engine, base.model, base.gpu, base.tp, workload, base.space, base.why)


@pytest.fixture(scope="module")
def tiny(se: Any) -> Any:
    # The long-context case at a few requests: each simulated run is short.
    base = next(c for c in se.CASES if c.name == "llama8b-a100-40-longctx")
    workload = base.workload.model_copy(
        update={"num_prompts": 4, "arrival": base.workload.arrival.model_copy(update={"concurrency": 2})}
    )
    # A space whose largest running cap is small, so the peak-shape memory probes are short too.
    space = se._space(seqs=[2, 4, 8], tokens=[2048, 4096, 8192, 16384], graphs=[256, 512, 768])
    obj = se.SimObjective(se.Case("tiny", base.engine, base.model, base.gpu, base.tp, workload, space))
    return obj, se.exhaustive(obj)


def test_exhaustive_optimum_is_feasible(tiny: Any) -> None:
    obj, (optimum, arg) = tiny
    assert optimum > 0
    r = obj({**arg, "context_len": obj.case.context_len})
    assert r.true_outcome == Outcome.OK and r.true_value == optimum


@pytest.mark.sim  # the product's methods read the simulated engine's --help
@pytest.mark.parametrize("method", ["staged", "tpe", "random", "bo5", "grid"])
def test_methods_never_beat_the_optimum(tiny: Any, se: Any, method: str) -> None:
    obj, (optimum, _) = tiny
    ledger = se.run_ledger(obj, method, 0, 12)
    trials = ledger.trials
    # A peer stops at its budget; the product's search trials are the budget and its baseline,
    # noise runs, stage runs and validation come on top, as in `autotune tune`.
    assert 0 < len(trials) <= (12 if method in ("bo5", "grid") else 12 + 20)
    assert all(t.result.cost_s > 0 for t in trials)
    reached = se.reach(ledger, optimum)
    assert reached.best <= 1 + 1e-9
    assert reached.trials is None or 1 <= reached.trials <= len(trials)


@pytest.mark.sim
def test_the_benchmark_runs_the_products_own_stages(tiny: Any, se: Any) -> None:
    obj, _ = tiny
    ledger = se.run_ledger(obj, "staged", 0, 12)
    stages = [str(t.stage) for t in ledger.trials]
    assert stages[:3] == ["baseline", "noise", "context"]
    order = ["baseline", "noise", "context", "memory_edge", "cuda_graph", "scenario", "validation"]
    assert [s for s in order if s in stages] == sorted(set(stages), key=order.index)
    assert "validation" in stages and ledger.pick in ledger.trials
    # Only what vLLM logs and exports reaches the stages: its graph table, not the model's own
    # count of decode steps that ran without a graph.
    served = [t.result.facts for t in ledger.trials if t.result.outcome.served]
    assert served and all("graph_steps" in f and "eager_decode_steps" not in f for f in served)


def test_a_modelled_failure_reaches_the_study_as_the_engine_would_report_it(se: Any) -> None:
    # A start-up OOM names its cause and is not transient, so the product does not retry it.
    spec = se.TrialSpec(3, "scenario", {"--gpu-memory-utilization": 0.99}, None)
    run = se.Result(Outcome.OOM_STARTUP, None, 42.0)
    result = se._trial_result(spec, run, next(iter(se.CASES)).workload, [], "0.32.0")
    assert result.outcome == Outcome.OOM_STARTUP and result.timings["total_s"] == 42.0
    assert result.facts["root_cause"]["kind"] == "oom_startup" and result.facts["transient"] is False
    assert result.facts["failed_at"] == "startup" and "out of memory" in result.reason


@pytest.mark.sim
def test_the_products_search_never_repeats_a_measured_point(tiny: Any, se: Any) -> None:
    # TPE re-proposes points it measured; the product withdraws such a trial and runs an
    # unmeasured point instead (autotune/search/novelty.py). Only the baseline, the noise runs
    # and validation measure a configuration again, on purpose.
    obj, _ = tiny
    for seed in range(4):
        ledger = se.run_ledger(obj, "tpe", seed, 20)
        keys = [str(sorted(t.params.items())) for t in ledger.trials if t.stage == "search"]
        assert len(keys) > 5 and len(keys) == len(set(keys)), seed


@pytest.mark.slow  # whole simulated studies in virtual time: 20-40 s of CPU each
@pytest.mark.parametrize("name", ["qwen72b-tp4-h100-chat", "sglang-qwen7b-l4-offline"])
def test_one_round_of_peak_requests_gives_the_probe_verdicts_of_two(se: Any, name: str) -> None:
    # peak_workload sends one request per slot: a second round of the same requests would repeat
    # the first, so every memory fraction dies or survives the same way either way.
    case = next(c for c in se.CASES if c.name == name)
    obj = se.SimObjective(case)
    one = peak_workload(case.workload, max(case.space.params["max_running"].choices))
    two = one.model_copy(update={"num_prompts": 2 * one.num_prompts})
    verdicts = set()
    for i in range(10):
        params = {"context_len": case.context_len, "memory_fraction": round(0.80 + 0.02 * i, 2)}
        a, b = obj(params, one), obj(params, two)
        assert a.outcome == b.outcome, params
        assert a.cost_s <= b.cost_s
        verdicts.add(a.outcome)
    assert len(verdicts) > 1  # the fractions cross the edge: the comparison covers both sides


@pytest.mark.slow  # whole simulated runs in virtual time
@pytest.mark.parametrize("name", ["llama70b-tp2-h100-offline", "llama8b-4090-chat-kvdtype"])
def test_two_rounds_of_a_full_pool_give_the_probe_verdicts_of_one_request_per_slot(se: Any, name: str) -> None:
    # Where the pool holds a few peak requests at once, one per slot queues hundreds behind it:
    # the probe capped at two rounds of the most the pool could hold dies or survives the same way.
    case = next(c for c in se.CASES if c.name == name)
    obj = se.SimObjective(case)
    served = obj({"context_len": case.context_len}, case.workload)  # the context run: the default fraction
    assert served.outcome.served, served
    slots = max(case.space.params["max_running"].choices)
    distinct = case.workload.longest_request_tokens - case.workload.dataset.prefix_len
    verdicts, capped_somewhere = set(), False
    for i in range(5):
        fraction = round(0.90 + 0.02 * i, 2)
        cap = peak_requests(served.facts, fraction, distinct)
        assert cap is not None
        capped_somewhere |= cap < slots
        params = {"context_len": case.context_len, "memory_fraction": fraction}
        full = obj(params, peak_workload(case.workload, slots))
        capped = obj(params, peak_workload(case.workload, slots, cap))
        assert capped.outcome == full.outcome, (params, cap)
        assert capped.cost_s <= full.cost_s
        verdicts.add(full.outcome)
    assert capped_somewhere and len(verdicts) > 1  # the cap applied, and the fractions cross the edge


def test_peer_probe_checks_startup_only(tiny: Any, se: Any) -> None:
    # auto_tune.sh keeps the first fraction that starts, from 0.98 down: no run-time check.
    obj, _ = tiny
    trials = se.run_ledger(obj, "grid", 0, 3).trials
    assert trials[0].stage == "grid_probe" and trials[0].params["memory_fraction"] == 0.98


def test_a_failed_start_costs_less_than_a_served_run(se: Any) -> None:
    case = _shrunk(se, "qwen7b-l4-offline", 16)
    obj = se.SimObjective(case)
    served = obj({"context_len": case.context_len, "memory_fraction": 0.85})
    refused = obj({"context_len": case.context_len, "memory_fraction": 0.99})
    assert served.outcome.served and refused.outcome == Outcome.OOM_STARTUP
    assert 0 < refused.cost_s < served.cost_s


@pytest.mark.sim
def test_a_study_whose_defaults_fail_measures_its_noise_on_the_first_run_that_served(se: Any) -> None:
    # The 4090's default context does not fit: the baseline is kv_insufficient, so the study
    # re-runs the context run's configuration to measure its noise before any decision needs it.
    obj = se.SimObjective(_shrunk(se, "llama8b-4090-chat-kvdtype", 16))
    ledger = se.run_ledger(obj, "staged", 0, 12)
    stages = [str(t.stage) for t in ledger.trials]
    assert ledger.trials[0].result.outcome == Outcome.KV_INSUFFICIENT
    assert stages[:3] == ["baseline", "context", "noise"]
    assert ledger.trials[2].params == ledger.trials[1].params


@pytest.mark.sim
def test_a_flat_search_over_a_space_its_budget_covers_measures_every_point(tiny: Any, se: Any) -> None:
    # Two requests at a time: every running cap serves alike, so the search stalls from its first
    # trial; with 16 points and a budget of 30 the rest of the budget covers what is left, so the
    # stop rule waits and the search ends only when the space is used up.
    obj, _ = tiny
    space = se.SearchSpace.model_validate(
        {
            "params": {
                "max_running": {"type": "categorical", "choices": [2, 4, 8, 16]},
                "batched_tokens": {"type": "categorical", "choices": [2048, 4096, 8192, 16384]},
            }
        }
    )
    case = se.Case("small", obj.case.engine, obj.case.model, obj.case.gpu, obj.case.tp, obj.case.workload, space)
    ledger = se.run_ledger(se.SimObjective(case), "tpe", 0, 30)
    searched = {str(sorted(t.params.items())) for t in ledger.trials if t.stage == "search"}
    assert len(searched) == 16


def staged_standing(se: Any, name: str) -> tuple[int, float]:
    """(seeds of staged that reached 97 %, staged's median engine-seconds to 97 % over the better
    of TPE's and random's) on the cut-down case."""
    obj = se.SimObjective(_shrunk(se, name, PROMPTS[name]))
    optimum, _ = se.exhaustive(obj)
    cost: dict[str, float] = {}
    reached = 0
    for method in ("staged", "tpe", "random"):
        reaches = [se.reach(se.run_ledger(obj, method, seed, BUDGET), optimum) for seed in range(SEEDS)]
        if method == "staged":
            reached = sum(r.trials is not None for r in reaches)
        cost[method] = statistics.median(r.seconds if r.seconds is not None else float("inf") for r in reaches)
    best_other = min(cost["tpe"], cost["random"])
    if best_other == float("inf"):
        return reached, 1.0 if cost["staged"] == float("inf") else 0.0  # nobody else reached 97 %
    return reached, cost["staged"] / best_other


@pytest.mark.sim
@pytest.mark.slow  # every product method over seeds on a case: up to a minute of CPU each
@pytest.mark.parametrize("name", list(PROMPTS))
def test_every_case_holds_where_it_stands(se: Any, name: str) -> None:
    reached, ratio = staged_standing(se, name)
    was_reached, was_ratio = RECORDED[name]
    assert reached >= was_reached, f"{name}: staged reached 97 % on {reached}/{SEEDS} seeds, was {was_reached}"
    bound = 1.0 if was_ratio <= 1.0 else was_ratio * SLACK  # a win stays a win
    assert ratio <= bound, f"{name}: staged costs {ratio:.2f}× the better plain search (was {was_ratio:.2f})"
