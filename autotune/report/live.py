"""Live progress of a tuning run: a rich status panel on a terminal, plain log lines elsewhere
(nohup, CI), so an overnight log file stays readable."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from autotune.config import Workload
from autotune.report.console import cut
from autotune.report.simband import modelled_note
from autotune.report.status import metric_unit
from autotune.report.summary import format_value
from autotune.report.twin import prediction_text
from autotune.search.stage import Stage

__all__ = ["LiveProgress", "shown_metrics"]

_NAMES = {"request_goodput": "goodput", "request_throughput": "requests", "total_token_throughput": "total"}


def shown_metrics(workload: Workload) -> tuple[str, ...]:
    """What a trial's line shows after its tokens/s: the objective when it is another metric, then
    the metric of each SLO (p95 TTFT when nothing else is judged)."""
    keys = [t.metric for t in workload.objective.terms if t.metric != "output_throughput"]
    keys += [k for k in sorted(workload.slos) if k not in keys]
    return tuple(keys or ["p95_ttft_ms"])


def _metric_text(key: str, value: float) -> str:
    """``p90_ttft_ms`` 116.2 → "p90 TTFT 116 ms"; ``request_goodput`` 23.4 → "goodput 23.4 req/s"."""
    unit = metric_unit(key)
    if unit == "ms":
        stat, name = key.removesuffix("_ms").split("_", 1)
        return f"{stat} {name.upper()} {value:,.0f} ms"
    return f"{_NAMES.get(key, key)} {value:,.1f}" + (f" {unit}" if unit else "")


def _fmt_params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={format_value(v)}" for k, v in params.items()) or "(engine defaults)"


class LiveProgress:
    """Implements autotune.search.progress.Progress for the CLI."""

    def __init__(
        self,
        console: Console,
        *,
        simulated: bool = False,
        intro: list[str] | None = None,
        opening: str | None = None,
        shown: tuple[str, ...] = ("p95_ttft_ms",),
    ):
        """``intro``: lines printed before anything else the run prints (e.g. "simulated engine:
        numbers are modelled"); ``opening``: the study line, counted by the caller from the
        storage (without it the line says only what was asked); ``shown``: the metrics each
        trial's line gives after its tokens/s (:func:`shown_metrics`)."""
        self.console = console
        self.interactive = console.is_terminal
        self.simulated = simulated
        # Read once: the band comes from the simulator as a command, and the panel redraws 4× a second.
        self.modelled = modelled_note("output_throughput") if simulated else ""
        self.intro = list(intro or [])
        self.opening = opening
        self.shown = shown
        self.study, self.total, self.done = "", 0, 0
        self.trial: dict[str, Any] = {}
        self.phase_name, self.phase_t0 = "", time.monotonic()
        self.bench = (0, 0, 0.0)
        self.best: dict[str, Any] | None = None
        self.outcomes: Counter[str] = Counter()
        self.twin_errors: list[float] = []  # the twin's |error| on output tok/s, per measured trial
        self.live: Live | None = None

    # -- context: the live panel exists only on a terminal
    def __enter__(self) -> LiveProgress:
        if self.interactive:
            self.live = Live(self._panel(), console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._panel())

    def _panel(self) -> Table:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan")
        table.add_column()
        sim = f" [yellow](simulated engine: {escape(self.modelled)})[/]" if self.simulated else ""
        table.add_row("study", f"{self.study}{sim}")
        if self.trial:
            table.add_row("trial", f"#{self.trial['number']} ({self.trial['stage']}) — tuning {self.done}/{self.total}")
            table.add_row("params", _fmt_params(self.trial["params"]))
        elapsed = time.monotonic() - self.phase_t0
        table.add_row("phase", f"{self.phase_name} {elapsed:5.0f}s")
        done, total, tps = self.bench
        if total:
            table.add_row("requests", f"{done}/{total}  {tps:,.0f} output tok/s")
        if self.best:
            table.add_row("best", f"trial #{self.best['number']}: {self.best['value']:,.1f}")
        if self.outcomes:
            table.add_row("outcomes", ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())))
        return table

    def _line(self, text: str) -> None:
        # The intro comes first, but only once the run has passed its checks: a refused run
        # prints its one error line and nothing else.
        pending, self.intro = self.intro, []
        for line in pending:
            self._line(line)
        # Engine log lines and flag values may hold [brackets]: print them literally, never as markup.
        text = escape(text)
        if self.live is not None:
            self.live.console.print(text, highlight=False)
        else:
            self.console.print(text, highlight=False, soft_wrap=True)

    # -- Progress protocol
    def study_started(self, study: str, total: int, done: int) -> None:
        # ``done`` counts the plain-search stage only (a staged study has none): the opening
        # line comes from the caller, who counted the stored trials of every stage.
        self.study, self.total, self.done = study, total, done
        self._line(self.opening or f"study {study}: up to {total} tuning trials")
        self._refresh()

    def trial_started(self, number: int, stage: str, params: dict[str, Any]) -> None:
        self.trial = {"number": number, "stage": stage, "params": params}
        self.bench = (0, 0, 0.0)
        self._line(f"trial {number} ({stage}) {_fmt_params(params)}")
        self._refresh()

    def phase(self, name: str) -> None:
        self.phase_name, self.phase_t0 = name, time.monotonic()
        if not self.interactive:
            self._line(f"  {name}")
        self._refresh()

    def bench_progress(self, completed: int, total: int, output_tps: float) -> None:
        self.bench = (completed, total, output_tps)
        self._refresh()

    def trial_finished(self, summary: dict[str, Any]) -> None:
        self.outcomes[summary["outcome"]] += 1
        if summary["stage"] not in (Stage.BASELINE, Stage.VALIDATION, Stage.CONTEXT):
            self.done += 1
        self.best = summary.get("best")
        metrics = summary.get("metrics") or {}
        shown = [_metric_text(k, float(metrics[k])) for k in self.shown if metrics.get(k) is not None]
        detail = (
            ", ".join([f"{metrics.get('output_throughput', 0):,.1f} tok/s", *shown])
            if metrics
            else cut(summary.get("reason", ""), 160)
        )
        pool = summary.get("pool") or {}
        if summary["stage"] == Stage.MEMORY_EDGE and "kv_tokens" in pool:  # a probe: the pool is the point
            detail += f", KV {pool['kv_tokens']:,} tokens, {pool.get('preemptions', '?')} preemptions (peak shape)"
        outcome = summary["outcome"]
        if stop := summary.get("early_stop"):  # the run ended early: say why, with its evidence
            # The figures above are the partial run's, whole; the evidence judges its steady state.
            outcome = f"{outcome}, stopped early ({stop['reason']})"
            detail = f"partial run {detail}; at {stop['at_requests']} requests: {stop['evidence']}"
        t = summary.get("timings", {})
        self._line(
            f"trial {summary['number']} → {outcome}: {detail} "
            f"(start {t.get('startup_s', 0):.0f}s, bench {t.get('bench_s', 0):.0f}s, total {t.get('total_s', 0):.0f}s)"
        )
        if twin := summary.get("twin"):
            self._line(f"  {self._twin_text(twin)}")
        self._refresh()

    def _twin_text(self, twin: dict[str, Any]) -> str:
        """The twin's prediction for the trial just ended, and its running median error."""
        text = prediction_text(twin)
        if (error := (twin.get("error") or {}).get("output_throughput")) is not None:
            self.twin_errors.append(abs(float(error)))
            median = statistics.median(self.twin_errors)
            text += f"; median |error| {100 * median:.1f} % over {len(self.twin_errors)} trial(s)"
        return text

    def message(self, text: str) -> None:
        self._line(text)
