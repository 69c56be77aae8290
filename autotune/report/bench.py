"""What ``autotune bench`` prints: the result table with its verdict against the workload's
SLOs and error budget, or the capacity search's answer and whether it is only a bound."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from autotune.bench.capacity import CapacityResult, search_capacity
from autotune.bench.loadgen import BenchProgress, run_workload_sync
from autotune.bench.metrics import slo_violations
from autotune.bench.result import BenchResult
from autotune.bench.summary import capacity_rows, result_rows
from autotune.config import Workload
from autotune.errors import ConfigError
from autotune.report.console import console, cut

__all__ = ["bench_verdict", "capacity_line", "measure", "print_capacity", "print_result"]


def api_key(variable: str | None) -> str | None:
    """The server's API key from the environment variable ``--api-key-env`` names.

    Raises:
        ConfigError: The variable is named but not set.
    """
    if variable is None:
        return None
    if variable not in os.environ:
        raise ConfigError(f"--api-key-env {variable}: that environment variable is not set")
    return os.environ[variable]


def write_result(data: dict[str, Any], output: Path) -> Path:
    """The result's JSON (``vllm bench serve``'s keys) written to ``output``."""
    output.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return output


def measure(
    url: str, workload: Workload, *, model: str | None, api_key: str | None, workers: int | None, capacity: bool
) -> tuple[dict[str, Any], Callable[[], None]]:
    """Run the workload (or the capacity search) against ``url`` under a live status line;
    returns (the result's JSON, what prints it)."""
    w = workload
    with console.status(f"{w.name} against {url}") as status:
        if capacity:
            found = search_capacity(
                url,
                w,
                model=model,
                api_key=api_key,
                workers=workers,
                on_run=lambda r: status.update(f"{w.name}: level {r.level:g} {'held' if r.passed else 'missed'}"),
            )
            return found.to_json(), lambda: print_capacity(found, w)

        def show(p: BenchProgress) -> None:
            status.update(f"{w.name} {p.phase}: {p.completed}/{p.total} requests, {p.output_throughput:,.0f} tok/s")

        result = run_workload_sync(url, w, model=model, api_key=api_key, workers=workers, on_progress=show)
        data = result.to_json(detailed=True)
        return data, lambda: print_result(result, w, data.get("error_samples") or {})


def print_result(result: BenchResult, workload: Workload, errors: dict[str, int]) -> None:
    """The run's metrics table, its SLO row judged, and the closing verdict line."""
    verdict = bench_verdict(result.metrics, workload, errors)
    table = Table("metric", "value", title=f"{workload.name}: {result.model}")
    for label, value in result_rows(result):
        table.add_row(label, verdict[0] if label == "SLOs" else value)
    console.print(table)
    console.print(verdict[1], highlight=False)


def print_capacity(found: CapacityResult, workload: Workload) -> None:
    """Every level the capacity search ran, then its answer."""
    header, rows = capacity_rows(found)
    table = Table(*header, title=f"capacity search: {workload.name}")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(capacity_line(found), highlight=False)


def bench_verdict(metrics: dict[str, Any], workload: Workload, errors: dict[str, int]) -> tuple[str, str]:
    """(the SLOs row, the closing line) of a run: failed requests are counted and the error rate
    is judged against ``max_error_rate`` with the latency SLOs — a run most of whose requests
    failed never "met the SLOs"."""
    completed, failed = int(metrics.get("completed") or 0), int(metrics.get("failed") or 0)
    total = completed + failed
    error_rate = float(metrics.get("error_rate") or 0.0)
    over = slo_violations(metrics, workload.slos) if workload.slos else {}
    missed = [f"{k} +{v:,.1f}" for k, v in over.items()]
    if error_rate > workload.max_error_rate:
        missed.insert(0, f"error rate {error_rate:.1%} > max_error_rate {workload.max_error_rate:.1%}")
    if completed == 0 and total:
        missed.insert(0, "no request succeeded")
    row = "met" if not missed else "missed: " + ", ".join(missed)
    if not workload.slos and not missed:
        row = f"error rate {error_rate:.1%} within max_error_rate {workload.max_error_rate:.1%} (no latency SLOs)"
    requests = f"{completed} of {total} requests succeeded, {failed} failed"
    if errors:
        top, count = max(errors.items(), key=lambda kv: kv[1])
        requests += f" (most often: {cut(str(top), 120)} ×{count})"
    verdict = "workload met" if not missed else "workload NOT met"
    return row, f"{verdict}: {requests}; error rate {error_rate:.1%} (max_error_rate {workload.max_error_rate:.1%})"


def capacity_line(found: Any) -> str:
    """The capacity search's answer, saying when it is only a bound (the search ran out of runs,
    or its highest level still held)."""
    unit = "req/s" if found.dimension == "request_rate" else "concurrent requests"
    value, upper, reason = found.value, found.upper, found.stop_reason
    runs = len(found.runs)
    if reason == "below_low" or not value:
        return f"no load met the SLOs: even the lowest level tried failed ({reason}, {runs} runs)"
    head = f"highest load meeting the SLOs: {value:,.2f} {unit} ({reason})"
    if reason == "at_high":
        return f"{head} — a lower bound: the search's highest level (capacity.high) held; raise it to look further"
    if reason == "max_runs":
        above = f"; {upper:,.2f} {unit} failed" if upper is not None else "; no level that fails was found"
        return (
            f"{head} — a lower bound: the search stopped at its {runs}-run limit (capacity.max_runs) "
            f"before converging{above}"
        )
    return head + (f"; {upper:,.2f} {unit} failed" if upper is not None else "")
