"""Tuning with parallel trials, on the simulator: search quality per trial, and wall time.

Run: ``python benchmarks/parallel.py`` (about 10 minutes on 2 cores; ``--quick`` for a smoke
run; ``--grid grid.json`` reuses the grid an earlier run wrote to the current folder).

1. **Trials to 97 %.** Every point of a 35-point grid (max_running × batched_tokens) is run once
   through the real trial path (``run_trial``: launch the simulated vLLM, benchmark, score) — the
   exhaustive answer. The grid uses Llama-3.1-8B on a simulated L4, measured in the simulator's
   modelled time (its numbers do not depend on the speed-up, so it runs at 20×). Then the
   tuner's own sampler (``TPESampler`` with constant liar, built as ``autotune tune`` builds it)
   searches the grid with N = 1, 2, 4 workers that finish trials asynchronously, each trial
   taking the modelled engine time its grid point took (``engine_time.py``). Trials count in the order they
   *finish*; reported is how many had finished when one reached 97 % of the grid's best
   feasible value, over many sampler seeds (a run that never does counts as beyond the budget).
2. **Wall time at 8 pretend GPUs.** Full ``run_study`` searches (16 trials, no validation) on
   ``AUTOTUNE_FAKE_GPUS=8xH100-80GB``: one trial at a time, then ``--parallel auto`` with TP-1
   trials (8 slots) and with TP-2 trials (4 slots). The simulator runs at 4× real time here, so a
   trial mostly waits on its engine, as on a GPU; at high speed-ups 8 simulated engines and their
   load generators would compete for the CPU instead.

All throughput numbers are the simulator's model, not measurements of a GPU.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna
from engine_time import engine_seconds

from autotune.config import EngineSettings, SearchSpace, StudySettings, Workload, parse_model
from autotune.engines import get_adapter
from autotune.search.objective import is_feasible
from autotune.search.space import suggest
from autotune.search.trial import TrialSpec, run_trial
from autotune.search.tune import TuneJob, make_sampler, run_study

GRID = {"max_running": [8, 16, 32, 64, 128, 256, 512], "batched_tokens": [1024, 2048, 4096, 8192, 16384]}
SPACE = {"params": {name: {"type": "categorical", "choices": values} for name, values in GRID.items()}}
GRID_GPU, GRID_SPEEDUP, GRID_FIXED = "L4", 20.0, {"context_len": 4096}
GRID_WORKLOAD = {
    "name": "bench-grid",
    "dataset": {"input_len": 512, "output_len": 64, "range_ratio": 0.5},
    "num_prompts": 96,
    "warmup_requests": 2,
    "arrival": {"concurrency": 64},
    "slos": {"p95_ttft_ms": 8000},
}
WALL_WORKLOAD = {
    "name": "bench-wall",
    "dataset": {"input_len": 1024, "output_len": 128, "range_ratio": 0.5},
    "num_prompts": 64,
    "warmup_requests": 2,
    "arrival": {"concurrency": 128},
    "slos": {"p95_ttft_ms": 4000},
}
TARGET = 0.97


def _engine(speedup: float, fixed: dict[str, Any] | None = None, gpu: str = "H100-80GB") -> EngineSettings:
    env = {"AUTOTUNE_SIM_GPU": gpu, "AUTOTUNE_SIM_SPEEDUP": str(speedup), "AUTOTUNE_SIM_SEED": "0"}
    return parse_model(
        EngineSettings,
        {
            "kind": "vllm",
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "command": [sys.executable, "-m", "autotune_sim", "vllm"],
            "env": env,
            "fixed_flags": fixed or {},
            "startup_timeout_s": 120,
            "simulated": True,
        },
        "benchmark engine",
    )


# ------------------------------------------------------------------------------ 1. the grid
def evaluate_grid(folder: Path) -> dict[str, dict[str, Any]]:
    """Run every grid point once on the simulator; point key → value, feasibility, wall time."""
    adapter = get_adapter(_engine(GRID_SPEEDUP, GRID_FIXED, GRID_GPU))
    workload = parse_model(Workload, GRID_WORKLOAD, "benchmark workload")
    table: dict[str, dict[str, Any]] = {}
    for n, values in enumerate(itertools.product(*GRID.values())):
        params = dict(zip(GRID, values, strict=True))
        flags = adapter.to_flags({**GRID_FIXED, **params})
        result = run_trial(TrialSpec(n, "grid", flags, folder / str(n)), adapter, workload)
        assert result.score is not None
        table[_key(params)] = {
            "params": params,
            "value": result.score.value,
            "constraints": result.score.constraints,
            "outcome": str(result.outcome),
            "feasible": is_feasible(str(result.outcome), result.score.constraints),
            "retryable": result.outcome.retryable,
            "engine_s": sum(engine_seconds(result.facts, result.timings, result.metrics, GRID_SPEEDUP).values()),
        }
        print(f"  grid {n + 1:2d}/35 {params} → {result.outcome} {result.score.value:,.0f}", file=sys.stderr)
    return table


def _key(params: dict[str, Any]) -> str:
    return ",".join(f"{k}={params[k]}" for k in GRID)


def replay(
    table: dict[str, dict[str, Any]], workers: int, seed: int, budget: int, target: float = TARGET
) -> tuple[int | None, float | None]:
    """One search of the grid by ``workers`` asynchronous workers: (trials finished when
    ``target`` × the best was reached, simulated clock then in mean trial durations); None when never."""
    best = max(p["value"] for p in table.values() if p["feasible"])
    mean_duration = statistics.mean(p["engine_s"] for p in table.values())
    settings = StudySettings(name="replay", trials=budget, seed=seed)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(settings))
    space = parse_model(SearchSpace, SPACE, "benchmark space")
    running: list[tuple[float, int, optuna.Trial, dict[str, Any]]] = []
    asked = finished = 0

    def start(now: float) -> None:
        nonlocal asked
        trial = study.ask()
        point = table[_key(suggest(trial, space))]
        heapq.heappush(running, (now + point["engine_s"], trial.number, trial, point))
        asked += 1

    for _ in range(min(workers, budget)):
        start(0.0)
    while running:
        now, _, trial, point = heapq.heappop(running)
        for name, slack in point["constraints"].items():
            trial.set_constraint(name, slack)
        if point["retryable"]:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, point["value"])
        finished += 1
        if point["feasible"] and point["value"] >= target * best:
            return finished, now / mean_duration
        if asked < budget:
            start(now)
    return None, None


def _spread(values: list[float], budget: int) -> str:
    """Median | p25–p75, with runs that never reached the target counted as beyond the budget."""
    q = statistics.quantiles(values, n=4, method="inclusive")

    def show(v: float) -> str:
        return f"> {budget}" if v == math.inf else f"{v:.1f}" if v % 1 else f"{v:.0f}"

    return f"{show(statistics.median(values))} | {show(q[0])}–{show(q[2])}"


def sampler_table(table: dict[str, dict[str, Any]], seeds: int, budget: int, target: float) -> list[str]:
    rows = [
        f"| workers | trials to {target:.0%} (median) | p25–p75 | reached within budget "
        f"| time to {target:.0%} (median) |",
        "|---|---|---|---|---|",
    ]
    for workers in (1, 2, 4):
        runs = [replay(table, workers, seed, budget, target) for seed in range(seeds)]
        trials = [float(r[0]) if r[0] is not None else math.inf for r in runs]
        clock = [r[1] if r[1] is not None else math.inf for r in runs]
        reached = sum(1 for r in runs if r[0] is not None)
        median_clock = statistics.median(clock)
        shown = "never" if median_clock == math.inf else f"{median_clock:.1f} trial durations"
        rows.append(f"| {workers} | {_spread(trials, budget)} | {reached}/{seeds} | {shown} |")
    return rows


# ------------------------------------------------------------------------------ 2. wall time
def wall_time(folder: Path, label: str, parallel: int | str, tp: int, trials: int, speedup: float) -> float:
    job = TuneJob(
        engine=_engine(speedup, {"tensor_parallel": tp} if tp > 1 else {}),
        space=parse_model(SearchSpace, SPACE, "benchmark space"),
        workload=parse_model(Workload, WALL_WORKLOAD, "benchmark workload"),
        study=parse_model(
            StudySettings,
            {
                "name": label,
                "results_dir": folder,
                "method": "search",
                "trials": trials,
                "finalists": 0,
                "baseline": False,
                "seed": 0,
                "parallel": parallel,
            },
            "benchmark study",
        ),
    )
    t0 = time.monotonic()
    run_study(job)
    return time.monotonic() - t0


def wall_table(folder: Path, trials: int, speedup: float) -> list[str]:
    os.environ["AUTOTUNE_FAKE_GPUS"] = "8xH100-80GB;box=bench-parallel"
    cases = [("one at a time, TP-1", 1, 1, 1), ("auto, TP-1", "auto", 1, 8), ("auto, TP-2", "auto", 2, 4)]
    rows = ["| run | trials at once | wall time | vs one at a time |", "|---|---|---|---|"]
    serial = None
    for i, (label, parallel, tp, slots) in enumerate(cases):
        seconds = wall_time(folder, f"wall{i}", parallel, tp, trials, speedup)
        serial = serial or seconds
        rows.append(f"| {label} | {slots} | {seconds:.0f} s | {serial / seconds:.1f}× |")
        print(f"  {label}: {seconds:.0f} s", file=sys.stderr)
    return rows


def main() -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer seeds and trials (a smoke run)")
    parser.add_argument("--grid", type=Path, help="reuse a grid.json written by an earlier run")
    parser.add_argument("--no-wall", action="store_true", help="skip the wall-time runs")
    args = parser.parse_args()
    seeds, budget, trials = (5, 20, 8) if args.quick else (40, 35, 16)
    with tempfile.TemporaryDirectory(prefix="bench-parallel-") as tmp:
        folder = Path(tmp)
        if args.grid and args.grid.is_file():
            table = json.loads(args.grid.read_text())
        else:
            print("1. exhaustive grid on the simulator", file=sys.stderr)
            table = evaluate_grid(folder / "grid")
            (Path.cwd() / "grid.json").write_text(json.dumps(table, indent=1))
        feasible = [p for p in table.values() if p["feasible"]]
        top = max(feasible, key=lambda p: p["value"])
        near = sum(1 for p in feasible if p["value"] >= TARGET * top["value"])
        print(
            f"grid: {len(feasible)}/{len(table)} points feasible; best {top['value']:,.0f} tok/s at {top['params']}; "
            f"{near} point(s) within {TARGET:.0%} of it"
        )
        for target in (TARGET, 1.0):
            print(f"\nTrials to {target:.0%} of the best ({seeds} sampler seeds, budget {budget} trials):\n")
            print("\n".join(sampler_table(table, seeds, budget, target)))
        if not args.no_wall:
            print(f"\nWall time for {trials} search trials on AUTOTUNE_FAKE_GPUS=8xH100-80GB:\n")
            print("\n".join(wall_table(folder / "wall", trials, speedup=4)))
    print("\nThroughput values are modelled by autotune's simulator.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
