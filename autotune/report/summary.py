"""What a study report says, read once from the Optuna storage and the trials' files.

The HTML page and the Markdown summary render the same :class:`StudyReport`, so the two never
disagree: the winner against the engine defaults (the baseline trial), the gain per metric with
its spread over the validation re-runs, the failures with the log line that explains each one,
and the latency distributions of the winner and the baseline.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from autotune.report.table import trials_frame
from autotune.report.twin import twin_line
from autotune.search.noise import study_noise
from autotune.search.objective import is_feasible
from autotune.search.record import (
    SCREENED,
    WITHDRAWN,
    TrialRecord,
    stage_state,
    stage_states,
    stopped,
    study_config,
    trial_record,
    trial_records,
    verdict_on,
)
from autotune.search.stage import Stage
from autotune.search.storage import best_trial, primary_value

__all__ = [
    "GAIN_METRICS",
    "SERVED",
    "SPREAD_NOTE",
    "FlagRow",
    "Gain",
    "LatencyCdf",
    "StudyReport",
    "TrialNote",
    "explain",
    "format_number",
    "format_value",
    "launch_counts",
    "no_winner_text",
    "outcome_text",
    "summarize",
]

SERVED = ("ok", "slo_violation")
DEFAULT_FLAG = "(engine default)"
SPREAD_NOTE = "Spread is (max − min) / median over the winner's runs (its benchmark repeats when it ran once)."

# (metrics key, label, unit, higher is better): what "gain over the engine defaults" means.
GAIN_METRICS: tuple[tuple[str, str, str, bool], ...] = (
    ("output_throughput", "output throughput", "tok/s", True),
    ("request_throughput", "request throughput", "req/s", True),
    ("request_goodput", "goodput", "req/s within SLOs", True),
    ("p95_ttft_ms", "p95 TTFT", "ms", False),
    ("p99_ttft_ms", "p99 TTFT", "ms", False),
    ("median_tpot_ms", "median TPOT", "ms", False),
    ("p95_tpot_ms", "p95 TPOT", "ms", False),
)

# A knob's value is read from the trial's params first; a stage that sets a flag directly (the
# memory-edge and CUDA-graph probes) may only have the dialect's flag, so these are looked up too.
KNOB_FLAGS: dict[str, tuple[str, ...]] = {
    "memory_fraction": ("--gpu-memory-utilization", "--mem-fraction-static"),
    "cuda_graph_max_bs": ("--max-cudagraph-capture-size", "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs"),
    "max_running": ("--max-num-seqs", "--max-running-requests"),
}

CDF_POINTS = 1000
_PERCENTILE_KEY = re.compile(r"^p(\d+(?:\.\d+)?)_(ttft|e2el)_ms$")


@dataclass(frozen=True)
class Gain:
    """One metric of the winner against the engine defaults.

    Attributes:
        spread: Relative spread (max − min) / median over the winner's runs; None with one run.
        noise: The study's measured run-to-run noise of its objective (None before it was
            measured): a change within it, or within half the metric's own spread, is no mark.
    """

    key: str
    label: str
    unit: str
    higher_is_better: bool
    baseline: float | None
    winner: float | None
    spread: float | None
    noise: float | None = None

    @property
    def change(self) -> float | None:
        """Relative change from the baseline, or None when either side is missing."""
        if self.baseline is None or self.winner is None or self.baseline == 0:
            return None
        return (self.winner - self.baseline) / abs(self.baseline)

    @property
    def improved(self) -> bool | None:
        """Better (True) or worse (False) beyond the noise; None when the change is within it,
        or when the noise is not measured at all (nothing can be told apart then)."""
        change = self.change
        if change is None or self.noise is None:
            return None
        if abs(change) <= max(self.noise, (self.spread or 0.0) / 2):
            return None
        return (change > 0) == self.higher_is_better


@dataclass(frozen=True)
class FlagRow:
    flag: str
    baseline: str
    winner: str

    @property
    def changed(self) -> bool:
        return self.baseline != self.winner


@dataclass(frozen=True)
class TrialNote:
    """A trial that did not end ``ok``, with what explains it."""

    trial: int
    stage: str
    outcome: str
    flags: dict[str, Any]
    reason: str
    log_path: str


@dataclass(frozen=True)
class LatencyCdf:
    """Share of requests at or under each latency (ms), for TTFT and end-to-end latency.

    Attributes:
        per_request: True when built from every request; False when only the recorded
            percentiles were available (then each point is one percentile).
        runs: Benchmark runs pooled.
    """

    ttft: tuple[list[float], list[float]]
    e2el: tuple[list[float], list[float]]
    per_request: bool
    runs: int


@dataclass(frozen=True)
class StudyReport:
    """Everything a report shows, computed once."""

    name: str
    simulated: bool
    engine: str
    model: str
    workload: str
    objective: str
    direction: str
    slos: dict[str, float]
    config: dict[str, Any]
    trials: list[FrozenTrial]
    frame: pd.DataFrame
    winner: FrozenTrial | None
    winner_runs: int
    baseline: FrozenTrial | None
    gains: list[Gain]
    flags: list[FlagRow]
    failures: list[TrialNote]
    outcomes: dict[str, int]
    trials_text: str  # "N trials (by stage)", withdrawn ones apart
    cdfs: dict[str, LatencyCdf] = field(default_factory=dict)
    stage_states: dict[str, dict[str, Any]] = field(default_factory=dict)
    generated: str = ""
    # The tuner's own conclusions: the winner against the defaults in paired runs, and why the
    # study stopped early (an engine that fails whatever the flags), as the tuning loop stored them.
    verdict_line: str = ""  # the paired verdict on the winner against the defaults, when it was judged
    beats_defaults: bool | None = None  # that verdict: True only when every paired round favours the winner
    stopped_line: str = ""
    search_stall: str = ""  # why a search stage ended before its trial budget
    noise_line: str = ""  # the run-to-run noise the study's decisions allowed for, and its source
    twin_line: str = ""  # how far the twin's predictions were from the measured trials

    @property
    def winner_value(self) -> float | None:
        """The tuner's validated median; else the median over the runs this report found."""
        if self.winner is None:
            return None
        gain = self.objective_gain
        value = gain.winner if gain else primary_value(self.winner)
        return None if value is None else float(value)

    @property
    def winner_spread(self) -> float | None:
        if self.winner is None:
            return None
        gain = self.objective_gain
        spread = gain.spread if gain is not None and self.winner_runs > 1 else None
        return None if spread is None else float(spread)

    @property
    def winner_runs_text(self) -> str:
        """How the winner's value was measured: "median of 3 runs, spread 6.7%" or "one run"."""
        runs = f"median of {self.winner_runs} runs" if self.winner_runs > 1 else "one run"
        spread = self.winner_spread
        return runs if spread is None else f"{runs}, spread {spread:.1%}"

    @property
    def objective_gain(self) -> Gain | None:
        return next((g for g in self.gains if g.key == self.objective), None)

    @property
    def no_winner_text(self) -> str:
        """Why there is no winner, by what happened: trials that served and missed the SLOs, or
        launches that never served (counted by outcome)."""
        return no_winner_text(self.trials)


