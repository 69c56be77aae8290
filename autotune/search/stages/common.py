"""What every stage shares: the knob names, the 0.02 step, a stage skipped with its reason,
the runs a resumed stage reads back instead of repeating them, and what a stage asks of the
orchestrator that runs it (:class:`Dispatch`: run one body on one worker, fill quotas of trials
on every slot)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from optuna.trial import FrozenTrial

from autotune.search.record import StageState, TrialRecord, trial_record, trial_records
from autotune.search.runner import StudyRun
from autotune.search.storage import primary_value
from autotune.search.trial import graph_facts

STEP = 0.02
MEMORY, GRAPH, CONTEXT = "memory_fraction", "cuda_graph_max_bs", "context_len"

T = TypeVar("T")


@dataclass(frozen=True)
class Task:
    """Trials of one kind to fill up to ``quota`` (across every slot of every worker)."""

    key: str
    match: Callable[[FrozenTrial], bool]
    quota: int
    start: Callable[[bool], Any]  # runs one trial; the flag says it is the first of its kind
    stalled: Callable[[], str | None] = lambda: None  # why the task may end below its quota


class Dispatch(Protocol):
    """Where the stages run: the orchestrator's side (``autotune.search.parallel``)."""

    @property
    def leads(self) -> bool:
        """Whether this worker ran the sequential stages (only it seeds the search)."""

    def sequential(self, body: Callable[[], T]) -> T:
        """Run ``body`` on one worker of the study, the others waiting for its result."""

    def fill(self, tasks: list[Task]) -> None:
        """Run the tasks' trials on every slot until each quota is met or its task stalled."""


def skip_stage(run: StudyRun, stage: str, why: str) -> None:
    """Record ``stage`` as done-by-skipping (once) and say why."""
    if run.stage_state(stage) is None:
        run.progress.message(f"{stage}: skipped — {why}")
        run.set_stage_state(stage, StageState(done=True, skipped=why))


def existing_run(run: StudyRun, stage: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
    """A finished trial of this stage with these params (so a resume does not repeat it)."""
    for t in run.finished(stage):
        r = trial_record(t)
        if r.params == dict(params):
            # The graph facts too: a resumed graph stage reads its coverage evidence from them.
            return {"value": primary_value(t), "outcome": r.outcome, "graphs": graph_facts(r.facts)}
    return None


def served_record(run: StudyRun, stage: str) -> TrialRecord | None:
    """The stage's first served run of the study's own workload."""
    for r in trial_records(run.finished(stage)):
        if r.served_its_workload:
            return r
    return None


def knob_text(knobs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items())


def on_cpu(run: StudyRun) -> bool:
    """Whether the engine keeps its KV cache in host memory (the CPU build)."""
    return run.adapter.runs_on_cpu() or any(r.facts.get("kv_device") == "cpu" for r in trial_records(run.trials()))
