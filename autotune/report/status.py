"""What the tuner says about a study on the terminal: the opening line of a run, the closing
lines (the winner, its gain over the defaults, why the time budget ended it), ``autotune status``
(trials, memory probes apart from workload runs, the memory edge, the Pareto front) and why an
existing study refuses a changed job."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import optuna
import pandas as pd
from rich.box import SIMPLE_HEAD

from autotune.engines.base import flags_text
from autotune.report.console import console, cut, metric_cell, print_table, table
from autotune.report.files import objective_terms
from autotune.report.launch import engine_config, objective_metric, value_summary
from autotune.report.simband import modelled_note
from autotune.report.summary import (
    explain,
    format_value,
    launch_counts,
    no_winner_text,
    outcome_text,
    search_stall,
    trials_text,
)
from autotune.report.twin import twin_cell, twin_line
from autotune.search.job import TuneJob
from autotune.search.noise import study_noise
from autotune.search.record import (
    StageState,
    TrialRecord,
    stage_state,
    stopped,
    study_config,
    study_fingerprint,
    trial_record,
    trial_records,
    validation,
    verdict_on,
)
from autotune.search.stage import Stage
from autotune.search.stages import CONTEXT, graph_sizes, plan_budget
from autotune.search.storage import best_trial, pareto_front, superseded
from autotune.search.studies import existing_study

__all__ = [
    "TRIALS_HELP",
    "budget_line",
    "export_note",
    "launch_plan",
    "memory_edge_line",
    "metric_unit",
    "opening_line",
    "point_text",
    "print_best",
    "print_status",
    "print_trials",
    "resume_difference",
    "stopped_line",
]

TUNING_EXCLUDED = (Stage.BASELINE, Stage.VALIDATION, Stage.CONTEXT)


def opening_line(job: TuneJob, plan: str | None = None) -> str:
    """The run's first study line: what exists already and what will run (``plan``: the tuning
    method's launches by default) — counted from the storage, never assumed."""
    cfg = job.study
    plan = plan or launch_plan(job)
    existing = existing_study(job.study.name, job.storage_url)
    trials = existing.get_trials(deepcopy=False) if existing is not None else []
    if not trials:
        return f"study {cfg.name}: new, in {job.dir}; {plan}"
    return f"study {cfg.name}: resuming with {trials_text(trials)} recorded; {plan}"


TRIALS_HELP = (
    "Tuning trials: search trials, or with --method staged the budget it splits between memory probes and scenario "
    "trials (graph sizes, baseline, noise and validation runs on top; the first line gives the most launches)."
)


