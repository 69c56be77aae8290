"""The tuning loop: baseline → Optuna search → finalist validation, resumable at any point.

The Optuna storage is the truth: re-running the same command loads the study, fails the trials
a killed tuner left RUNNING (and reaps their engines), re-queues them, and carries on until the
requested number of search trials has finished.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.bench.capacity import check_capacity_slos
from autotune.config import EngineSettings, SearchSpace, StudySettings, Workload, as_given
from autotune.engines import get_adapter
from autotune.engines.base import EngineAdapter
from autotune.errors import ConfigError, StudyError
from autotune.runtime.reaper import reap_process_groups
from autotune.search.job import TuneJob
from autotune.search.manifest import write_manifest
from autotune.search.parallel import orchestrate
from autotune.search.progress import NullProgress, Progress
from autotune.search.record import (
    check_record_version,
    set_study_config,
    set_weight_daemon,
    study_config,
    study_fingerprint,
    trial_records,
    weight_daemon,
)
from autotune.search.storage import (
    best_trial,
    fail_stale_running,
    load_study,
    open_study,
)
from autotune.search.studylock import study_lock

__all__ = ["TuneJob", "check_job", "join_job", "make_sampler", "run_study", "study_session"]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ input checks
def _model_path_problem(model: str) -> str | None:
    looks_local = model.startswith(("/", "./", "../", "~"))
    if looks_local and not Path(model).expanduser().exists():
        return f"engine model path {model!r} does not exist; check --model"
    return None


def _model_max_len(model: str) -> int | None:
    """The context a local model supports (config.json), when the model is a local folder."""
    config = Path(model).expanduser() / "config.json"
    if not config.is_file():
        return None
    try:
        value = json.loads(config.read_text()).get("max_position_embeddings")
    except (OSError, json.JSONDecodeError):
        return None
    return int(value) if isinstance(value, int) else None


def scaled_startup_timeout(model: str) -> float:
    """How long an engine may take to become ready: 300 s plus 60 s per GiB of local weights
    (loading dominates), or 1200 s for a hub model that may be downloaded first."""
    path = Path(model).expanduser()
    if not path.is_dir():
        return 1200.0
    weights = [*path.glob("*.safetensors"), *path.glob("*.bin")]
    return 300.0 + 60.0 * sum(f.stat().st_size for f in weights) / 2**30


def check_job(job: TuneJob, adapter: EngineAdapter) -> None:
    """Everything that can be checked before a study is touched or an engine started."""
    problem = _model_path_problem(job.engine.model)
    if problem:
        raise ConfigError(problem)
    model_max = _model_max_len(job.engine.model)
    if model_max is not None and job.workload.longest_request_tokens > model_max:
        raise ConfigError(
            f"workload {job.workload.name} needs {job.workload.longest_request_tokens} tokens per request but "
            f"the model allows {model_max} (max_position_embeddings); shorten dataset.input_len/output_len"
        )
    if job.space.engine not in ("any", job.engine.kind):
        raise ConfigError(
            f"search space {job.space.name or '(unnamed)'} is for {job.space.engine}, not {job.engine.kind}; "
            "pick a space for this engine"
        )
    if job.workload.searches_capacity:
        check_capacity_slos(job.workload, job.workload.capacity.dimension)
    every_flag = adapter.to_flags({**job.engine.fixed_flags, **job.space.fixed, **dict.fromkeys(job.space.params)})
    adapter.validate_flags(every_flag)
    context = adapter.to_flags({**job.engine.fixed_flags, **job.space.fixed}).get(adapter.knobs.get("context_len", ""))
    longest = job.workload.longest_request_tokens
    if context is not None and int(context) < longest:
        raise ConfigError(
            f"workload {job.workload.name} needs {longest} tokens per request but the context length is fixed "
            f"at {context}; raise context_len or shorten the workload"
        )


def make_sampler(cfg: StudySettings) -> optuna.samplers.BaseSampler:
    """The study's sampler: TPE (multivariate, constant liar for parallel trials), random or NSGA-II."""
    if cfg.sampler == "random":
        return optuna.samplers.RandomSampler(seed=cfg.seed)
    if cfg.sampler == "nsga2":
        # Multi-objective search by evolution: needs generations, so it suits long runs.
        return optuna.samplers.NSGAIISampler(seed=cfg.seed, population_size=max(4, min(20, cfg.trials // 3)))
    # group: the study also holds runs with only some of the space's values (the baseline has
    # none, memory probes only the fraction); without it TPE's joint model would see no common
    # space and fall back to one knob at a time. Optuna marks it experimental: a user needs no
    # warning about the tuner's own choice.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=cfg.seed,
            multivariate=True,
            group=True,
            constant_liar=True,
            n_startup_trials=min(10, max(3, cfg.trials // 3)),
        )


def _resume(study: optuna.Study, job: TuneJob, progress: Progress) -> None:
    """Adopt a study left by an earlier run: check it is the same job, reap its engines."""
    check_record_version(study)
    fingerprint = study_fingerprint(study)
    if fingerprint is None:
        set_study_config(study, job.fingerprint(), job.config())
    elif fingerprint != job.fingerprint():
        raise StudyError(
            f"study {job.study.name!r} was created with a different engine/space/workload; "
            "use a new --study name (nothing was changed)"
        )
    # On a shared storage the workers' heartbeats fail and retry a dead worker's trials (parallel.py).
    stale = fail_stale_running(study) if job.storage_url.startswith("sqlite") else []
    here = socket.gethostname()
    pgids = [r.engine_pgid for r in trial_records(stale) if r.engine_pgid is not None and r.host == here]
    reaped = reap_process_groups(pgids)
    if stale:
        progress.message(f"resumed: {len(stale)} interrupted trial(s) marked failed, {len(reaped)} engine(s) reaped")
    _reap_weight_daemon(study, progress)


def _reap_weight_daemon(study: optuna.Study, progress: Progress) -> None:
    """A weight-cache daemon a killed tuner left running holds the model's weights on the GPU:
    end it before this run's engines need the memory (its parent-death watchdog normally has)."""
    daemon = weight_daemon(study)
    if daemon is None or daemon.get("host", socket.gethostname()) != socket.gethostname():
        return
    if reap_process_groups([int(daemon["pgid"])]):
        progress.message("resumed: the weight-cache daemon a stopped run left behind was ended")
    set_weight_daemon(study, None)


def join_job(name: str, storage_url: str, *, engine: Mapping[str, Any], study: Mapping[str, Any]) -> TuneJob:
    """The job of an existing study, as its first worker stored it, for another worker to join.

    ``engine`` and ``study`` override what is local to this worker: the engine's Python or
    command and environment (never stored), the results folder, slots and GPUs.

    Raises:
        StudyError: When the study does not exist or was not created by ``autotune tune``.
    """
    config = study_config(load_study(name, storage_url))
    if not config:
        raise StudyError(f"study {name!r} holds no autotune job; start it with `autotune tune` first")
    return TuneJob(
        engine=EngineSettings.model_validate({**as_given(EngineSettings, config["engine"]), **engine}),
        space=SearchSpace.model_validate(as_given(SearchSpace, config["space"])),
        workload=Workload.model_validate(as_given(Workload, config["workload"])),
        study=StudySettings.model_validate(
            {**as_given(StudySettings, config["study"]), **study, "name": name, "storage": storage_url}
        ),
    )


def run_study(job: TuneJob, progress: Progress | None = None) -> FrozenTrial | None:
    """Run (or resume) the whole job; returns the best feasible trial, or None."""
    progress = progress or NullProgress()
    adapter = get_adapter(job.engine)
    check_job(job, adapter)
    with study_session(job, adapter, progress) as study:
        orchestrate(job, adapter, study, progress)
        return best_trial(study)


@contextlib.contextmanager
def study_session(job: TuneJob, adapter: EngineAdapter, progress: Progress) -> Iterator[optuna.Study]:
    """The job's study, created or resumed (a killed run's trials failed, its engines reaped),
    held for this run: a local study has one run at a time, and its manifest is written before
    and after."""
    study = open_study(
        job.study.name,
        job.storage_url,
        directions=job.workload.objective.directions,
        sampler=make_sampler(job.study),
        heartbeat_s=job.study.heartbeat_s,
    )
    job.dir.mkdir(parents=True, exist_ok=True)
    # On a shared storage workers join by design (and a dead one's trials are retried by
    # heartbeat, not reaped).
    local = job.storage_url.startswith("sqlite")
    with study_lock(job.dir, job.study.name) if local else contextlib.nullcontext():
        _resume(study, job, progress)
        engine = {"name": adapter.name, "simulated": job.engine.simulated}
        write_manifest(job.dir, study, engine, job.config())
        try:
            yield study
        finally:
            with contextlib.suppress(Exception):  # the run's own error (or Ctrl-C) is the one to report
                write_manifest(job.dir, study, engine, job.config())
