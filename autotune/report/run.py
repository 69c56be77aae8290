"""A run on the terminal: the live progress display while a study runs, and the closing lines
after it (the time budget, the winner and its gain over the defaults, the launch script)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import optuna
from optuna.trial import FrozenTrial

from autotune.errors import StudyError
from autotune.report.console import console
from autotune.report.launch import export_trial
from autotune.report.live import LiveProgress, shown_metrics
from autotune.report.status import (
    budget_line,
    export_note,
    memory_edge_line,
    opening_line,
    print_best,
    resume_difference,
)
from autotune.report.summary import no_winner_text
from autotune.search.job import TuneJob
from autotune.search.probe import MemoryEdge
from autotune.search.progress import Progress
from autotune.search.storage import load_study

__all__ = ["print_closing", "print_memory_edge", "run_live"]

T = TypeVar("T")


def run_live(
    job: TuneJob, intro: list[str], body: Callable[[Progress], T], *, plan: str | None = None
) -> tuple[optuna.Study, T, float]:
    """(the study after ``body`` ran under the live display, what ``body`` returned, seconds);
    ``plan`` says what the run will launch when it is not the tuning method.

    Raises:
        StudyError: A refused resume, naming which of engine, space and workload changed, and how.
    """
    started = time.monotonic()
    try:
        live = LiveProgress(
            console,
            simulated=job.engine.simulated,
            intro=intro,
            opening=opening_line(job, plan),
            shown=shown_metrics(job.workload),
        )
        with live as progress:
            result = body(progress)
    except StudyError as err:
        changed = resume_difference(job)
        raise (StudyError(changed) if changed else err) from None
    return load_study(job.study.name, job.storage_url), result, time.monotonic() - started


def print_closing(job: TuneJob, study: optuna.Study, best: FrozenTrial | None, elapsed: float) -> int:
    """Say how the run ended and return the exit code: the winner and its exported launch
    script (0), or what the launches came to (1); and what a spent time budget cut short."""
    if stopped := budget_line(job, study, elapsed):
        console.print(stopped, highlight=False)
    if job.study.method == "memory":
        return 0
    if best is None:
        console.print(
            f"{no_winner_text(study.get_trials(deepcopy=False))}; "
            f"see `autotune status {job.study.name}` for what happened to each trial and why",
            highlight=False,
        )
        return 1
    print_best(study, best)
    script = export_trial(study, best, "bash", None, job.dir)
    console.print(f"launch script: {script}{export_note(study, best)}", highlight=False)
    return 0


def print_memory_edge(job: TuneJob, study: optuna.Study, found: MemoryEdge, elapsed: float) -> int:
    """``autotune probe-memory``'s closing lines; the exit code is 1 when no edge was kept."""
    if stopped := budget_line(job, study, elapsed):
        console.print(stopped, highlight=False)
    if found.state.skipped:
        console.print(f"memory edge: skipped — {found.state.skipped}")
        return 1
    console.print(memory_edge_line(found.state, found.launches), highlight=False)
    console.print("probes: " + ", ".join(f"{k} {v}" for k, v in sorted((found.state.results or {}).items())))
    return 0 if found.state.edge is not None else 1