def no_winner_text(trials: Sequence[FrozenTrial]) -> str:
    """The sentence for a study without a feasible trial: "no trial met the SLOs" only when
    trials served the workload and missed them; otherwise what the launches came to."""
    finished = [t for t in trials if t.state.is_finished()]
    counts = dict(Counter(_outcome(t) for t in finished))
    # A memory probe served its own peak load, not the workload: it says nothing about the SLOs.
    served = [t for t in finished if _served(t) and not trial_record(t).is_probe]
    if served:
        missed = sum(1 for t in served if _outcome(t) == "slo_violation")
        return (
            f"no trial met the SLOs: {len(served)} served the workload"
            + (f" and {missed} missed them" if missed else " but none was feasible")
            + f" ({launch_counts(counts)})"
        )
    if finished and all(trial_record(t).is_probe for t in finished):
        return f"no trial ran the workload: only memory probes under its peak shape ({launch_counts(counts)})"
    return f"no trial served the workload: {launch_counts(counts)}"


# ------------------------------------------------------------------------------------ helpers
def format_number(value: float | None) -> str:
    """Thousands separators; fewer decimals for big numbers; "–" for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:,.{digits}f}"


def format_value(value: Any) -> str:
    """A knob or flag value at the precision it was set: ``0.88`` (not 0.9), ``2048`` (not
    2,048.0), booleans as ``true``/``false``; "" for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        # A stepped float is stored as low + k·step (0.8400000000000001): show what was meant.
        return repr(round(value, 10))
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def search_stall(study: optuna.Study) -> str:
    """Why a search stage ended before its trial budget, as the tuning loop stored it ("" when
    it ran its budget)."""
    states = (stage_state(study, name) for name in (Stage.SEARCH, Stage.SCENARIO))
    return next((state.stalled for state in states if state is not None and state.stalled), "")


