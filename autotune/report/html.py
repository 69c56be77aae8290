"""The study report as one self-contained HTML page (plotly.js inlined, so it opens offline),
written next to its Markdown summary by :func:`write_report`."""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import optuna
import pandas as pd

from autotune import __version__
from autotune.engines.base import flags_text
from autotune.errors import ConfigError
from autotune.report.markdown import render_markdown
from autotune.report.plots import Plot, build_plots
from autotune.report.simband import report_sentence
from autotune.report.summary import SPREAD_NOTE, StudyReport, format_number, outcome_text, summarize
from autotune.search.record import trial_record

__all__ = ["FACT_COLUMNS", "render_html", "write_report"]

HTML_NAME, MD_NAME = "report.html", "report.md"
# Engine facts worth a column, in the order a person reads them; absent ones are left out.
FACT_COLUMNS = (
    ("kv_tokens", "KV tokens"),
    ("max_concurrency", "max concurrency"),
    ("preemptions", "preemptions"),
    ("retractions", "retractions"),
    ("kv_usage_peak", "KV usage peak"),
    ("token_usage_peak", "token usage peak"),
    ("prefix_cache_hit_rate", "prefix-cache hit rate"),
    ("cuda_graph_false_share", "steps without CUDA graph"),
)
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d1d1f; background: #fafafa; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 24px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 32px 0 8px; border-bottom: 1px solid #ddd; }
.meta { color: #555; margin-bottom: 16px; }
.banner { background: #fff4ce; border: 1px solid #e6a700; padding: 10px 14px; border-radius: 6px; font-weight: 600; }
.headline { font-size: 16px; background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 12px 16px; }
table { border-collapse: collapse; background: #fff; margin: 6px 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.good { color: #1a7f37; font-weight: 600; } .bad { color: #c62828; font-weight: 600; }
tr.changed td { background: #eef6ff; } code { font-size: 12px; }
.reason { font-family: ui-monospace, monospace; font-size: 12px; max-width: 520px; word-break: break-word; }
.plot { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 6px; margin: 8px 0; }
.note { color: #555; font-size: 13px; margin: 4px 0; }
"""


# --------------------------------------------------------------------------------- building blocks
def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], row_classes: Sequence[str] = ()) -> str:
    """An HTML table; cells are already-escaped HTML, numbers right-aligned by the caller."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for i, cells in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if i < len(row_classes) and row_classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _td(text: Any, cls: str = "") -> str:
    return f'<td class="{cls}">{_e(text)}</td>' if cls else f"<td>{_e(text)}</td>"


def _flags_text(flags: dict[str, Any]) -> str:
    return flags_text(flags) or "(engine defaults)"


# ------------------------------------------------------------------------------------- sections
def _header(report: StudyReport) -> str:
    meta = (
        f"{_e(report.engine or 'engine?')} · model <code>{_e(report.model)}</code> · workload {_e(report.workload)}"
        f" · {_e(report.direction)} <code>{_e(report.objective)}</code> · {_e(report.trials_text)}"
        f" · generated {_e(report.generated)} by autotune {_e(__version__)}"
    )
    banner = (
        '<p class="banner" id="simulated-banner">Simulated engine: numbers are modelled by autotune\'s GPU simulator, '
        f"not measured on hardware. {_e(report_sentence())}</p>"
        if report.simulated
        else ""
    )
    return f'<h1>autotune report: {_e(report.name)}</h1><p class="meta">{meta}</p>{banner}'


def _headline(report: StudyReport) -> str:
    stopped = f'<p class="headline">Stopped early: {_e(report.stopped_line)}.</p>' if report.stopped_line else ""
    if report.search_stall:
        stopped += f'<p class="headline">Search ended early: {_e(report.search_stall)}.</p>'
    twin = f"<p>{_e(report.twin_line[0].upper() + report.twin_line[1:])}.</p>" if report.twin_line else ""
    return stopped + _winner_line(report) + f"<p>Decisions allowed for the {_e(report.noise_line)}.</p>" + twin


def _winner_line(report: StudyReport) -> str:
    if report.winner is None:
        text = report.no_winner_text
        return f'<p class="headline">{_e(text[0].upper() + text[1:])}. The failures below say what went wrong.</p>'
    w = report.winner
    gain = report.objective_gain
    if report.verdict_line:  # measured side by side with the defaults: the gain the study stands by
        cls = _change_class(True if report.beats_defaults else None)
        change = f' — <span class="{cls}">{_e(report.verdict_line)}</span>'
    elif gain is not None and gain.change is not None:
        change = (
            f' — <span class="{_change_class(gain.improved)}">{gain.change:+.1%}</span> against the engine '
            "defaults' one run (not measured side by side)"
        )
    else:
        change = " (no served baseline to compare with)"
    value = _e(format_number(report.winner_value))
    return (
        f'<p class="headline">Winner: trial #{w.number} ({_e(trial_record(w).stage)}) — '
        f"{_e(report.objective)} <b>{value}</b> ({_e(report.winner_runs_text)}){change}.</p>"
    )


def _change_class(improved: bool | None) -> str:
    return {True: "good", False: "bad", None: ""}[improved]


def _gain_section(report: StudyReport) -> str:
    if not report.gains:
        return ""
    rows = []
    for g in report.gains:
        change = "–" if g.change is None else f"{g.change:+.1%}"
        cls = f"num {_change_class(g.improved)}".strip()
        spread = "–" if g.spread is None else f"{g.spread:.1%}"
        rows.append(
            [
                _td(f"{g.label} ({g.unit})" if g.unit else g.label),
                _td(format_number(g.baseline), "num"),
                _td(format_number(g.winner), "num"),
                _td(spread, "num"),
                _td(change, cls),
            ]
        )
    winner_head = f"winner (median of {report.winner_runs} runs)" if report.winner_runs > 1 else "winner"
    headers = ["metric", "engine defaults", winner_head, "spread", "change"]
    table = _table(headers, rows)
    note = f'<p class="note">{_e(SPREAD_NOTE)}</p>'
    return f'<h2>Gain over the engine defaults</h2><div id="gain-table">{table}</div>{note}'


def _flag_section(report: StudyReport) -> str:
    if not report.flags:
        return ""
    rows = [[_td(r.flag), _td(r.baseline), _td(r.winner)] for r in report.flags]
    classes = ["changed" if r.changed else "" for r in report.flags]
    table = _table(["flag", "engine defaults (baseline)", "winner"], rows, classes)
    hint = f'<p class="note">Launch script: <code>autotune export {_e(report.name)}</code>.</p>'
    return f'<h2>Flags</h2><div id="flag-table">{table}</div>{hint}'


def _plot_section(plots: Sequence[Plot]) -> str:
    parts, js_included = [], False
    for p in plots:
        parts.append(f'<h2 id="{_e(p.id)}-section">{_e(p.title)}</h2>')
        if p.figure is None:
            parts.append(f'<p class="note">Not shown: {_e(p.note)}.</p>')
            continue
        # plotly.js (about 4 MB) goes into the page once, with the first figure.
        div = p.figure.to_html(full_html=False, include_plotlyjs=not js_included, div_id=p.id, config=PLOTLY_CONFIG)
        js_included = True
        parts.append(f'<div class="plot">{div}</div>')
        if p.note:
            parts.append(f'<p class="note">{_e(p.note)}</p>')
    return "".join(parts)


def _log_link(log_path: str, out_dir: Path) -> str:
    """A link relative to the report, so the results folder can be moved or copied whole."""
    if not log_path:
        return "<td></td>"
    path = Path(log_path)
    href = os.path.relpath(path, out_dir.resolve()) if path.is_absolute() else log_path
    return f'<td><a href="{_e(href)}">engine.log</a></td>' if path.name else "<td></td>"


def _failure_section(report: StudyReport, out_dir: Path) -> str:
    if not report.failures:
        none = "Every trial served the workload within its SLOs."
        return f'<h2>Failures</h2><p class="note" id="failure-table">{none}</p>'
    rows = [
        [
            _td(f.trial, "num"),
            _td(f.stage),
            _td(f.outcome),
            f"<td><code>{_e(_flags_text(f.flags))}</code></td>",
            _td(f.reason, "reason"),
            _log_link(f.log_path, out_dir),
        ]
        for f in report.failures
    ]
    counts = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items()))
    table = _table(["trial", "stage", "outcome", "flags", "what explains it", "log"], rows)
    return f'<h2>Failures</h2><p class="note">Outcomes: {_e(counts)}.</p><div id="failure-table">{table}</div>'


def _fact_cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return _td("", "num")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _td(value, "num")
    # Counts come back as floats from a column with gaps; show them as counts again.
    return _td(f"{int(value):,}" if float(value).is_integer() else format_number(float(value)), "num")


def _facts_section(report: StudyReport) -> str:
    frame = report.frame
    present = [(k, label) for k, label in FACT_COLUMNS if f"fact.{k}" in frame and frame[f"fact.{k}"].notna().any()]
    if frame.empty or not present:
        return ""
    headers = ["trial", "stage", "outcome", "output tok/s", "p95 TTFT ms"] + [label for _, label in present]
    rows = []
    for r in frame.to_dict("records"):
        cells = [_td(r["trial"], "num"), _td(r["stage"]), _td(outcome_text(r["outcome"], r.get("early_stop")))]
        cells += [_fact_cell(r.get("output_throughput")), _fact_cell(r.get("p95_ttft_ms"))]
        cells += [_fact_cell(r.get(f"fact.{k}")) for k, _ in present]
        rows.append(cells)
    return f'<h2>Engine facts per trial</h2><div id="facts-table">{_table(headers, rows)}</div>'


def _config_section(report: StudyReport) -> str:
    text = json.dumps(report.config, indent=2, sort_keys=True, default=str)
    summary = "<summary>engine, search space, workload, study</summary>"
    return f"<h2>Study configuration</h2><details>{summary}<pre>{_e(text)}</pre></details>"


# ------------------------------------------------------------------------------------- the page
def render_html(report: StudyReport, plots: Sequence[Plot], out_dir: Path) -> str:
    """The whole page. ``out_dir`` is where it will live (log links are relative to it)."""
    body = "".join(
        [
            _header(report),
            _headline(report),
            _gain_section(report),
            _flag_section(report),
            _plot_section(plots),
            _failure_section(report, out_dir),
            _facts_section(report),
            _config_section(report),
        ]
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>autotune report: {_e(report.name)}</title><style>{CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )


def write_report(study: optuna.Study, out_dir: Path) -> tuple[Path, Path]:
    """Write ``report.html`` and ``report.md`` for a study into ``out_dir``.

    Args:
        study: The study, as loaded from its storage (nothing is run or changed).
        out_dir: The study's results folder (``results/<study>/``); created if missing.

    Returns:
        (HTML path, Markdown path).

    Raises:
        ConfigError: ``out_dir`` cannot be written.
    """
    report = summarize(study)
    html_path, md_path = out_dir / HTML_NAME, out_dir / MD_NAME
    page = render_html(report, build_plots(report), out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        html_path.write_text(page, encoding="utf-8")
        md_path.write_text(render_markdown(report), encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot write the report to {out_dir}: {err.strerror or err}; check --results") from None
    return html_path, md_path
