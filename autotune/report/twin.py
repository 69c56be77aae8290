"""What the twin predicted for each trial, against what the trial measured (``search/twin.py``).

Shown by ``status`` (a cell per trial and one line for the study), the live run (after each
predicted trial) and the report (a line and a predicted-against-measured plot), so a user sees
how far the twin can be trusted on their own box.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go

from autotune.search.record import TrialRecord
from autotune.search.twin import TWIN_METRICS, median_error

__all__ = ["prediction_text", "twin_cell", "twin_line", "twin_points"]

_NAMES = {"output_throughput": "output tok/s", "mean_ttft_ms": "mean TTFT", "mean_tpot_ms": "mean TPOT"}


def prediction_text(twin: Mapping[str, Any] | None) -> str:
    """``twin 1,234.5 tok/s (+3.1 % off the measured)``, ``twin 1,234.5 tok/s (not compared: …)``,
    ``twin: skipped (why)``, or "" when the trial was not predicted."""
    if not twin:
        return ""
    if "skipped" in twin:
        return f"twin: skipped ({twin['skipped']})"
    predicted = twin.get("predicted") or {}
    if predicted.get("failure"):
        head = f"twin predicted {predicted['failure']}"
    else:
        head = f"twin {float(predicted.get('output_throughput', 0.0)):,.1f} tok/s"
    error = (twin.get("error") or {}).get("output_throughput")
    if error is None:
        return f"{head} (not compared: the run served nothing)"
    if cut := twin.get("predicted_cut"):
        head += f"; {float(cut['output_throughput']):,.1f} for the {twin['cut_at']} requests served before the cut"
    return f"{head} ({100 * float(error):+.1f} % off the measured)"


def twin_cell(r: TrialRecord) -> str:
    """A status row's twin part: `` · twin …`` or ""."""
    text = prediction_text(r.twin)
    return f" · {text}" if text else ""


def twin_line(records: Iterable[TrialRecord]) -> str | None:
    """The study's twin in one line: its median error per predicted number over the trials it
    predicted, and the step model its last prediction used; None when nothing was predicted."""
    records = list(records)
    predicted = [r for r in records if r.twin and "predicted" in r.twin]
    if not predicted:
        return None
    parts = []
    for metric in TWIN_METRICS:
        if (median := median_error(records, metric)) is not None:
            parts.append(f"{_NAMES[metric]} {100 * median[0]:.1f} %")
    compared = median_error(records)
    fit = (predicted[-1].twin or {})["fit"]
    step = (
        f"step {1000 * float(fit.get('step_s', 0)):.2f} ms + {1000 * float(fit.get('seq_s', 0)):.3f} ms per running "
        f"sequence + {1e6 * float(fit.get('token_s', 0)):.1f} µs per prompt token"
    )
    head = f"twin (the simulator's step model fitted on this study's runs): {len(predicted)} trial(s) predicted"
    if compared is None:
        return f"{head}, none yet measured in full; {step}"
    return f"{head}, median |error| over the {compared[1]} measured: {', '.join(parts)}; last fit {step}"


def _compared(twin: Mapping[str, Any]) -> Mapping[str, Any]:
    """The prediction a trial's measurement was compared with (a cut run's: for what it served)."""
    return twin.get("predicted_cut") or twin["predicted"]


def twin_points(records: Iterable[TrialRecord]) -> go.Figure | None:
    """Predicted against measured output throughput, one point per compared trial, with the
    line where they are equal (None before any comparison)."""
    points = [
        (r.number, float(_compared(r.twin)["output_throughput"]), float(r.twin["measured"]["output_throughput"]))
        for r in records
        if r.twin and "output_throughput" in (r.twin.get("error") or {})
    ]
    if not points:
        return None
    top = 1.05 * max(max(p, m) for _, p, m in points)
    fig = go.Figure(
        [
            go.Scatter(x=[0, top], y=[0, top], mode="lines", line={"dash": "dot", "color": "#999"}, name="equal"),
            go.Scatter(
                x=[m for _, _, m in points],
                y=[p for _, p, _ in points],
                mode="markers+text",
                text=[str(n) for n, _, _ in points],
                textposition="top center",
                name="trial",
                hovertemplate="trial %{text}<br>measured %{x:,.1f} tok/s<br>predicted %{y:,.1f} tok/s<extra></extra>",
            ),
        ]
    )
    fig.update_xaxes(title_text="measured output throughput (tok/s)", range=[0, top])
    fig.update_yaxes(title_text="twin's prediction (tok/s)", range=[0, top])
    return fig