def trials_text(trials: Sequence[FrozenTrial]) -> str:
    """``12 trials (baseline 1, search 11)``: a withdrawn trial never started an engine, so it
    is named apart rather than counted as one the study ran."""
    records = trial_records(trials)
    withdrawn = sum(1 for r in records if r.outcome == WITHDRAWN)
    stages = Counter(r.stage or "?" for r in records if r.outcome != WITHDRAWN)
    text = f"{len(trials) - withdrawn} trials ({', '.join(f'{k} {v}' for k, v in stages.items())})"
    if screened := sum(1 for r in records if r.outcome == SCREENED):
        text += f", {screened} of them screened by the twin (no engine started)"
    return text + (f"; {withdrawn} more withdrawn before launch" if withdrawn else "")


def launch_counts(outcomes: Mapping[str, int]) -> str:
    """What the launches came to, by outcome: "4 launches, all `oom_startup`" or
    "5 launches: oom_startup 3, crash 2"."""
    total = sum(outcomes.values())
    noun = "launch" if total == 1 else "launches"
    if not outcomes:
        return "no launch finished"
    if len(outcomes) == 1:
        (outcome,) = outcomes
        return f"1 launch, `{outcome}`" if total == 1 else f"{total} {noun}, all `{outcome}`"
    parts = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{total} {noun}: {parts}"


def knob_value(record: TrialRecord, knob: str) -> Any:
    """A portable knob's value in a trial: its param, else its dialect flag, else an engine fact."""
    params, flags = record.params or {}, record.flags
    reduced = record.facts.get("reduced_flags") or {}
    for flag in KNOB_FLAGS.get(knob, ()):
        if flag in reduced:  # the engine lowered it: the trial measured the value it used
            return reduced[flag]["used"]
    if knob in params:
        return params[knob]
    for flag in KNOB_FLAGS.get(knob, ()):
        if flag in flags:
            return flags[flag]
    return record.facts.get(knob)


def _outcome(t: FrozenTrial) -> str:
    return trial_record(t).outcome or t.state.name.lower()


def outcome_text(outcome: Any, early_stop: Any) -> str:
    """A trial's outcome as tables show it: a run stopped early says so, and why."""
    stopped = f" (stopped early: {early_stop})" if isinstance(early_stop, str) and early_stop else ""
    return f"{outcome}{stopped}"