def launch_plan(job: TuneJob) -> str:
    """What ``--trials`` buys, stage by stage, and the most engine launches the run can make (a
    failed launch that is retried on a new port or a client-limited run re-run come on top)."""
    cfg = job.study
    if cfg.method == "memory":
        return f"up to {_count(cfg.trials, 'memory probe')} after the baseline: at most {cfg.trials + 1} launches"
    before = int(cfg.baseline) + (cfg.noise_runs if cfg.baseline else 0)
    parts = [_count(before, "run") + " of the engine's defaults (baseline and noise)"] if before else []
    if cfg.method == "staged":
        budget = plan_budget(cfg.trials, job.space)
        graphs = len(graph_sizes(job.space))
        # Only the stages the space leaves something to decide (the context stage skips a
        # context length the space fixes or searches).
        context = CONTEXT not in job.space.params and CONTEXT not in {**job.engine.fixed_flags, **job.space.fixed}
        stages = ["a context run"] if context else []
        stages += [f"up to {_count(budget[Stage.MEMORY_EDGE], 'memory probe')}"] if budget[Stage.MEMORY_EDGE] else []
        stages += [_count(graphs, "graph size")] if graphs else []
        stages.append(_count(budget[Stage.SCENARIO], "scenario trial"))
        listed = ", ".join(stages[:-1]) + " and " + stages[-1] if len(stages) > 1 else stages[0]
        parts.append(f"{listed} (the staged split of --trials {cfg.trials})")
        tuning = int(context) + budget[Stage.MEMORY_EDGE] + graphs + budget[Stage.SCENARIO]
    else:
        parts.append(f"up to {_count(cfg.trials, 'search trial')}")
        tuning = cfg.trials
    validation = (cfg.finalists + int(cfg.baseline)) * cfg.validation_runs if cfg.finalists else 0
    if validation:
        beside = " and the defaults" if cfg.baseline else ""
        parts.append(f"{cfg.finalists} finalist(s){beside} × {cfg.validation_runs} fresh-engine re-run(s)")
    return f"{', then '.join(parts)}: at most {before + tuning + validation} launches"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def budget_line(job: TuneJob, study: optuna.Study, elapsed: float) -> str | None:
    """When the time budget ended the run: what it ran of what was asked, and how to go on."""
    budget = job.study.time_budget_s
    if budget is None or elapsed < budget:
        return None
    trials = study.get_trials(deepcopy=False)
    replaced = superseded(trials)  # a retried or withdrawn trial is not one of those asked for
    finished = [t for t in trials if t.state.is_finished() and t.number not in replaced]
    tuning = sum(1 for r in trial_records(finished) if r.stage not in TUNING_EXCLUDED)
    planned = job.study.finalists * job.study.validation_runs if job.study.method != "memory" else 0
    reruns = sum(max(0, len(v.get("values", [])) - 1) for v in validation(study).values())
    if tuning >= job.study.trials and reruns >= planned:
        return None
    ran = f"{tuning} of {job.study.trials} tuning trials"
    if planned:
        ran += f" and {reruns} of {planned} validation re-runs"
    return (
        f"time budget {_seconds_text(budget)} used up after {_seconds_text(elapsed)}: ran {ran}; "
        "re-run the same command (a larger --time-budget) to go on"
    )


