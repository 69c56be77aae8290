"""What ending a search that stopped paying costs and saves, on the search-efficiency cases.

Run: ``python benchmarks/stop_when_done.py [--seeds 10] [--budget 40] [--cases NAME ...]
[--methods staged tpe] [--noise 0.02]``.

Each seed's run of a method is the one ``benchmarks/search_efficiency.py`` makes (same cases,
same modelled costs, same noise). The product's rule (``autotune.search.stopping.stall_reason``,
with the 5 % noise floor a study of single runs has) is then applied to the run's search-stage
trials in order — ``scenario`` for staged, the sampler's trials for the plain search — with the
stage's own budget as its quota. Printed per case and method:

* *stopped*: seeds whose search the rule ended before its budget;
* *lost the target*: seeds that reached 97 % of the optimum in the full budget but not before
  the stop (the rule's false stops);
* *engine-s saved*: the median share of the run's engine-seconds the stop saved;
* *pick kept*: the median of (the pick at the stop / the pick at the full budget), noise-free.

All numbers are modelled by autotune's simulator, not measured on hardware.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState, create_trial

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search_efficiency import CASES, TARGET, SimObjective, Trial, exhaustive, pick, run_method

from autotune.search.stopping import stall_reason

SEARCH_STAGES = {"staged": "scenario", "tpe": "tpe", "random": "random", "bo5": "bo5"}


@dataclass(frozen=True)
class Stop:
    """One seed's run with the rule applied: where it stopped (None: it ran its budget)."""

    at: int | None  # trials run (all stages) when the search ended
    lost_target: bool
    saved_share: float
    pick_kept: float


def _frozen(trial: Trial) -> FrozenTrial:
    result = trial.result
    if result.value is None:
        return create_trial(state=TrialState.FAIL, user_attrs={"outcome": str(result.outcome)})
    attrs = {"outcome": "ok" if result.feasible else str(result.outcome), "constraints": []}
    return create_trial(state=TrialState.COMPLETE, value=result.value, user_attrs=attrs)


def stop_point(trials: list[Trial], stage: str, noise: float) -> int | None:
    """How many trials the run holds when the rule ends its ``stage`` (None: never)."""
    first = next((i for i, t in enumerate(trials) if t.stage == stage), None)
    if first is None:
        return None
    quota = len(trials) - first
    seen: list[FrozenTrial] = []
    for i, trial in enumerate(trials[first:], first + 1):
        seen.append(_frozen(trial))
        if stall_reason(seen, StudyDirection.MAXIMIZE, quota, noise):
            return i
    return None


def _reached(trials: list[Trial], optimum: float) -> bool:
    return any(t.result.truly_feasible and (t.result.true_value or 0.0) >= TARGET * optimum for t in trials)


def _true(trial: Trial | None) -> float:
    return (trial.result.true_value or 0.0) if trial and trial.result.truly_feasible else 0.0


def apply_rule(trials: list[Trial], stage: str, optimum: float, noise: float) -> Stop:
    at = stop_point(trials, stage, noise)
    kept = trials if at is None else trials[:at]
    full_cost = sum(t.result.cost_s for t in trials) or 1.0
    saved = 1.0 - sum(t.result.cost_s for t in kept) / full_cost
    full_pick = _true(pick(trials))
    return Stop(
        at,
        _reached(trials, optimum) and not _reached(kept, optimum),
        saved,
        _true(pick(kept)) / full_pick if full_pick else 1.0,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--cases", nargs="*", default=[c.name for c in CASES], choices=[c.name for c in CASES])
    ap.add_argument("--methods", nargs="*", default=["staged", "tpe"], choices=list(SEARCH_STAGES))
    ap.add_argument("--noise", type=float, default=0.02, help="relative sd of a run's throughput")
    ap.add_argument(
        "--rule-noise",
        type=float,
        default=0.05,
        help="the noise the stop rule allows for (0.05: the figure the product assumed when the README's table "
        "was measured; a study now measures its own, search/noise.py)",
    )
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print("| case | method | stopped | lost the target | engine-s saved (median) | pick kept (median) |")
    print("|---|---|---|---|---|---|")
    for case in (c for c in CASES if c.name in args.cases):
        obj = SimObjective(case, args.noise)
        optimum, _ = exhaustive(obj)
        for method in args.methods:
            stops = [
                apply_rule(run_method(obj, method, seed, args.budget), SEARCH_STAGES[method], optimum, args.rule_noise)
                for seed in range(args.seeds)
            ]
            stopped = sum(s.at is not None for s in stops)
            lost = sum(s.lost_target for s in stops)
            saved = statistics.median(s.saved_share for s in stops)
            kept = statistics.median(s.pick_kept for s in stops)
            print(
                f"| {case.name} | {method} | {stopped}/{args.seeds} | {lost}/{args.seeds} | {saved:.0%} | {kept:.1%} |",
                flush=True,
            )
    print(f"\n{args.seeds} seeds, budget {args.budget}, noise {args.noise:g}. Modelled by the simulator, not measured.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
