"""The study's home: Optuna storage (SQLite under results/<study>/ by default, any RDB URL),
with a heartbeat so a trial left RUNNING by a killed tuner is failed on the next start."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import StudyError
from autotune.search.objective import is_feasible

__all__ = ["best_trial", "default_storage_url", "feasible_trials", "load_study", "open_study", "study_dir"]

log = logging.getLogger(__name__)

HEARTBEAT_S = 30
# A trial whose heartbeat is older than this is considered dead (its tuner was killed).
GRACE_S = 90


def study_dir(results_dir: Path, study_name: str) -> Path:
    return results_dir / study_name


def default_storage_url(results_dir: Path, study_name: str) -> str:
    return f"sqlite:///{(study_dir(results_dir, study_name) / 'study.db').resolve()}"


def _storage(url: str) -> RDBStorage:
    try:
        if url.startswith("sqlite"):
            # One tuner per SQLite study: a restart fails its leftovers at once (fail_stale_running).
            return RDBStorage(url)
        return RDBStorage(
            url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S, engine_kwargs={"pool_pre_ping": True}
        )
    except Exception as err:  # SQLAlchemy raises many kinds; all mean "cannot use this URL"
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise StudyError(f"cannot open study storage {_redact(url)}: {reason}; check --storage") from None


def _redact(url: str) -> str:
    """Hide a password in a storage URL (postgresql://user:pw@host/db → user:***@host)."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url


def open_study(name: str, storage_url: str, *, direction: str, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """Create the study, or load it when it exists (checking it optimises the same way)."""
    if storage_url.startswith("sqlite:///"):
        Path(storage_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    storage = _storage(storage_url)
    wanted = StudyDirection.MAXIMIZE if direction == "maximize" else StudyDirection.MINIMIZE
    try:
        study = optuna.create_study(
            study_name=name, storage=storage, direction=wanted, sampler=sampler, load_if_exists=True
        )
    except ValueError as err:
        raise StudyError(f"study {name!r}: {err}") from None
    if study.direction != wanted:
        raise StudyError(
            f"study {name!r} was created to {study.direction.name.lower()}, not {direction}; "
            "use a new study name for a different objective"
        )
    return study


def load_study(name: str, storage_url: str) -> optuna.Study:
    """Open an existing study read-mostly (status, export, report)."""
    storage = _storage(storage_url)
    try:
        return optuna.load_study(study_name=name, storage=storage, sampler=optuna.samplers.RandomSampler())
    except KeyError:
        raise StudyError(f"no study named {name!r} in {_redact(storage_url)}; check the name or --storage") from None


def fail_stale_running(study: optuna.Study) -> list[FrozenTrial]:
    """Fail trials whose tuner died, however recent: called only when we own the study run.

    Optuna's heartbeat fails trials older than the grace period; a restart right after a kill
    would otherwise wait GRACE_S. With SQLite (one box, one tuner) every RUNNING trial at start
    belongs to a dead tuner, so we fail them at once.
    """
    storage = study._storage
    stale = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    for t in stale:
        storage.set_trial_user_attr(t._trial_id, "outcome", "interrupted")
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
    return stale


def feasible_trials(study: optuna.Study) -> list[FrozenTrial]:
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if is_feasible(t.user_attrs.get("outcome"), t.user_attrs.get("constraints"))
    ]


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best feasible trial (served, every SLO met). Validated trials rank by their median."""
    trials = feasible_trials(study)
    if not trials:
        return None
    sign = 1 if study.direction.name.lower() == "maximize" else -1

    def key(t: FrozenTrial) -> float:
        v: Any = t.user_attrs.get("validated_median", t.value)
        return sign * float(v)

    return max(trials, key=key)
