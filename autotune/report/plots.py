"""The report's figures (plotly), each built from a :class:`~autotune.report.summary.StudyReport`.

A figure that the study has no data for is returned as a :class:`Plot` with no figure and a note
saying why, so the page can explain the gap instead of showing an empty chart. The probes of the
methodology stages (memory edge, CUDA graphs) are left out entirely when the stage did not run.
"""

from __future__ import annotations

import html
import math
import warnings
from dataclasses import dataclass
from typing import Any

import optuna
import pandas as pd
import plotly.graph_objects as go
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState
from plotly.subplots import make_subplots

from autotune.report.console import cut
from autotune.report.summary import SERVED, StudyReport
from autotune.report.twin import twin_points
from autotune.search.record import trial_record
from autotune.search.stage import Stage

__all__ = ["Plot", "build_plots"]

STAGE_COLOURS: dict[str, str] = {
    Stage.BASELINE: "#7f7f7f",
    Stage.SEARCH: "#1f77b4",
    Stage.VALIDATION: "#2ca02c",
    Stage.CONTEXT: "#9467bd",
    Stage.MEMORY_EDGE: "#ff7f0e",
    Stage.CUDA_GRAPH: "#17becf",
    Stage.SCENARIO: "#8c564b",
}
OUTCOME_COLOURS = {
    "ok": "#2ca02c",
    "slo_violation": "#e6a700",
    "oom_startup": "#d62728",
    "kv_insufficient": "#e377c2",
    "oom_runtime": "#8b0000",
    "invalid_flags": "#7f7f7f",
    "startup_timeout": "#bcbd22",
    "crash": "#000000",
    "interrupted": "#aaaaaa",
    "withdrawn": "#dddddd",
    "unstable": "#ff7f0e",
}
WINNER_COLOUR, BASELINE_COLOUR = "#2ca02c", "#7f7f7f"
CDF_NAMES = {"baseline": "engine defaults", "winner": "winner"}
HEIGHT = 440
MIN_IMPORTANCE_TRIALS = 3
# Stages whose trials Optuna sampled: a plain search, or the scenario search of the staged method.
SEARCH_STAGES = (Stage.SEARCH, Stage.SCENARIO)


@dataclass(frozen=True)
class Plot:
    """One figure of the report.

    Attributes:
        id: The HTML ``id`` of the figure's div (stable: tests and links use it).
        title: Section heading.
        figure: The figure, or None when the study has no data for it.
        note: Why the figure is absent, or a caveat on how to read it.
    """

    id: str
    title: str
    figure: go.Figure | None
    note: str = ""


def _layout(fig: go.Figure, **kwargs: Any) -> go.Figure:
    layout: dict[str, Any] = {
        "template": "plotly_white",
        "height": HEIGHT,
        "margin": {"l": 60, "r": 20, "t": 30, "b": 50},
        "legend": {"orientation": "h", "y": -0.18},
    }
    fig.update_layout(**{**layout, **kwargs})
    return fig


def _hover(frame: pd.DataFrame) -> list[str]:
    """One hover line per trial: its number, stage, outcome and (for failures) the reason."""
    lines = []
    for r in frame.to_dict("records"):
        reason = str(r.get("reason") or "")
        # Log lines may hold "<...>": escape them, plotly reads hover text as HTML.
        tail = f"<br>{html.escape(cut(reason, 120))}" if reason and r.get("outcome") not in SERVED else ""
        lines.append(f"trial {r['trial']} ({r['stage']})<br>{r['outcome']}{tail}")
    return lines


# ------------------------------------------------------------------------ optimisation history
def _stage_points(group: pd.DataFrame, stage: str, x: str, y: str, value_format: str) -> go.Scatter:
    """One stage's trials as markers in its colour; hollow where a constraint failed."""
    return go.Scatter(
        x=group[x],
        y=group[y],
        mode="markers",
        name=stage,
        marker={
            "color": STAGE_COLOURS.get(stage, "#333"),
            "size": 9,
            "symbol": ["circle" if f else "circle-open" for f in group["feasible"]],
            "line": {"width": 2},
        },
        hovertext=_hover(group),
        hovertemplate=f"%{{hovertext}}<br>{value_format}<extra></extra>",
    )


