"""``autotune recheck``: a tuned launch (a study's trial, or an exported script) on another
engine release.

First the launch is checked against the new release without starting it (``engines/drift.py``:
flags renamed, deprecated or removed, variables no longer read) and translated. Then the
translated flags and the new release's defaults run on fresh engines, round by round as
validation runs them, in a study of their own (``<study>-trial<N>-recheck-<release>``, or
``<script>-recheck-<release>``; resumable like any study), and the paired verdict says whether
the tuned flags still beat the new defaults beyond the measured noise.

Both sides keep what every trial of the tuned study had: its fixed flags (``engine.fixed_flags``
and the space's ``fixed``, translated too) and its workload, SLOs and objective. A script carries
no study: its workload and the flags both sides keep are given with it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.config import EngineSettings, SearchSpace, StudySettings, Workload, as_given
from autotune.engines import get_adapter
from autotune.engines.base import EngineAdapter
from autotune.engines.drift import FlagReport, launch_report
from autotune.errors import ConfigError
from autotune.search.job import TuneJob
from autotune.search.parallel import orchestrate
from autotune.search.progress import Progress
from autotune.search.record import TrialRecord, study_config, trial_record
from autotune.search.stages.recheck import recheck_rounds
from autotune.search.tune import check_job, study_session

__all__ = ["Recheck", "TunedLaunch", "from_study", "plan_recheck", "run_recheck"]


@dataclass(frozen=True)
class TunedLaunch:
    """A tuned launch to recheck: from a study's trial, or from a script ``autotune export`` wrote.

    Attributes:
        origin: The tuned study's name, or the script's (the names of the studies that follow).
        trial: The study's trial (None for a script).
        flags: Every flag the launch sets (canonical), the fixed ones included.
        env: The variables it was deployed with.
        fixed: The knobs both sides keep (the study's fixed flags, or ``--fixed`` for a script).
        engine: The engine settings as given (kind, model; the new release's Python replaces its own).
        workload: What the rounds measure.
        space: The search space a re-tune starts from.
        study: Study settings as given (the tuned study's, or none).
    """

    origin: str
    trial: int | None
    flags: dict[str, Any]
    env: dict[str, str]
    fixed: dict[str, Any]
    engine: dict[str, Any]
    workload: Workload
    space: str
    study: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.origin if self.trial is None else f"{self.origin}-trial{self.trial}"

    @property
    def title(self) -> str:
        return f"script {self.origin}" if self.trial is None else f"study {self.origin}, trial {self.trial}"


@dataclass(frozen=True)
class Recheck:
    """What a recheck runs: its own study's job, the flag report, and the tuned flags (beyond the
    fixed ones both sides get) translated to the new release."""

    launch: TunedLaunch
    job: TuneJob
    report: FlagReport
    tuned: dict[str, Any]
    adapter: EngineAdapter
    release: str  # the new release as a study name spells it


def from_study(source: optuna.Study, trial: FrozenTrial) -> TunedLaunch:
    """The launch of ``trial``, with what every trial of ``source`` had.

    Raises:
        ConfigError: The study holds no tuning job, or the trial never launched.
    """
    config = study_config(source)
    if not config:
        raise ConfigError(f"study {source.study_name!r} holds no autotune job; recheck a study `autotune tune` made")
    record = trial_record(trial)
    if not record.argv:
        raise ConfigError(f"trial {trial.number} has no recorded launch (outcome {record.outcome}); pass --trial N")
    engine = as_given(EngineSettings, config["engine"])
    space = SearchSpace.model_validate(as_given(SearchSpace, config["space"]))
    return TunedLaunch(
        origin=source.study_name,
        trial=trial.number,
        flags=dict(record.flags),
        env=_deployed_env(record),
        fixed={**engine.get("fixed_flags", {}), **space.fixed},
        engine=engine,
        workload=Workload.model_validate(as_given(Workload, config["workload"])),
        space=space.name or "vllm-default",
        study=as_given(StudySettings, config["study"]),
    )


def plan_recheck(
    launch: TunedLaunch, engine: Mapping[str, Any], *, rounds: int, results: Path, storage: str | None
) -> Recheck:
    """The recheck of ``launch`` on the engine ``engine`` overrides name (the new release's
    Python or command, and environment); nothing is started but the new engine's ``--help``."""
    settings = EngineSettings.model_validate({**launch.engine, **engine, "fixed_flags": {}})
    adapter = get_adapter(settings)
    deployed = {k: v for k, v in launch.env.items() if adapter.launch_env.get(k) != v}
    report = launch_report(adapter, launch.flags, deployed)
    # What every trial had: both sides keep it, in the new release's spelling.
    fixed = launch_report(adapter, adapter.to_flags(launch.fixed), {}).flags
    tuned = {flag: value for flag, value in report.flags.items() if flag not in fixed or fixed[flag] != value}
    release = _release_name(report.version)
    job = TuneJob(
        engine=settings.model_copy(update={"fixed_flags": fixed, "env": {**report.env, **settings.env}}),
        space=SearchSpace(name=f"recheck of {launch.name}", engine=settings.kind),
        workload=launch.workload,
        study=StudySettings.model_validate(
            {
                **launch.study,
                "name": f"{launch.name}-recheck-{release}",
                "results_dir": results,
                "storage": storage,
                "finalists": 1,
                "validation_runs": rounds,
                "time_budget_s": None,
                "parallel": 1,
                "gpus": None,
            }
        ),
    )
    runs = get_adapter(job.engine)  # with the launch's environment, which the trials get
    return Recheck(launch, job, report, tuned, runs, release)


def _deployed_env(record: TrialRecord) -> dict[str, str]:
    """The environment the tuned launch was deployed with: without where the trial was placed;
    a secret recorded by reference is read from this environment again (left out when unset)."""
    out: dict[str, str] = {}
    for name, value in record.env.items():
        if name in record.placement:
            continue
        if value == f"${{{name}}}":
            if name in os.environ:
                out[name] = os.environ[name]
            continue
        out[name] = value
    return out


def _release_name(version: str | None) -> str:
    """A study-name-safe spelling of the release (``0.32.0+cpu`` → ``0.32.0``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "", (version or "new").split("+")[0]) or "new"


def run_recheck(plan: Recheck, progress: Progress) -> optuna.Study:
    """Run (or resume) the recheck study; returns it with its verdict stored."""
    check_job(plan.job, plan.adapter)
    with study_session(plan.job, plan.adapter, progress) as study:
        said = {"launch": plan.launch.name, "report": plan.report.lines(), "tuned": plan.tuned}
        study.set_user_attr("recheck", said)
        method = recheck_rounds(plan.tuned, plan.job.study.validation_runs)
        orchestrate(plan.job, plan.adapter, study, progress, method=method)
        return study
