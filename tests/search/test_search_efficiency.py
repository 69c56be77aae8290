"""The search-efficiency benchmark's harness on one tiny case (1 seed, small budget)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from autotune.outcomes import Outcome

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "search_efficiency.py"


@pytest.fixture(scope="module")
def se():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("search_efficiency", _PATH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["search_efficiency"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny(se):  # type: ignore[no-untyped-def]
    # The long-context case at a few requests: each simulated run is short.
    base = next(c for c in se.CASES if c.name == "llama8b-a100-40-longctx")
    workload = base.workload.model_copy(
        update={"num_prompts": 4, "arrival": base.workload.arrival.model_copy(update={"concurrency": 2})}
    )
    case = se.Case("tiny", base.model, base.gpu, base.tp, workload)
    obj = se.SimObjective(case)
    return obj, se.exhaustive(obj)


def test_exhaustive_optimum_is_feasible(tiny, se) -> None:  # type: ignore[no-untyped-def]
    obj, (optimum, arg) = tiny
    assert optimum > 0
    r = obj({**arg, "context_len": obj.case.context_len})
    assert r.outcome == Outcome.OK and r.value == optimum


@pytest.mark.parametrize("method", ["staged", "tpe", "random", "grid"])
def test_methods_never_beat_the_optimum(tiny, se, method: str) -> None:  # type: ignore[no-untyped-def]
    obj, (optimum, _) = tiny
    trials = se.run_method(obj, method, 0, 12)
    assert 0 < len(trials) <= 12
    best = se.pick(trials)
    assert best is None or best.result.value <= optimum * (1 + 1e-9)
    reached = se.trials_to(trials, optimum)
    assert reached is None or 1 <= reached <= len(trials)


def test_peer_probe_checks_startup_only(tiny, se) -> None:  # type: ignore[no-untyped-def]
    # auto_tune.sh keeps the first fraction that starts, from 0.98 down: no run-time check.
    obj, _ = tiny
    trials = se.run_method(obj, "grid", 0, 3)
    assert trials[0].stage == "grid_probe" and trials[0].params["memory_fraction"] == 0.98
