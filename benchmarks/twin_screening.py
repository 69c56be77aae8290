"""What screening with the twin saves and what it costs: the product's study with and without it.

Each case of ``search_efficiency.py`` runs as ``autotune tune`` runs it (the product's stages,
sampler, early decisions and validation through ``orchestrate``, every configuration served by
the simulator in this process, in modelled time), twice per seed: with the twin predicting and
screening (``--twin --screen``, the defaults) and with the twin predicting only
(``--no-screen``). The twin itself is the product's: ``python -m autotune_sim twin``, fitted on
the study's own runs.

Reported per case and mode, over the seeds: the launches, the modelled engine-seconds the
study spent (start-up and serving of every launch), the trials screened, the pick's noise-free
value against the exhaustive optimum, and the twin's median |error| on the trials it was checked
on. The issue's goal: at least 30 % fewer engine-seconds for a pick within the noise of the
unscreened study's.

Usage::

    python benchmarks/twin_screening.py [--seeds 3] [--budget 40] [--noise 0.10] [--cases NAME ...]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna
from search_efficiency import CASES, Ledger, ProductTrials, SimObjective, exhaustive, product_job

from autotune.engines import get_adapter
from autotune.search.parallel import orchestrate
from autotune.search.progress import NullProgress
from autotune.search.record import SCREENED, trial_records
from autotune.search.storage import best_trial
from autotune.search.tune import make_sampler
from autotune.search.twin import median_error

MODES = {"screened": {"twin": True, "screen": True}, "not screened": {"twin": True, "screen": False}}


def one_study(obj: SimObjective, method: str, seed: int, budget: int, settings: dict[str, Any]) -> dict[str, Any]:
    """One seed of the product's ``method`` on ``obj``'s case with ``settings`` on top."""
    ledger = Ledger(obj, budget, random.Random(f"{obj.case.name}/{method}/{seed}"))
    with tempfile.TemporaryDirectory() as folder:
        job = product_job(obj.case, method, seed, budget, Path(folder), **settings)
        study = optuna.create_study(directions=job.workload.objective.directions, sampler=make_sampler(job.study))
        trials = ProductTrials(ledger)
        orchestrate(job, get_adapter(job.engine), study, NullProgress(), trial_runner=trials)
        best = best_trial(study)
        pick = trials.by_number.get(best.number) if best is not None else None
        records = trial_records(study.get_trials(deepcopy=False))
    error = median_error(records)
    return {
        "launches": len(ledger.trials),
        "engine_s": sum(t.result.cost_s for t in ledger.trials),
        "screened": sum(1 for r in records if r.outcome == SCREENED),
        "pick": (pick.result.true_value or 0.0) if pick and pick.result.truly_feasible else 0.0,
        "twin_error": None if error is None else error[0],
    }


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def _range(rows: list[dict[str, Any]], key: str, scale: float = 1.0, fmt: str = ",.0f") -> str:
    values = sorted(r[key] * scale for r in rows if r[key] is not None)
    if not values:
        return "—"
    return f"{statistics.median(values):{fmt}} ({values[0]:{fmt}} to {values[-1]:{fmt}})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget", type=int, default=40, help="search trials per study")
    ap.add_argument("--noise", type=float, default=0.10, help="relative sd of a launch's speed")
    ap.add_argument("--method", default="staged", choices=["staged", "tpe", "random"])
    ap.add_argument("--cases", nargs="*", default=[c.name for c in CASES], choices=[c.name for c in CASES])
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(
        "| case | mode | launches | engine-s: median (min to max) | screened | pick / optimum | twin's median error |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for case in (c for c in CASES if c.name in args.cases):
        obj = SimObjective(case)
        optimum, _ = exhaustive(obj)
        obj.noise = args.noise
        by_mode = {}
        for mode, settings in MODES.items():
            rows = [one_study(obj, args.method, seed, args.budget, settings) for seed in range(args.seeds)]
            by_mode[mode] = rows
            error = _median(rows, "twin_error")
            print(
                f"| {case.name} | {mode} | {_median(rows, 'launches'):.0f} | {_range(rows, 'engine_s')} "
                f"| {_median(rows, 'screened'):.0f} | {_range(rows, 'pick', 100 / optimum, '.1f')} % "
                f"| {'—' if error is None else f'{100 * error:.1f} %'} |",
                flush=True,
            )
        spent = [_median(by_mode[mode], "engine_s") or 0.0 for mode in MODES]
        saved = 1 - spent[0] / spent[1] if spent[1] else 0.0
        print(f"| {case.name} | saved | | {100 * saved:+.0f} % of the median engine-seconds | | | |", flush=True)
    print(f"\n{args.seeds} seeds, budget {args.budget} search trials, method {args.method}, noise {args.noise:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
