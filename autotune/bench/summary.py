"""Plain rows summarising a run or a capacity search, for a table on the console (``autotune bench``).

The rows are strings only; rendering (rich) stays in the CLI.
"""

from __future__ import annotations

import math
from typing import Any

from autotune.bench.capacity import CapacityResult
from autotune.bench.metrics import slo_violations
from autotune.bench.result import BenchResult

__all__ = ["capacity_rows", "result_rows"]

LATENCIES = (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2EL", "e2el"))


def _num(value: Any, spec: str = ",.1f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return format(value, spec)


def result_rows(result: BenchResult) -> list[tuple[str, str]]:
    """``(label, value)`` rows: counts, throughputs, latency statistics, SLO verdict, client check."""
    m, w = result.metrics, result.workload
    failed = f"{m['failed']} failed"
    if m["failed"]:
        failed += f" ({m.get('failed_engine', m['failed'])} engine, {m.get('failed_client', 0)} client)"
    retried = f", {result.retried_requests} retried" if result.retried_requests else ""
    rows = [
        ("requests", f"{m['completed']} ok, {failed}{retried} ({result.num_sessions} sessions)"),
        ("duration s", _num(m["duration"], ".2f")),
        ("request throughput req/s", _num(m["request_throughput"], ",.2f")),
        ("output throughput tok/s", _num(m["output_throughput"])),
        ("total throughput tok/s", _num(m["total_token_throughput"])),
    ]
    if "request_goodput" in m:
        rows.append(("request goodput req/s", _num(m["request_goodput"], ",.2f")))
    for label, key in LATENCIES:
        stats = [m.get(f"{s}_{key}_ms") for s in ("mean", "p50", "p95", "p99")]
        rows.append((f"{label} ms mean / p50 / p95 / p99", " / ".join(_num(v) for v in stats)))
    if w.slos:
        over = slo_violations(m, w.slos)
        verdict = "met" if not over else "missed: " + ", ".join(f"{k} +{_num(v)}" for k, v in over.items())
        rows.append(("SLOs", verdict))
    rows.append(("prefix cache reset", result.prefix_cache_reset or "not asked"))
    rows.append(("client", f"{result.client_workers} worker(s); " + (result.client.reason or "kept up")))
    rows.extend(("warning", text) for text in result.warnings)
    return rows


def capacity_rows(result: CapacityResult) -> tuple[list[str], list[list[str]]]:
    """Header and one row per run of a capacity search."""
    unit = "req/s" if result.dimension == "request_rate" else "concurrency"
    header = [unit, "held", "p95 TTFT ms", "p95 TPOT ms", "req/s", "output tok/s", "missed"]
    rows = []
    for run in result.runs:
        m = run.metrics
        level = "saturation" if not math.isfinite(run.level) else _num(run.level, ",.2f")
        held = "—" if not math.isfinite(run.level) else ("yes" if run.passed else "no")
        missed = ", ".join(sorted(run.violations)) + (" (client-limited)" if run.client_limited else "")
        rows.append(
            [
                level,
                held,
                _num(m.get("p95_ttft_ms")),
                _num(m.get("p95_tpot_ms")),
                _num(m.get("request_throughput"), ",.2f"),
                _num(m.get("output_throughput")),
                missed,
            ]
        )
    return header, rows
