"""The tuning loop: baseline → Optuna search → finalist validation, resumable at any point.

The Optuna storage is the truth: re-running the same command loads the study, fails the trials
a killed tuner left RUNNING (and reaps their engines), re-queues them, and carries on until the
requested number of search trials has finished.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import EngineSettings, SearchSpace, StudySettings, Workload
from autotune.engines import get_adapter
from autotune.engines.base import EngineAdapter
from autotune.errors import ConfigError, StudyError
from autotune.runtime.reaper import reap_process_groups
from autotune.search.objective import is_feasible
from autotune.search.progress import NullProgress, Progress
from autotune.search.space import suggest
from autotune.search.storage import (
    best_trial,
    default_storage_url,
    fail_stale_running,
    open_study,
    study_dir,
)
from autotune.search.trial import TrialResult, TrialSpec, run_trial

__all__ = ["TuneJob", "check_job", "run_study"]

log = logging.getLogger(__name__)

STAGE_BASELINE, STAGE_SEARCH, STAGE_VALIDATION = "baseline", "search", "validation"


@dataclass(frozen=True)
class TuneJob:
    engine: EngineSettings
    space: SearchSpace
    workload: Workload
    study: StudySettings

    @property
    def storage_url(self) -> str:
        return self.study.storage or default_storage_url(self.study.results_dir, self.study.name)

    @property
    def dir(self) -> Path:
        return study_dir(self.study.results_dir, self.study.name)

    def fingerprint(self) -> str:
        """What must not change between a study's runs (engine kind/model, space, workload)."""
        blob = json.dumps(
            {
                "engine": [self.engine.kind, self.engine.model],
                "space": self.space.model_dump(mode="json"),
                "workload": self.workload.model_dump(mode="json"),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ input checks
def _model_path_problem(model: str) -> str | None:
    looks_local = model.startswith(("/", "./", "../", "~"))
    if looks_local and not Path(model).expanduser().exists():
        return f"engine model path {model!r} does not exist; check --model"
    return None


def check_job(job: TuneJob, adapter: EngineAdapter) -> None:
    """Everything that can be checked before a study is touched or an engine started."""
    problem = _model_path_problem(job.engine.model)
    if problem:
        raise ConfigError(problem)
    if job.space.engine not in ("any", job.engine.kind):
        raise ConfigError(
            f"search space {job.space.name or '(unnamed)'} is for {job.space.engine}, not {job.engine.kind}; "
            "pick a space for this engine"
        )
    every_flag = adapter.to_flags({**job.engine.fixed_flags, **job.space.fixed, **dict.fromkeys(job.space.params)})
    adapter.validate_flags(every_flag)
    context = adapter.to_flags({**job.engine.fixed_flags, **job.space.fixed}).get(adapter.knobs.get("context_len", ""))
    longest = job.workload.longest_request_tokens
    if context is not None and int(context) < longest:
        raise ConfigError(
            f"workload {job.workload.name} needs {longest} tokens per request but the context length is fixed "
            f"at {context}; raise context_len or shorten the workload"
        )


# ---------------------------------------------------------------------------------- the loop
class _Run:
    def __init__(self, job: TuneJob, adapter: EngineAdapter, study: optuna.Study, progress: Progress):
        self.job, self.adapter, self.study, self.progress = job, adapter, study, progress
        self.deadline = time.monotonic() + job.study.time_budget_s if job.study.time_budget_s else None

    # -- bookkeeping
    def trials(self, stage: str | None = None) -> list[FrozenTrial]:
        ts = self.study.get_trials(deepcopy=False)
        return [t for t in ts if stage is None or t.user_attrs.get("stage") == stage]

    def finished(self, stage: str) -> int:
        """Trials that count toward a stage's quota: finished and not superseded by a retry."""
        return sum(1 for t in self.trials(stage) if t.state.is_finished() and not t.user_attrs.get("retried"))

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    # -- one trial through Optuna
    def run(self, stage: str, repeat: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> TrialResult:
        """One trial: baseline (no params: the engine's defaults), a fresh suggestion, or a
        repeat of known params (enqueued, so the sampler sees them as a normal point)."""
        if repeat:
            self.study.enqueue_trial(repeat, skip_if_exists=False)
        trial = self.study.ask()
        no_params = repeat == {} or (repeat is None and stage == STAGE_BASELINE)
        params = {} if no_params else suggest(trial, self.job.space)
        flags = self.adapter.to_flags({**self.job.engine.fixed_flags, **self.job.space.fixed, **params})
        trial_dir = self.job.dir / "trials" / str(trial.number)
        attrs = {
            "stage": stage,
            "params": params,
            "flags": flags,
            "host": socket.gethostname(),
            "trial_dir": str(trial_dir.resolve()),
            **(extra or {}),
        }
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        self.progress.trial_started(trial.number, stage, params)
        spec = TrialSpec(
            trial.number,
            stage,
            flags,
            trial_dir,
            repeats=self.job.study.repeats,
            on_launch=lambda pgid: trial.set_user_attr("engine_pgid", pgid),
        )
        try:
            result = run_trial(spec, self.adapter, self.job.workload, self.progress)
        except BaseException:
            # Ctrl-C or a bug: the engine is already torn down; record the trial as failed so the
            # study stays consistent and a resume re-runs it.
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        self._record(trial, result)
        self.progress.trial_finished({**result.summary(), "best": self.best_summary()})
        return result

    def _record(self, trial: optuna.Trial, result: TrialResult) -> None:
        assert result.score is not None
        attrs = {
            "outcome": str(result.outcome),
            "constraints": result.score.constraints,
            "violations": result.score.violations,
            "metrics": result.metrics,
            "spread": result.spread,
            "facts": result.facts,
            "timings": result.timings,
            "reason": result.reason,
            "argv": result.argv,
            "engine_args": result.engine_args,
            "env": result.env,
            "log_path": result.log_path,
        }
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        if result.outcome.retryable:
            self.study.tell(trial, state=TrialState.FAIL)
        else:
            self.study.tell(trial, result.score.value)

    def best_summary(self) -> dict[str, Any] | None:
        best = best_trial(self.study)
        return None if best is None else {"number": best.number, "value": best.value}

    # -- stages
    def retry_failed(self) -> None:
        """Re-run (once per retry budget) trials that crashed/timed out or were interrupted."""
        for t in self.trials():
            if t.state != TrialState.FAIL or t.user_attrs.get("retried") or "params" not in t.user_attrs:
                continue
            attempts = int(t.user_attrs.get("attempt", 0))
            if attempts >= self.job.study.retries:
                continue
            self.study._storage.set_trial_user_attr(t._trial_id, "retried", True)
            self.progress.message(f"retrying trial {t.number} ({t.user_attrs.get('outcome', 'failed')})")
            self.run(t.user_attrs["stage"], t.user_attrs["params"], {"attempt": attempts + 1, "retry_of": t.number})

    def baseline(self) -> None:
        if self.job.study.baseline and self.finished(STAGE_BASELINE) == 0 and not self.out_of_time():
            self.run(STAGE_BASELINE, {})

    def search(self) -> None:
        while self.finished(STAGE_SEARCH) < self.job.study.trials and not self.out_of_time():
            self.run(STAGE_SEARCH)
            self.retry_failed()

    def validate(self) -> None:
        """Re-run the top finalists with fresh engines and rank them by the median value."""
        cfg = self.job.study
        if cfg.finalists == 0 or cfg.validation_runs == 0:
            return
        ranked = sorted(
            (
                t
                for t in self.trials()
                if t.user_attrs.get("stage") != STAGE_VALIDATION
                and t.state == TrialState.COMPLETE
                and is_feasible(t.user_attrs.get("outcome"), t.user_attrs.get("constraints"))
            ),
            key=lambda t: t.value or 0.0,
            reverse=self.study.direction == optuna.study.StudyDirection.MAXIMIZE,
        )[: cfg.finalists]
        for finalist in ranked:
            done = [
                t
                for t in self.trials(STAGE_VALIDATION)
                if t.user_attrs.get("validates") == finalist.number and t.state.is_finished()
            ]
            for _ in range(cfg.validation_runs - len(done)):
                if self.out_of_time():
                    break
                self.run(STAGE_VALIDATION, finalist.user_attrs["params"], {"validates": finalist.number})
            self._store_validation(finalist)

    def _store_validation(self, finalist: FrozenTrial) -> None:
        runs = [
            t
            for t in self.trials(STAGE_VALIDATION)
            if t.user_attrs.get("validates") == finalist.number and t.state == TrialState.COMPLETE
        ]
        values = [float(finalist.value or 0.0)] + [
            float(t.value or 0.0) if is_feasible(t.user_attrs.get("outcome"), t.user_attrs.get("constraints")) else 0.0
            for t in runs
        ]
        median = statistics.median(values)
        storage = self.study._storage
        storage.set_trial_user_attr(finalist._trial_id, "validated_values", values)
        storage.set_trial_user_attr(finalist._trial_id, "validated_median", median)
        spread = (max(values) - min(values)) / median if median else 0.0
        storage.set_trial_user_attr(finalist._trial_id, "validated_spread", spread)
        # A finalist that fails any re-run is not a safe deployment: keep it out of "best".
        if any(not is_feasible(t.user_attrs.get("outcome"), t.user_attrs.get("constraints")) for t in runs):
            storage.set_trial_user_attr(finalist._trial_id, "outcome", "unstable")


def _sampler(cfg: StudySettings) -> optuna.samplers.BaseSampler:
    def constraints(t: FrozenTrial) -> list[float]:
        return list(t.user_attrs.get("constraints", [0.0]))

    if cfg.sampler == "random":
        return optuna.samplers.RandomSampler(seed=cfg.seed)
    return optuna.samplers.TPESampler(
        seed=cfg.seed,
        constraints_func=constraints,
        multivariate=True,
        constant_liar=True,
        n_startup_trials=min(10, max(3, cfg.trials // 3)),
    )


def _resume(study: optuna.Study, job: TuneJob, progress: Progress) -> None:
    """Adopt a study left by an earlier run: check it is the same job, reap its engines."""
    fingerprint = study.user_attrs.get("fingerprint")
    if fingerprint is None:
        study.set_user_attr("fingerprint", job.fingerprint())
        study.set_user_attr(
            "config",
            {
                "engine": job.engine.model_dump(mode="json", exclude={"env"}),
                "space": job.space.model_dump(mode="json"),
                "workload": job.workload.model_dump(mode="json"),
                "study": job.study.model_dump(mode="json"),
            },
        )
    elif fingerprint != job.fingerprint():
        raise StudyError(
            f"study {job.study.name!r} was created with a different engine/space/workload; "
            "use a new --study name (nothing was changed)"
        )
    stale = fail_stale_running(study) if job.storage_url.startswith("sqlite") else []
    if not job.storage_url.startswith("sqlite"):
        optuna.storages.fail_stale_trials(study)
    pgids = [
        int(t.user_attrs["engine_pgid"])
        for t in stale
        if "engine_pgid" in t.user_attrs and t.user_attrs.get("host") == socket.gethostname()
    ]
    reaped = reap_process_groups(pgids)
    if stale:
        progress.message(f"resumed: {len(stale)} interrupted trial(s) marked failed, {len(reaped)} engine(s) reaped")


def run_study(job: TuneJob, progress: Progress | None = None) -> FrozenTrial | None:
    """Run (or resume) the whole job; returns the best feasible trial, or None."""
    progress = progress or NullProgress()
    adapter = get_adapter(job.engine)
    check_job(job, adapter)
    study = open_study(
        job.study.name, job.storage_url, direction=job.workload.objective.direction, sampler=_sampler(job.study)
    )
    job.dir.mkdir(parents=True, exist_ok=True)
    _resume(study, job, progress)
    run = _Run(job, adapter, study, progress)
    progress.study_started(job.study.name, job.study.trials, run.finished(STAGE_SEARCH))
    run.retry_failed()
    run.baseline()
    run.search()
    run.validate()
    return best_trial(study)
