"""The simulator's validated error, shown next to the modelled numbers of a simulated study.

The simulator holds a validation set of published real measurements and computes, per kind of
number, the largest |error| of its model against them. The tuner never imports the simulator: it
runs it as a command (``python -m autotune_sim error-bands``, the same interpreter the simulated
engine runs under) and reads the bands as data, so the text always matches the live model and
its validation set. When the command fails the text says the band is unavailable.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from typing import Any

__all__ = ["band_phrase", "bands", "metric_band", "modelled_note", "report_sentence"]

# The kind of number each metric of a tuning study is (by the name's part): a study measures
# under its workload's load, so its TPOT, ITL and end-to-end latency are "under load" (not the
# batch-1 decode step the decode rows measure), and so is its throughput.
_METRIC_KINDS = (
    ("ttft", "ttft"),
    ("tpot", "decode-load"),
    ("itl", "decode-load"),
    ("e2el", "decode-load"),
    ("throughput", "throughput-load"),
    ("goodput", "throughput-load"),
)
# What a report of a tuning study shows: served speed, latency under load, first-token latency, KV capacity.
REPORT_KINDS = ("throughput-load", "decode-load", "ttft", "kv")


@functools.cache
def bands() -> dict[str, dict[str, Any]] | None:
    """category -> {label, max_abs_error, rows} as the simulator computes them; None when it cannot say."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "autotune_sim", "error-bands"], capture_output=True, text=True, timeout=60
        )
        data = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def band_phrase(category: str) -> str | None:
    """``KV-cache size ±35 % over 4 published rows``, or ``output throughput under load not
    validated by any published row``; None when the bands are unavailable."""
    band = (bands() or {}).get(category)
    if not band:
        return None
    if band.get("max_abs_error") is None:
        return f"{band['label']} not validated by any published row"
    rows = int(band["rows"])
    return f"{band['label']} ±{100 * float(band['max_abs_error']):.0f} % over {rows} published row{'s' * (rows != 1)}"


def metric_band(metric: str) -> str | None:
    """The band of the kind of number ``metric`` is (None for a metric no category covers)."""
    kind = next((k for part, k in _METRIC_KINDS if part in metric.lower()), None)
    return band_phrase(kind) if kind else None


def modelled_note(metric: str) -> str:
    """``modelled by the simulator; against published measurements: <kind> ±N % over M published
    rows`` (or ``<kind> not validated by any published row``); for a metric no kind covers, the
    bands of every kind a report shows."""
    phrases = [p for p in [metric_band(metric)] if p] or [p for p in map(band_phrase, REPORT_KINDS) if p]
    if not phrases:
        return "modelled by the simulator; its validated error band is unavailable"
    return "modelled by the simulator; against published measurements: " + "; ".join(phrases)


def report_sentence(kinds: tuple[str, ...] = REPORT_KINDS) -> str:
    """One sentence for a report's banner: the band of every kind of number the report shows."""
    phrases = [p for p in (band_phrase(k) for k in kinds) if p]
    if not phrases:
        return "The simulator's validated error band is unavailable."
    return "The simulator against published measurements: " + "; ".join(phrases) + "."
