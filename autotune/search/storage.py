"""The study's home: Optuna storage (SQLite under results/<study>/ by default, any RDB URL),
with a heartbeat so a trial left RUNNING by a killed tuner is failed on the next start."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import optuna
from optuna.storages import RDBStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import StudyError
from autotune.search.objective import is_feasible
from autotune.search.record import INTERRUPTED, WITHDRAWN, TrialRecord, trial_records, validation
from autotune.search.stage import Stage

__all__ = [
    "best_trial",
    "default_storage_url",
    "feasible_trials",
    "load_study",
    "objective_summary",
    "open_study",
    "pareto_front",
    "primary_value",
    "study_dir",
    "superseded",
]

log = logging.getLogger(__name__)

HEARTBEAT_S = 30
# A trial whose heartbeat is older than this many intervals is considered dead (its tuner was killed).
GRACE_BEATS = 3


def study_dir(results_dir: Path, study_name: str) -> Path:
    return results_dir / study_name


def default_storage_url(results_dir: Path, study_name: str) -> str:
    return f"sqlite:///{(study_dir(results_dir, study_name) / 'study.db').resolve()}"


def _storage(url: str, heartbeat_s: int = HEARTBEAT_S) -> RDBStorage:
    try:
        if url.startswith("sqlite"):
            # One tuner per SQLite study: a restart fails its leftovers at once (fail_stale_running).
            # Its parallel trials are threads of that tuner: let a writer wait for another's lock.
            return RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
        with warnings.catch_warnings():  # Optuna marks heartbeats experimental; they are what we need
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return RDBStorage(
                url,
                heartbeat_interval=heartbeat_s,
                grace_period=GRACE_BEATS * heartbeat_s,
                engine_kwargs={"pool_pre_ping": True},
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


def _direction(name: str) -> StudyDirection:
    return StudyDirection.MAXIMIZE if name == "maximize" else StudyDirection.MINIMIZE


def open_study(
    name: str,
    storage_url: str,
    *,
    directions: list[str],
    sampler: optuna.samplers.BaseSampler,
    heartbeat_s: int = HEARTBEAT_S,
) -> optuna.Study:
    """Create the study, or load it when it exists (checking it optimises the same way)."""
    if storage_url.startswith("sqlite:///"):
        Path(storage_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    storage = _storage(storage_url, heartbeat_s)
    wanted = [_direction(d) for d in directions]
    try:
        study = optuna.create_study(
            study_name=name, storage=storage, directions=wanted, sampler=sampler, load_if_exists=True
        )
    except ValueError as err:
        raise StudyError(f"study {name!r}: {err}") from None
    if study.directions != wanted:
        have = ", ".join(d.name.lower() for d in study.directions)
        raise StudyError(
            f"study {name!r} was created to {have}, not {', '.join(directions)}; "
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
    would otherwise wait out the grace period. With SQLite (one box, one tuner) every RUNNING trial at start
    belongs to a dead tuner, so we fail them at once.
    """
    storage = study._storage
    stale = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    for t in stale:
        storage.set_trial_user_attr(t._trial_id, "outcome", INTERRUPTED)
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
    return stale


def superseded(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of trials that do not count: failed ones a later retry replaced (the retry carries
    ``retry_of``), and ones withdrawn before their engine started."""
    records = trial_records(trials)
    replaced = {r.retry_of for r in records if r.retry_of is not None}
    return replaced | {r.number for r in records if r.outcome == WITHDRAWN}


def feasible_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Served trials that met every SLO, under the workload itself (not a probe's peak load)."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return [t for t, r in zip(complete, trial_records(complete), strict=True) if _feasible_search_run(r)]


def _feasible_search_run(r: TrialRecord) -> bool:
    # A re-run of a configuration (validation, the baseline's noise runs) is never a candidate itself.
    return r.stage not in (Stage.VALIDATION, Stage.NOISE) and not r.is_probe and is_feasible(r.outcome, r.constraints)


def primary_value(trial: FrozenTrial) -> float | None:
    """The first objective's value (the only one in a single-objective study)."""
    return trial.values[0] if trial.values else None


def pareto_front(study: optuna.Study) -> list[FrozenTrial]:
    """Feasible trials no other feasible trial beats on every objective."""
    trials = [t for t in feasible_trials(study) if t.values]
    signs = [1 if d == StudyDirection.MAXIMIZE else -1 for d in study.directions]

    def dominates(a: FrozenTrial, b: FrozenTrial) -> bool:
        pairs = [(s * x, s * y) for s, x, y in zip(signs, a.values, b.values, strict=True)]
        return all(x >= y for x, y in pairs) and any(x > y for x, y in pairs)

    return [t for t in trials if not any(dominates(o, t) for o in trials if o is not t)]


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The winner: among validated finalists that stayed feasible, the best median; before any
    validation, the best single feasible trial. A validation re-run is never the winner itself."""
    trials = feasible_trials(study)
    checked = validation(study)
    stable = [t for t in trials if checked.get(t.number, {}).get("stable")]
    pool = stable or [t for t in trials if t.number not in checked]
    if not pool:
        return None
    sign = 1 if study.directions[0] == StudyDirection.MAXIMIZE else -1
    return max(pool, key=lambda t: sign * float(checked.get(t.number, {}).get("median", primary_value(t)) or 0.0))


def objective_summary(study: optuna.Study, trial: FrozenTrial) -> tuple[float | None, str]:
    """(value, note): the validated median with its spread when there is one."""
    checked = validation(study).get(trial.number)
    if checked is None:
        return primary_value(trial), ""
    return checked["median"], f"median of {len(checked['values'])} runs, spread {checked['spread']:.1%}"