def _seconds_text(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def _differences(before: Any, after: Any, limit: int = 3) -> list[str]:
    """Up to ``limit`` fields that differ, as "field old → new"."""
    old, new = _flatten(json.loads(json.dumps(before))), _flatten(json.loads(json.dumps(after)))
    keys = [k for k in dict.fromkeys([*old, *new]) if old.get(k) != new.get(k)]
    shown = [f"{k} {json.dumps(old.get(k))} → {json.dumps(new.get(k))}" for k in keys[:limit]]
    return shown + ([f"+{len(keys) - limit} more"] if len(keys) > limit else [])


def resume_difference(job: TuneJob) -> str | None:
    """Why an existing study refuses this job, naming what changed (engine, search space or
    workload, field by field), or None when its engine, space and workload are the same."""
    existing = existing_study(job.study.name, job.storage_url)
    if existing is None:
        return None
    stored = study_fingerprint(existing)
    config = study_config(existing)
    if stored is None or stored == job.fingerprint() or not config:
        return None
    changed: list[str] = []
    engine = config.get("engine") or {}
    now = {"kind": job.engine.kind, "model": job.engine.model}
    if any(engine.get(k) != v for k, v in now.items()):
        was = {"kind": engine.get("kind"), "model": engine.get("model")}
        changed.append(f"engine ({'; '.join(_differences(was, now))})")
    for part, model, option in (("space", job.space, "--space"), ("workload", job.workload, "--workload")):
        diff = _differences(config.get(part) or {}, model.model_dump(mode="json"))
        if diff:
            changed.append(f"{part} ({'; '.join(diff)}; check {option})")
    what = ", ".join(changed) or "engine/space/workload"
    return (
        f"study {job.study.name!r} was created with a different {what}; re-run with its original options "
        "or use a new --study name (nothing was changed)"
    )


def memory_edge_line(state: StageState, launches: dict[str, int] | None = None) -> str:
    """What the probes showed: an edge only when a fraction above the kept one failed.
    ``launches``: the memory-edge trials by outcome (named when no probe gave a verdict)."""
    results = {float(k): v for k, v in (state.results or {}).items()}
    edge, note = state.edge, state.note or ""
    failed_high = sorted(f for f, r in results.items() if r == "too_high")
    if not results:
        ran = launch_counts(launches or {})
        return f"memory edge: not found — no probe gave a memory verdict ({ran})"
    if edge is None:
        tried = ", ".join(f"{f:g} {r}" for f, r in sorted(results.items()))
        return f"memory edge: not found — no fraction survived the peak load ({tried})"
    pinned = state.kv_cache_memory_bytes
    pool = f", KV pool kv_cache_memory_bytes={pinned}" if pinned else ""
    if not failed_high and state.ceiling is not None and max(results) >= state.ceiling - 1e-9:
        return (
            f"memory edge: {edge:g}{pool} — the most this host can give now: every probe up to its ceiling "
            f"{state.ceiling:g} passed under the peak load ({note})"
        )
    if not failed_high:
        return (
            f"memory edge: not reached — every probe up to {max(results):g} passed under the peak load; "
            f"{edge:g}{pool} is the highest tried, not an edge "
            f"(raise the space's memory_fraction high, or --probes) ({note})"
        )
    passing = max((f for f, r in results.items() if r == "ok"), default=edge)
    kept = "less one safety step" if edge < passing else "kept as is"
    return (
        f"memory edge: {edge:g}{pool} (highest passing fraction {passing:g}, {kept}; "
        f"{failed_high[0]:g} failed under the peak load) ({note})"
    )


def print_best(study: optuna.Study, best: optuna.trial.FrozenTrial) -> None:
    value, note = value_summary(study, best)
    metric = objective_metric(study)
    sim = f" ({modelled_note(metric)})" if engine_config(study).get("simulated") else ""
    shown = "–" if value is None else f"{value:,.1f}"
    console.print(
        f"best trial {best.number} ({trial_record(best).stage}): {metric} {shown} ({note}){sim}",
        highlight=False,
    )
    console.print("flags: " + (flags_text(trial_record(best).flags) or "(engine defaults)"), highlight=False)
    if line := verdict_on(study, best.number).get("line"):
        console.print(line, highlight=False)


def stopped_line(study: optuna.Study) -> str | None:
    """Why the study stopped early (an engine failing whatever the flags), or why its search
    ended before its trial budget, when it did."""
    if why := stopped(study):
        return f"stopped: {why['line']}"
    stall = search_stall(study)
    return f"search ended early: {stall}" if stall else None


def export_note(study: optuna.Study, best: optuna.trial.FrozenTrial) -> str:
    """The verdict on the exported winner against the defaults, and what the script holds when
    the winner did not beat them beyond the noise."""
    said = verdict_on(study, best.number)
    if not said:
        return ""
    if said.get("beats_defaults") is not False:
        return f" ({said['line']})" if said.get("line") else ""
    if not trial_record(best).params:
        return " (the engine's defaults: no candidate beat them)"
    misses = said.get("slo_misses") or {}
    if misses.get("defaults", 0) > misses.get("winner", 0):
        return (
            " (the winner's flags; their gain over the engine's defaults is within the measured noise, but "
            f"the defaults missed the SLOs in {misses['defaults']} of {misses['rounds']} rounds, these flags "
            f"in {misses['winner']})"
        )
    return (
        " (the winner's flags; they did not beat the engine's defaults beyond the measured noise, "
        "so the defaults serve as well)"
    )


UNITS = {"output_throughput": "tok/s", "total_token_throughput": "tok/s"}


def metric_unit(metric: str) -> str:
    if metric.endswith("_ms"):
        return "ms"
    if metric in ("request_throughput", "request_goodput"):
        return "req/s"
    return UNITS.get(metric, "")


def point_text(metrics: list[str], values: list[float]) -> str:
    parts = []
    for metric, value in zip(metrics, values, strict=False):
        unit = metric_unit(metric)
        parts.append(f"{metric} {value:,.1f}" + (f" {unit}" if unit else ""))
    return ", ".join(parts)


def _status_detail(t: optuna.trial.FrozenTrial) -> str:
    """The flags column: the trial's knobs, then (for anything not ok) what explains it."""
    r = trial_record(t)
    params = " ".join(f"{k}={format_value(v)}" for k, v in (r.params or {}).items())
    outcome = r.outcome or t.state.name.lower()
    reason = explain(t) if outcome != "ok" else ""
    if r.early_stop:
        reason = "; ".join(filter(None, [reason, f"stopped early: {r.early_stop['evidence']}"]))
    if reason:
        return f"{params} — {cut(reason, 160)}" if params else cut(reason, 160)
    startup = startup_text(r.facts.get("startup") or {}, r.timings.get("startup_s"))
    return params + _probe_pool(r) + _reruns(r) + (f" · {startup}" if startup else "") + twin_cell(r)


def outcome_cell(t: optuna.trial.FrozenTrial, r: TrialRecord) -> str:
    """The outcome, and the early stop that ended the trial's run, when one did."""
    outcome = r.outcome or t.state.name.lower()
    return f"{outcome} (stopped: {r.early_stop['reason']})" if r.early_stop else outcome


def _probe_pool(r: TrialRecord) -> str:
    """A served memory probe's KV pool and whether the peak load ran it short (preemptions)."""
    facts = r.facts
    if r.probe is None or "kv_tokens" not in facts:
        return ""
    preempted = facts.get("preemptions")
    return f" · KV {facts['kv_tokens']:,} tokens" + (f", {preempted} preemptions" if preempted is not None else "")


def print_trial_table(trials: list[optuna.trial.FrozenTrial]) -> None:
    """One row per trial: number, stage, outcome, throughput, latency, then its flags or reason."""
    rows = []
    for t in trials:
        r = trial_record(t)
        m = r.metrics
        latency = f"{metric_cell(m.get('p95_ttft_ms'), ',.0f')} / {metric_cell(m.get('p95_tpot_ms'), ',.1f')}"
        rows.append(
            (
                str(t.number),
                r.stage,
                outcome_cell(t, r),
                metric_cell(m.get("output_throughput"), ",.1f"),
                latency if m else "",
                _status_detail(t),
            )
        )
    headers = ("#", "stage", "outcome", "tok/s", "p95 TTFT / TPOT ms")
    # Every column but the last is as wide as its longest cell (headers wrap at spaces) and there
    # are no vertical rules: at 80 columns the knobs column still holds "memory_fraction=0.88" on
    # one line, and what is longer wraps there. Nothing is cut short.
    widths = [max([*(len(w) for w in h.split()), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    grid = table(
        [
            *(
                (h, {"width": w, "justify": "right" if i in (0, 3, 4) else "left"})
                for i, (h, w) in enumerate(zip(headers, widths, strict=True))
            ),
            ("flags / reason", {}),
        ],
        box=SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for row in rows:
        grid.add_row(*row)
    print_table(grid)


def startup_text(split: dict[str, Any], total: float | None = None) -> str:
    """Where the engine's start-up went, as it logged it: ``start-up 21 s: load 0.9 s (daemon),
    compile 3.4 s (warm), graphs 5.2 s``; phases it did not log are left out, and the whole
    start-up the tuner timed comes first, so a split that covers little of it reads as such."""
    parts = []
    if (load := split.get("weights_s")) is not None:
        source = str(split.get("weights_from", ""))
        parts.append(f"load {_seconds(load)}" + (" (daemon)" if source.startswith("daemon") else ""))
    if (compiled := split.get("compile_s")) is not None:
        warm = {True: " (warm)", False: " (cold)", None: ""}[split.get("compile_warm")]
        parts.append(f"compile {_seconds(compiled)}{warm}")
    if (graphs := split.get("capture_s")) is not None:
        parts.append(f"graphs {_seconds(graphs)}")
    if (init := split.get("init_s")) is not None and "compile_s" not in split and "capture_s" not in split:
        parts.append(f"engine init {_seconds(init)}")  # vLLM's init holds compile and capture: shown alone
    if not parts:
        return ""
    return f"start-up {_seconds(total)}: " + ", ".join(parts) if total else "start-up: " + ", ".join(parts)


def _seconds(seconds: float) -> str:
    if seconds < 0.1:
        return f"{seconds:.2f} s"  # as the engine logged it: a tiny model's load is not "0.0 s"
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


def print_trials(frame: pd.DataFrame) -> None:
    """``autotune trials``: one row per trial with its sampled knobs and key metrics."""
    shown = [c for c in frame.columns if c.startswith("param.")]
    metrics = [c for c in ("output_throughput", "p95_ttft_ms", "p95_tpot_ms") if c in frame.columns]
    grid = table([(c, {}) for c in ("trial", "stage", "outcome", *[c.removeprefix("param.") for c in shown], *metrics)])
    for r in frame.to_dict("records"):
        cells = [format_value(r.get(c)) for c in shown] + [metric_cell(r.get(c), ",.1f") for c in metrics]
        grid.add_row(str(r["trial"]), str(r["stage"]), outcome_text(r["outcome"], r.get("early_stop")), *cells)
    print_table(grid)


def _reruns(r: TrialRecord) -> str:
    """Benchmark runs thrown away and run again because the client or the host, not the engine,
    limited them."""
    reruns = r.facts.get("client_reruns") or []
    if not reruns:
        return ""
    reason = str(reruns[-1].get("reason", ""))
    why = "host-disturbed" if reason.startswith("other processes took") else "client-limited"
    return f" · {len(reruns)} run(s) re-run, {why}: {cut(reason, 120)}"


def print_status(st: optuna.Study) -> None:
    """``autotune status``: trials by stage and outcome, workload runs and memory probes in their
    own tables, the memory edge, the Pareto front, why the study stopped, and the winner."""
    trials = st.get_trials(deepcopy=False)
    records = trial_records(trials)
    outcomes = Counter(r.outcome or t.state.name.lower() for t, r in zip(trials, records, strict=True))
    console.print(f"study {st.study_name}: {trials_text(trials)}", highlight=False)
    console.print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())), highlight=False)
    probes = [t for t, r in zip(trials, records, strict=True) if r.probe is not None]
    if workload_runs := [t for t, r in zip(trials, records, strict=True) if r.probe is None]:
        print_trial_table(workload_runs)
    if probes:
        console.print(
            "memory probes, under the workload's peak shape (every slot busy with its longest request)"
            + (": their numbers are not comparable with the workload's above" if workload_runs else ""),
            highlight=False,
        )
        print_trial_table(probes)
    if (edge_state := stage_state(st, Stage.MEMORY_EDGE)) and edge_state.results:
        console.print(memory_edge_line(edge_state), highlight=False)
    if len(st.directions) > 1:
        _print_front(st)
    if line := stopped_line(st):
        console.print(line, highlight=False)
    console.print(study_noise(trials, objective_metric(st)).describe(), highlight=False)
    if line := twin_line(records):
        console.print(line, highlight=False)
    best = best_trial(st)
    if best is None:
        console.print(f"best: none — {no_winner_text(trials)}", highlight=False)
    else:
        print_best(st, best)


def _print_front(st: optuna.Study) -> None:
    front = pareto_front(st)
    metrics = [term.metric for term in objective_terms(st)]
    console.print(
        "Pareto front (feasible, non-dominated): "
        + "; ".join(f"#{t.number}: {point_text(metrics, t.values)}" for t in front)
        if front
        else "Pareto front: empty",
        highlight=False,
    )
