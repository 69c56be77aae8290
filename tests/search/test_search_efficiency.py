"""The search-efficiency benchmark: its harness, and a check that the staged method wins.

The win check runs a cut-down version of ``benchmarks/search_efficiency.py`` (fewer requests per
run, fewer seeds) and fails when staged does not reach 97 % of the optimum on every seed, or
costs more modelled engine-seconds (median over seeds) than the better of TPE and random.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

import pytest
from benchmark_loader import load_benchmark

from autotune.outcomes import Outcome
from autotune.search.stages import peak_workload

SEEDS = 3
BUDGET = 30
# The cases the win check runs, each with fewer requests per run so that it stays fast.
WIN_CASES = {
    "qwen7b-l4-offline": 128,
    "qwen72b-tp4-h100-chat": 128,
    "sglang-llama8b-h100-chat": 160,
    "llama70b-tp2-h100-offline": 128,
}
# Left out. Staged loses on these today (benchmark: 10 seeds, budget 40, full request counts):
# - llama8b-4090-chat-kvdtype: staged 2,759 median engine-s (10/10 seeds) vs random 1,372. The
#   memory probes and the graph walk cost ~10 trials before the scenario search, and half the
#   space is near the optimum.
# - qwen3moe-h100-tp2-offline: staged 707 vs TPE/random 343, for the same reason.
# - llama8b-h100-chat-p95: staged 2,098 (9/10) vs TPE 1,736. The optimum (64 running, 2,048 tokens)
#   needs a smaller chunk too, and the TPOT move only halves the running cap.
# - sglang-qwen7b-l4-offline: staged 0/10 seeds reach 97 %. The optimum (0.92) OOMs under the
#   peak shape at the space's largest running cap, so staged never runs it.
# Left out because it measures nothing: llama8b-a100-40-longctx, where the defaults are at 99 %
# and every method reaches 97 % on trial 1.


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


@pytest.mark.parametrize("method", ["staged", "tpe", "random", "bo5", "grid"])
def test_methods_never_beat_the_optimum(tiny: Any, se: Any, method: str) -> None:
    obj, (optimum, _) = tiny
    trials = se.run_method(obj, method, 0, 12)
    assert 0 < len(trials) <= 12
    assert all(t.result.cost_s > 0 for t in trials)
    reached = se.reach(trials, optimum)
    assert reached.best <= 1 + 1e-9
    assert reached.trials is None or 1 <= reached.trials <= len(trials)


def test_staged_tells_every_run_it_decided_to_its_sampler(tiny: Any, se: Any) -> None:
    # As the product's one study records them: the baseline with no values, a memory probe with
    # its fraction only, and each scenario trial with the fixed values it carried.
    obj, _ = tiny
    ledger = se.Ledger(obj, 12, random.Random(0))
    se.METHODS["staged"](ledger, 0)
    told = ledger.study.get_trials()
    assert len(told) == len(ledger.trials)
    assert told[0].params == {}
    probes = [t for t, run in zip(told, ledger.trials, strict=True) if run.stage == "memory_edge"]
    assert probes and all(set(t.params) == {"memory_fraction"} for t in probes)
    fresh = se.Ledger(obj, 12, random.Random(0), told=False)
    se.METHODS["staged"](fresh, 0)
    assert fresh.study is None


def test_the_products_search_never_repeats_a_measured_point(tiny: Any, se: Any) -> None:
    # TPE re-proposes points it measured; the product withdraws such a trial and runs an
    # unmeasured point instead (autotune/search/novelty.py), as the benchmark's ledger does.
    obj, _ = tiny

    def repeats(skip: bool) -> int:
        count = 0
        for seed in range(8):
            keys = [str(sorted(t.params.items())) for t in se.run_method(obj, "tpe", seed, 20, skip_repeats=skip)]
            count += len(keys) - len(set(keys))
        return count

    assert repeats(skip=True) == 0
    assert repeats(skip=False) > 0  # without the rule TPE does repeat here: the check above can fail


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


def test_peer_probe_checks_startup_only(tiny: Any, se: Any) -> None:
    # auto_tune.sh keeps the first fraction that starts, from 0.98 down: no run-time check.
    obj, _ = tiny
    trials = se.run_method(obj, "grid", 0, 3)
    assert trials[0].stage == "grid_probe" and trials[0].params["memory_fraction"] == 0.98


def test_a_failed_start_costs_less_than_a_served_run(se: Any) -> None:
    case = _shrunk(se, "qwen7b-l4-offline", 16)
    obj = se.SimObjective(case)
    served = obj({"context_len": case.context_len, "memory_fraction": 0.85})
    refused = obj({"context_len": case.context_len, "memory_fraction": 0.99})
    assert served.outcome.served and refused.outcome == Outcome.OOM_STARTUP
    assert 0 < refused.cost_s < served.cost_s


@pytest.mark.slow  # every method over seeds on a case: up to 100 s of CPU each
@pytest.mark.parametrize("name", list(WIN_CASES))
def test_staged_reaches_the_optimum_for_less_engine_time(se: Any, name: str) -> None:
    obj = se.SimObjective(_shrunk(se, name, WIN_CASES[name]))
    optimum, _ = se.exhaustive(obj)
    cost: dict[str, float] = {}
    for method in ("staged", "tpe", "random"):
        reaches = [se.reach(se.run_method(obj, method, seed, BUDGET), optimum) for seed in range(SEEDS)]
        if method == "staged":
            assert all(r.trials is not None for r in reaches), f"staged missed 97 % on {name}: {reaches}"
        cost[method] = statistics.median(r.seconds if r.seconds is not None else float("inf") for r in reaches)
    assert cost["staged"] <= min(cost["tpe"], cost["random"]), f"{name}: engine-seconds {cost}"