def _best_so_far(served: pd.DataFrame, maximize: bool) -> pd.DataFrame:
    # Validation runs re-measure a finalist: counting them would turn noise into "progress";
    # a probe under its own (peak) load measured something else.
    comparable = (served["stage"] != Stage.VALIDATION) & ~served["own_load"].astype(bool)
    candidates = served[served["feasible"].astype(bool) & comparable]
    feasible = candidates.sort_values("trial")
    best = feasible["value"].cummax() if maximize else feasible["value"].cummin()
    line = pd.DataFrame({"trial": feasible["trial"], "best": best})
    if line.empty:
        return line
    # Carry the line to the last trial: later trials did not beat it.
    tail = pd.DataFrame({"trial": [served["trial"].max()], "best": [line["best"].iloc[-1]]})
    return pd.concat([line, tail], ignore_index=True)


def history(report: StudyReport) -> Plot:
    """Objective per trial coloured by stage (open markers miss an SLO), the best-so-far line,
    and a strip below with every trial that did not serve, by outcome."""
    frame = report.frame
    title = "Optimisation history"
    if frame.empty or "value" not in frame:
        return Plot("plot-history", title, None, "no finished trials yet")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.78, 0.22], vertical_spacing=0.05)
    # A memory probe ran the workload's peak shape, not the workload: its value is on another
    # axis (the memory plot shows it).
    served = frame[frame["served"].astype(bool) & ~frame["own_load"].astype(bool)]
    for stage, group in served.groupby("stage", sort=False):
        fig.add_trace(
            _stage_points(group, str(stage), "trial", "value", "%{y:,.1f}"),
            row=1,
            col=1,
        )
    best = _best_so_far(served, report.direction == "maximize")
    if not best.empty:
        fig.add_trace(
            go.Scatter(
                x=best["trial"], y=best["best"], mode="lines", name="best so far", line={"shape": "hv", "color": "#111"}
            ),
            row=1,
            col=1,
        )
    stopped = _stopped_early(frame, report.objective)
    if not stopped.empty:
        fig.add_trace(
            go.Scatter(
                x=stopped["trial"],
                y=stopped["stopped_at"],
                mode="markers",
                name="stopped early",
                marker={"color": "#888", "symbol": "triangle-down-open", "size": 10, "line": {"width": 2}},
                hovertext=[
                    f"{h}<br>stopped early: {html.escape(str(r))}"
                    for h, r in zip(_hover(stopped), stopped["early_stop"], strict=True)
                ],
                hovertemplate="%{hovertext}<br>at %{y:,.1f} when stopped<extra></extra>",
            ),
            row=1,
            col=1,
        )
    unfinished = frame["outcome"].isin(["running", "waiting"]) | frame["outcome"].isna()
    failed = frame[~frame["served"].astype(bool) & ~unfinished & ~frame["trial"].isin(stopped["trial"])]
    for outcome, group in failed.groupby("outcome", sort=False):
        fig.add_trace(
            go.Scatter(
                x=group["trial"],
                y=[str(outcome)] * len(group),
                mode="markers",
                name=str(outcome),
                marker={"color": OUTCOME_COLOURS.get(str(outcome), "#333"), "symbol": "x", "size": 10},
                hovertext=_hover(group),
                hovertemplate="%{hovertext}<extra></extra>",
            ),
            row=2,
            col=1,
        )
    fig.update_yaxes(title_text=report.objective, row=1, col=1)
    fig.update_yaxes(title_text="no value", type="category", row=2, col=1)
    fig.update_xaxes(title_text="trial", row=2, col=1)
    note = (
        "Open markers served the workload but missed an SLO; triangles were stopped early, at the value their "
        "partial run had reached (no score); crosses below did not serve it. Memory probes, which ran the "
        "workload's peak shape, are in the memory plot."
    )
    return Plot("plot-history", title, _layout(fig, height=HEIGHT + 80), note)


