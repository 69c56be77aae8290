"""Only the memory edge: the highest memory fraction that survives the workload's peak load,
probed as the staged method's memory stage does, without the other stages."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from autotune.search.job import TuneJob
from autotune.search.progress import Progress
from autotune.search.record import StageState, stage_state, trial_records
from autotune.search.stage import Stage
from autotune.search.storage import load_study
from autotune.search.tune import run_study

__all__ = ["MemoryEdge", "memory_job", "probe_memory"]


@dataclass(frozen=True)
class MemoryEdge:
    """What the probes found: the stage's state (edge, probes, what bounded them) and the
    memory-edge launches by outcome."""

    state: StageState
    launches: dict[str, int]


def memory_job(job: TuneJob, probes: int) -> TuneJob:
    """``job`` as a memory-edge run: at most ``probes`` launches, no search, no validation."""
    study = job.study.model_copy(update={"method": "memory", "trials": probes, "finalists": 0, "validation_runs": 0})
    return dataclasses.replace(job, study=study)


def probe_memory(job: TuneJob, progress: Progress | None = None) -> MemoryEdge:
    """Run (or resume) the memory stage of ``job`` (see :func:`memory_job`) and read its result."""
    run_study(job, progress)
    study = load_study(job.study.name, job.storage_url)
    trials = study.get_trials(deepcopy=False)
    launches = Counter(
        r.outcome or t.state.name.lower()
        for t, r in zip(trials, trial_records(trials), strict=True)
        if r.stage == Stage.MEMORY_EDGE and t.state.is_finished()
    )
    return MemoryEdge(stage_state(study, Stage.MEMORY_EDGE) or StageState(), dict(launches))