def _served(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and _outcome(t) in SERVED and bool(trial_record(t).metrics)


def _pick_baseline(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The engine-defaults trial: a served one if any (a retry may have served), else the last."""
    baselines = [t for t in trials if trial_record(t).stage == Stage.BASELINE and t.state.is_finished()]
    served = [t for t in baselines if _served(t)]
    pool = served or baselines
    return pool[-1] if pool else None


def _winner_group(trials: Sequence[FrozenTrial], winner: FrozenTrial) -> tuple[FrozenTrial, list[FrozenTrial]]:
    """(the finalist, its served runs): the finalist itself plus its validation re-runs.

    ``best_trial`` may return a validation run; its finalist (same flags) stands for the group.
    """
    validates = trial_record(winner).validates
    root_number = winner.number if validates is None else validates
    root = next((t for t in trials if t.number == root_number), winner)
    runs = [t for t in trials if (t.number == root.number or trial_record(t).validates == root.number)]
    return root, [t for t in runs if _served(t)]


def _median_metrics(runs: Sequence[FrozenTrial]) -> tuple[dict[str, float], dict[str, float]]:
    """Median of every numeric metric over runs, and its relative spread across them."""
    values: dict[str, list[float]] = {}
    for t in runs:
        for key, v in trial_record(t).metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v):
                values.setdefault(key, []).append(float(v))
    medians = {k: statistics.median(vs) for k, vs in values.items()}
    spreads = {k: (max(vs) - min(vs)) / abs(medians[k]) for k, vs in values.items() if len(vs) > 1 and medians[k] != 0}
    return medians, spreads


def _gains(
    baseline: FrozenTrial | None,
    winner_runs: Sequence[FrozenTrial],
    objective: str,
    direction: str,
    noise: float | None,
) -> list[Gain]:
    base = trial_record(baseline).metrics if baseline is not None and _served(baseline) else {}
    medians, spreads = _median_metrics(winner_runs)
    if len(winner_runs) == 1:
        # One run: the only spread known is the one between its benchmark repeats.
        spreads = dict(trial_record(winner_runs[0]).spread)
    specs = list(GAIN_METRICS)
    if objective not in {key for key, *_ in specs}:
        specs.insert(0, (objective, objective, "", direction == "maximize"))
    gains = []
    for key, label, unit, higher in specs:
        if key not in base and key not in medians:
            continue
        b = None if base.get(key) is None else float(base[key])
        gains.append(Gain(key, label, unit, higher, b, medians.get(key), spreads.get(key), noise))
    return gains


def _flag_rows(baseline: FrozenTrial | None, winner: FrozenTrial | None) -> list[FlagRow]:
    base = _flags_run(baseline)
    win = _flags_run(winner)
    names = list(win) + [f for f in base if f not in win]
    rows = [FlagRow(f, base.get(f, DEFAULT_FLAG), win.get(f, DEFAULT_FLAG)) for f in names]
    # Changed flags first: they are the answer; fixed flags shared by both come after.
    return sorted(rows, key=lambda r: not r.changed)


def _flags_run(trial: FrozenTrial | None) -> dict[str, str]:
    """A trial's flags as text, each with the value the engine ran with where it lowered one."""
    if trial is None:
        return {}
    record = trial_record(trial)
    reduced = record.facts.get("reduced_flags") or {}
    out = {}
    for flag, value in record.flags.items():
        used = reduced.get(flag, {}).get("used")
        out[flag] = _flag_text(value) + (f" (engine used {used})" if used is not None else "")
    return out


def _flag_text(value: Any) -> str:
    if value is None:
        return DEFAULT_FLAG
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def explain(t: FrozenTrial) -> str:
    """The line a person needs: the engine's log line, the violated SLOs, or the state."""
    record = trial_record(t)
    if record.reason:
        return record.reason
    outcome = _outcome(t)
    if outcome == "slo_violation":
        violations = record.violations
        return "; ".join(_violation_text(k, v) for k, v in violations.items()) or "missed an SLO"
    if outcome == "unstable":
        return "failed at least one validation re-run with the same flags"
    if outcome == "interrupted":
        return "the tuner stopped during this trial"
    return ""


def _violation_text(key: str, amount: Any) -> str:
    """One missed bound: latency SLOs are relative slack, the error rate an absolute share."""
    if not isinstance(amount, (int, float)):
        return f"{key} missed"
    if key == "error_rate":
        return f"error rate {amount:.1%} over its bound"
    if amount >= 1e5:  # FAILED_VIOLATION: nothing measured it
        return f"{key} not measured"
    return f"{key} {amount:+.0%} over its bound"


def _failures(trials: Sequence[FrozenTrial]) -> list[TrialNote]:
    return [
        TrialNote(t.number, r.stage, _outcome(t), dict(r.flags), explain(t), r.log_path or "")
        for t, r in zip(trials, trial_records(trials), strict=True)
        if t.state.is_finished() and _outcome(t) not in ("ok", WITHDRAWN, SCREENED)  # these never ran
    ]


def _frame(study_trials: Sequence[FrozenTrial], frame: pd.DataFrame) -> pd.DataFrame:
    """``trials_frame`` plus what the plots need: feasibility, knob values, spread, own load."""
    by_number = {t.number: (t, trial_record(t)) for t in study_trials}
    extra = pd.DataFrame(
        [
            {
                "trial": n,
                "served": _served(t),
                "feasible": _served(t) and is_feasible(_outcome(t), r.constraints),
                "memory_fraction": knob_value(r, "memory_fraction"),
                "cuda_graph_max_bs": knob_value(r, "cuda_graph_max_bs"),
                "throughput_spread": r.spread.get("output_throughput"),
                # A probe that ran its own load (the memory edge's peak) is not comparable with the rest.
                "own_load": r.is_probe,
            }
            for n, (t, r) in by_number.items()
        ],
        columns=[
            "trial",
            "served",
            "feasible",
            "memory_fraction",
            "cuda_graph_max_bs",
            "throughput_spread",
            "own_load",
        ],
    )
    if frame.empty:
        return extra
    return frame.merge(extra, on="trial", how="left")


# ------------------------------------------------------------------------------ latency CDFs
def _bench_runs(trial: FrozenTrial) -> list[dict[str, Any]]:
    """The runs in a trial's ``bench.json``; [] when the file is missing or unreadable."""
    trial_dir = trial_record(trial).trial_dir
    if not trial_dir:
        return []
    try:
        data = json.loads((Path(trial_dir) / "bench.json").read_text())
    except (OSError, ValueError):
        return []
    runs = data.get("runs") if isinstance(data, dict) else None
    return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []


def _request_latencies(run: Mapping[str, Any]) -> tuple[list[float], list[float]] | None:
    """Successful requests' (TTFT, E2EL) in ms from vLLM's per-request arrays, if saved.

    These are ``BenchResult.to_json(detailed=True)``'s ``ttfts`` / ``latencies`` (seconds) and
    ``errors`` ("" for a success); a failed request's zero latency must not enter the CDF.
    """
    ttfts, latencies, errors = run.get("ttfts"), run.get("latencies"), run.get("errors")
    if not isinstance(ttfts, list) or not isinstance(latencies, list) or len(ttfts) != len(latencies):
        return None
    if not isinstance(errors, list) or len(errors) != len(ttfts):
        errors = ["" if latency else "failed" for latency in latencies]
    pairs = [
        (float(ttft) * 1000.0, float(latency) * 1000.0)
        for ttft, latency, error in zip(ttfts, latencies, errors, strict=True)
        if not error and isinstance(ttft, (int, float)) and isinstance(latency, (int, float))
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _empirical(samples: list[float]) -> tuple[list[float], list[float]]:
    """The empirical CDF, thinned to at most CDF_POINTS steps so a long run keeps the page small."""
    xs = sorted(samples)
    step = max(1, math.ceil(len(xs) / CDF_POINTS))
    keep = sorted({*range(step - 1, len(xs), step), len(xs) - 1})
    return [xs[i] for i in keep], [(i + 1) / len(xs) for i in keep]


def _from_percentiles(metrics: Mapping[str, Any], metric: str) -> tuple[list[float], list[float]]:
    points = {50.0: metrics.get(f"median_{metric}_ms")}
    for key, value in metrics.items():
        m = _PERCENTILE_KEY.match(key)
        if m and m.group(2) == metric:
            points[float(m.group(1))] = value
    known = sorted((p, float(v)) for p, v in points.items() if isinstance(v, (int, float)) and not math.isnan(v))
    return [v for _, v in known], [p / 100.0 for p, _ in known]


def _cdf(runs: Sequence[FrozenTrial], metrics: Mapping[str, Any]) -> LatencyCdf | None:
    """Pooled per-request CDF over the trials' benchmark runs; percentile points as a fallback."""
    ttft: list[float] = []
    e2el: list[float] = []
    n_runs = 0
    for t in runs:
        for run in _bench_runs(t):
            got = _request_latencies(run)
            if got is not None:
                ttft += got[0]
                e2el += got[1]
                n_runs += 1
    if ttft:
        return LatencyCdf(_empirical(ttft), _empirical(e2el), per_request=True, runs=n_runs)
    fallback = LatencyCdf(_from_percentiles(metrics, "ttft"), _from_percentiles(metrics, "e2el"), False, len(runs))
    return fallback if fallback.ttft[0] or fallback.e2el[0] else None


# -------------------------------------------------------------------------------- the report
def summarize(study: optuna.Study) -> StudyReport:
    """Read a study (and its trials' ``bench.json`` files) into a :class:`StudyReport`."""
    trials = study.get_trials(deepcopy=False)
    config = study_config(study)
    engine_cfg, workload_cfg = config.get("engine") or {}, config.get("workload") or {}
    objective_cfg = workload_cfg.get("objective") or {}
    direction = study.directions[0].name.lower()
    best = best_trial(study)
    baseline = _pick_baseline(trials)
    winner, winner_runs = _winner_group(trials, best) if best is not None else (None, [])
    medians, _ = _median_metrics(winner_runs)
    cdfs: dict[str, LatencyCdf] = {}
    if baseline is not None and _served(baseline):
        base_cdf = _cdf([baseline], trial_record(baseline).metrics)
        if base_cdf is not None:
            cdfs["baseline"] = base_cdf
    if winner_runs:
        win_cdf = _cdf(winner_runs, medians)
        if win_cdf is not None:
            cdfs["winner"] = win_cdf
    objective = str(objective_cfg.get("metric", "output_throughput"))
    noise, said = study_noise(trials, objective), verdict_on(study, getattr(winner, "number", None))
    return StudyReport(
        name=study.study_name,
        simulated=bool(engine_cfg.get("simulated")),
        engine=str(engine_cfg.get("kind", "")),
        model=str(engine_cfg.get("model", "")),
        workload=str(workload_cfg.get("name", "")),
        objective=objective,
        direction=direction,
        slos=dict(workload_cfg.get("slos") or {}),
        config=config,
        trials=list(trials),
        frame=_frame(trials, trials_frame(study)),
        winner=winner,
        winner_runs=len(winner_runs),
        baseline=baseline,
        gains=_gains(baseline, winner_runs, objective, direction, noise.measured) if winner_runs else [],
        flags=_flag_rows(baseline, winner) if winner is not None else [],
        failures=_failures(trials),
        outcomes=dict(Counter(_outcome(t) for t in trials if t.state.is_finished())),
        trials_text=trials_text(trials),
        cdfs=cdfs,
        # What each methodology stage decided (or why it was skipped), as the tuning loop stored it.
        stage_states={name: state.to_json() for name, state in stage_states(study).items()},
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        verdict_line=str(said.get("line", "")),
        beats_defaults=said.get("beats_defaults"),
        stopped_line=str((stopped(study) or {}).get("line", "")),
        search_stall=search_stall(study),
        noise_line=noise.describe(),
        twin_line=twin_line(trial_records(trials)) or "",
    )