def _stopped_early(frame: pd.DataFrame, objective: str) -> pd.DataFrame:
    """Trials whose run was stopped early and left no score, with the objective their partial run
    had reached when it was stopped (``stopped_at``)."""
    if "early_stop" not in frame or objective not in frame:
        return pd.DataFrame(columns=["trial", "stopped_at", "early_stop"])
    rows = frame[frame["early_stop"].notna() & ~frame["served"].astype(bool) & frame[objective].notna()]
    return rows.assign(stopped_at=rows[objective])


# --------------------------------------------------------------------------- Pareto front
def _pareto_front(points: pd.DataFrame) -> pd.DataFrame:
    """Trials no other trial beats on both higher throughput and lower p95 TTFT."""
    front, best_tps = [], -math.inf
    for r in points.sort_values(["p95_ttft_ms", "output_throughput"], ascending=[True, False]).to_dict("records"):
        if r["output_throughput"] > best_tps:
            front.append(r)
            best_tps = r["output_throughput"]
    return pd.DataFrame(front)


def _marker_trial(fig: go.Figure, trial: FrozenTrial | None, name: str, colour: str, symbol: str) -> None:
    metrics = trial_record(trial).metrics if trial is not None else {}
    if "output_throughput" in metrics and "p95_ttft_ms" in metrics and trial is not None:
        fig.add_trace(
            go.Scatter(
                x=[metrics["p95_ttft_ms"]],
                y=[metrics["output_throughput"]],
                mode="markers",
                name=f"{name} (#{trial.number})",
                marker={"color": colour, "symbol": symbol, "size": 18, "line": {"width": 1, "color": "#111"}},
            )
        )


def pareto(report: StudyReport) -> Plot:
    """Output throughput against p95 TTFT for every served trial, with the Pareto front."""
    title = "Throughput vs p95 TTFT"
    frame = report.frame
    needed = {"output_throughput", "p95_ttft_ms"}
    if frame.empty or not needed <= set(frame.columns):
        return Plot("plot-pareto", title, None, "no trial served the workload")
    points = frame[frame["served"].astype(bool) & ~frame["own_load"].astype(bool)].dropna(subset=list(needed))
    if points.empty:
        return Plot("plot-pareto", title, None, "no trial served the workload")
    fig = go.Figure()
    for stage, group in points.groupby("stage", sort=False):
        fig.add_trace(
            _stage_points(group, str(stage), "p95_ttft_ms", "output_throughput", "%{x:,.0f} ms, %{y:,.1f} tok/s")
        )
    front = _pareto_front(points)
    fig.add_trace(
        go.Scatter(
            x=front["p95_ttft_ms"],
            y=front["output_throughput"],
            mode="lines",
            name="Pareto front",
            line={"dash": "dash", "color": "#111", "shape": "vh"},
        )
    )
    _marker_trial(fig, report.baseline, "engine defaults", BASELINE_COLOUR, "diamond")
    _marker_trial(fig, report.winner, "winner", WINNER_COLOUR, "star")
    if "p95_ttft_ms" in report.slos:
        fig.add_vline(x=report.slos["p95_ttft_ms"], line={"dash": "dot", "color": "#d62728"}, annotation_text="SLO")
    fig.update_xaxes(title_text="p95 TTFT (ms)")
    fig.update_yaxes(title_text="output throughput (tok/s)")
    note = "Up and to the left is better; open markers missed an SLO."
    if frame["own_load"].astype(bool).any():
        note += " Probes that ran the peak load (memory edge) are left out: their numbers measure another load."
    return Plot("plot-pareto", title, _layout(fig), note)


# ------------------------------------------------------------------- methodology-stage probes
def memory_edge(report: StudyReport) -> Plot | None:
    """Memory fraction against the KV tokens it bought, coloured by outcome (None: no probe)."""
    frame, state = report.frame, report.stage_states.get(Stage.MEMORY_EDGE) or {}
    title = "Memory edge probe"
    probe = (
        frame[(frame["stage"] == Stage.MEMORY_EDGE) & frame["memory_fraction"].notna()] if not frame.empty else frame
    )
    if probe.empty:
        return Plot("plot-memory-edge", title, None, f"skipped: {state['skipped']}") if state.get("skipped") else None
    kv = probe["fact.kv_tokens"] if "fact.kv_tokens" in probe else pd.Series(math.nan, index=probe.index)
    fig = go.Figure()
    for outcome, group in probe.assign(kv=kv.fillna(0)).groupby("outcome", sort=False):
        served = str(outcome) in SERVED
        fig.add_trace(
            go.Scatter(
                x=group["memory_fraction"],
                y=group["kv"],
                mode="markers",
                name=str(outcome),
                marker={
                    "color": OUTCOME_COLOURS.get(str(outcome), "#333"),
                    "size": 11,
                    "symbol": "circle" if served else "x",
                },
                hovertext=_hover(group),
                hovertemplate="%{hovertext}<br>fraction %{x}<br>%{y:,.0f} KV tokens<extra></extra>",
            )
        )
    winner = None if report.winner is None else frame.set_index("trial")["memory_fraction"].get(report.winner.number)
    labels: dict[float, list[str]] = {}
    for label, x in (("edge kept", state.get("edge")), ("winner", winner)):
        if x is not None and not pd.isna(x):
            labels.setdefault(float(x), []).append(label)
    for x, names in labels.items():  # one line per value, so equal values do not print over each other
        fig.add_vline(x=x, line={"dash": "dot", "color": WINNER_COLOUR}, annotation_text=" = ".join(names))
    fig.update_xaxes(title_text="memory fraction")
    fig.update_yaxes(title_text="KV cache tokens")
    note = "Each probe ran the peak load; a trial that failed before the engine reported its KV pool sits at zero."
    return Plot("plot-memory-edge", title, _layout(fig), note)


def cuda_graph(report: StudyReport) -> Plot | None:
    """Output throughput per captured CUDA-graph batch size (None: the stage did not run)."""
    frame, state = report.frame, report.stage_states.get(Stage.CUDA_GRAPH) or {}
    title = "CUDA-graph coverage"
    probe = (
        frame[(frame["stage"] == Stage.CUDA_GRAPH) & frame["cuda_graph_max_bs"].notna()] if not frame.empty else frame
    )
    if probe.empty:
        return Plot("plot-cuda-graph", title, None, f"skipped: {state['skipped']}") if state.get("skipped") else None
    probe = probe.copy()
    probe["bs"] = pd.to_numeric(probe["cuda_graph_max_bs"], errors="coerce")
    probe = probe.dropna(subset=["bs"]).sort_values("bs")
    tps = probe["output_throughput"].astype(float).fillna(0.0)
    fig = go.Figure(
        go.Bar(
            x=[str(int(bs)) for bs in probe["bs"]],
            y=tps,
            error_y={"type": "data", "array": (tps * probe["throughput_spread"].astype(float).fillna(0.0)).tolist()},
            marker={"color": [OUTCOME_COLOURS.get(str(o), "#333") for o in probe["outcome"]]},
            hovertext=_hover(probe),
            hovertemplate="%{hovertext}<br>%{y:,.1f} tok/s<extra></extra>",
            name="output throughput",
        )
    )
    base = trial_record(report.baseline).metrics if report.baseline is not None else {}
    if "output_throughput" in base:
        fig.add_hline(y=base["output_throughput"], line={"dash": "dot"}, annotation_text="engine defaults")
    fig.update_xaxes(title_text="largest batch captured as a CUDA graph", type="category")
    fig.update_yaxes(title_text="output throughput (tok/s)")
    note = "Bars are coloured by outcome; error bars are the spread between benchmark repeats."
    kept = (state.get("fixed") or {}).get("cuda_graph_max_bs")
    if kept is not None:
        note += f" Kept: {kept} (a larger size had to beat it by more than the noise)."
    return Plot("plot-cuda-graph", title, _layout(fig, showlegend=False), note)


# ------------------------------------------------------------------------ parameter importance
def _importance_trials(report: StudyReport) -> tuple[list[FrozenTrial], list[str]]:
    """Served search trials and the parameters that every one of them sampled and that varied."""
    trials = [
        t
        for t in report.trials
        if trial_record(t).stage in SEARCH_STAGES
        and t.state == TrialState.COMPLETE
        and trial_record(t).outcome in SERVED
    ]
    if not trials:
        return [], []
    shared = set.intersection(*(set(t.distributions) for t in trials))
    varied = sorted(p for p in shared if len({repr(t.params[p]) for t in trials}) > 1)
    return trials, varied


def importance(report: StudyReport) -> Plot:
    """Which parameters moved the objective (PED-ANOVA: needs no scikit-learn)."""
    title = "Parameter importance"
    trials, params = _importance_trials(report)
    if len(trials) < MIN_IMPORTANCE_TRIALS or len(params) < 2:
        why = f"needs at least {MIN_IMPORTANCE_TRIALS} served search trials and 2 varied parameters"
        return Plot("plot-importance", title, None, f"{why} (have {len(trials)} and {len(params)})")
    scratch = optuna.create_study(direction=StudyDirection[report.direction.upper()])
    scratch.add_trials(trials)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            scores = optuna.importance.get_param_importances(
                scratch, evaluator=optuna.importance.PedAnovaImportanceEvaluator(), params=params
            )
    except (ValueError, RuntimeError, ZeroDivisionError) as err:
        return Plot("plot-importance", title, None, f"could not be computed: {err}")
    names = list(scores)[::-1]  # plotly draws the first bar at the bottom
    fig = go.Figure(go.Bar(x=[scores[n] for n in names], y=names, orientation="h", marker={"color": "#1f77b4"}))
    fig.update_xaxes(title_text=f"importance for {report.objective}")
    note = f"PED-ANOVA over {len(trials)} served search trials; with few trials read it as a hint."
    return Plot("plot-importance", title, _layout(fig, height=max(260, 60 * len(names) + 120)), note)


# --------------------------------------------------------------------------- latency CDFs
def latency_cdf(report: StudyReport) -> Plot:
    """TTFT and end-to-end latency distributions of the winner against the engine defaults."""
    title = "Latency distribution: winner vs engine defaults"
    if not report.cdfs:
        return Plot("plot-latency-cdf", title, None, "neither the winner nor the baseline served the workload")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT", "end-to-end latency"), horizontal_spacing=0.08)
    for key, colour in (("baseline", BASELINE_COLOUR), ("winner", WINNER_COLOUR)):
        cdf = report.cdfs.get(key)
        if cdf is None:
            continue
        label = CDF_NAMES[key] + ("" if cdf.per_request else " (percentiles)")
        style: dict[str, Any] = {"color": colour, "width": 2, "shape": "hv" if cdf.per_request else "linear"}
        mode = "lines" if cdf.per_request else "lines+markers"
        for col, (xs, ys) in enumerate((cdf.ttft, cdf.e2el), start=1):
            fig.add_trace(
                go.Scatter(x=xs, y=ys, mode=mode, name=label, legendgroup=key, showlegend=col == 1, line=style),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="ms")
    fig.update_yaxes(title_text="share of requests", range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(range=[0, 1.02], row=1, col=2)
    coarse = [CDF_NAMES[k] for k, c in report.cdfs.items() if not c.per_request]
    note = ""
    if coarse:
        lines = "that line joins" if len(coarse) == 1 else "those lines join"
        note = (
            f"bench.json holds no per-request latencies (ttfts/latencies) for {' and '.join(coarse)}: "
            f"{lines} the recorded percentiles (p50, p90, p95, p99)."
        )
    # Room above the subplot titles for plotly's toolbar.
    return Plot("plot-latency-cdf", title, _layout(fig, margin={"l": 60, "r": 20, "t": 60, "b": 50}), note)


def twin(report: StudyReport) -> Plot | None:
    """The twin's prediction of each search trial against its measurement (None: none predicted)."""
    fig = twin_points(trial_record(t) for t in report.trials)
    if fig is None:
        return None
    note = (
        "Each point is a trial the twin predicted before its engine started, from the runs measured "
        "before it; on the dotted line the prediction was exact. " + report.twin_line[0].upper() + report.twin_line[1:]
    )
    return Plot("plot-twin", "The twin: predicted against measured", _layout(fig, showlegend=False), note + ".")


def build_plots(report: StudyReport) -> list[Plot]:
    """Every figure of the report, in page order (absent probes left out)."""
    plots = (history, pareto, memory_edge, cuda_graph, importance, latency_cdf, twin)
    return [p for p in (make(report) for make in plots) if p is not None]
