"""The study record: what autotune keeps about each trial and each study in Optuna's storage.

Optuna stores a trial's and a study's attributes as free-form JSON (``user_attrs``). Every module
writes and reads them through this one: :class:`TrialRecord` (one trial), :class:`StageState`
(where a tuning stage stands) and the study-level functions below. A misspelt key then fails
where it is written (``TypeError``) instead of reading ``None`` somewhere else; a key this
version does not know, written by a newer autotune, is ignored on read.

The layout is versioned by :data:`RECORD_VERSION`, stored on the study when it is created.
Studies written before the version was stored have the same layout (version 1) and open as they
are; a study written by a newer layout is refused with the version it carries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import BaseTrial, FrozenTrial

from autotune.errors import StudyError
from autotune.outcomes import SERVED

__all__ = [
    "DEFAULTS",
    "INTERRUPTED",
    "RECORD_VERSION",
    "WITHDRAWN",
    "StageState",
    "TrialRecord",
    "check_record_version",
    "lease",
    "memory_edges",
    "set_lease",
    "set_memory_edge",
    "set_stage_state",
    "set_stopped",
    "set_study_config",
    "set_validation",
    "set_verdict",
    "set_weight_daemon",
    "stage_state",
    "stopped",
    "study_config",
    "study_fingerprint",
    "trial_record",
    "trial_records",
    "validation",
    "verdict",
    "verdict_on",
    "weight_daemon",
    "write_trial",
]

RECORD_VERSION = 1
#: The ``validates`` key of validation runs of the engine's defaults (a finalist's is its number).
DEFAULTS = "defaults"
#: The outcome recorded for a trial its tuner stopped (Ctrl-C, or killed: failed on the next start).
INTERRUPTED = "interrupted"
#: The outcome recorded for a trial withdrawn before its engine started: trials asked before it
#: had filled its quota, or measured (or are measuring) the configuration it proposed.
WITHDRAWN = "withdrawn"
#: The outcome recorded for a search trial the twin ruled out before any engine started
#: (``search/twin.py``): told to the sampler as pruned, with its prediction.
SCREENED = "screened"
_VERSION_KEY = "record_version"


@dataclass(frozen=True)
class TrialRecord:
    """One trial's attributes as the tuner wrote them (absent ones keep their defaults).

    Written in three steps: when the trial starts (what runs: stage, params, flags, where),
    while it runs (placement, the engine's process group) and when it ends (the outcome and what
    was measured). ``params is None`` marks a trial that never got as far as its start record.
    """

    number: int = -1
    # -- at start
    stage: str = ""
    params: dict[str, Any] | None = None
    flags: dict[str, Any] = field(default_factory=dict)
    host: str = ""
    worker: str = ""
    trial_dir: str = ""
    validates: int | str | None = None  # validation runs: the finalist's number, or "defaults"
    probe: float | None = None  # memory probes: the fraction probed
    workload_override: dict[str, Any] | None = None  # a probe's peak workload, when not the study's
    attempt: int = 0
    retry_of: int | None = None
    # -- while running
    placement: dict[str, str] = field(default_factory=dict)
    engine_pgid: int | None = None
    # -- at the end
    outcome: str | None = None
    constraints: dict[str, float] = field(default_factory=dict)
    violations: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    reason: str | None = None
    argv: list[str] = field(default_factory=list)
    engine_args: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    log_path: str | None = None
    # A benchmark run that ended early: {"reason": slo_lost | cannot_win | server_dead, "at_requests", "evidence"}
    early_stop: dict[str, Any] | None = None
    # The twin's prediction, made before the engine started (search/twin.py): {"predicted", "fit",
    # "from_runs"} or {"skipped": why}; once measured, also {"measured", "error"}.
    twin: dict[str, Any] | None = None

    @property
    def started(self) -> bool:
        """Whether the start record was written (a trial can die before it)."""
        return self.params is not None

    @property
    def is_probe(self) -> bool:
        """A run under another workload than the study's (a memory probe's peak shape)."""
        return bool(self.workload_override)

    @property
    def served_its_workload(self) -> bool:
        """Served the study's own workload (within its SLOs or not): a run whose numbers say
        what the study's configuration does."""
        return not self.is_probe and self.outcome in SERVED


_FIELDS = frozenset(f.name for f in dataclasses.fields(TrialRecord)) - {"number"}
# None in storage means "not set" for these: their defaults are empty containers.
_CONTAINERS = frozenset(f.name for f in dataclasses.fields(TrialRecord) if f.default_factory is not dataclasses.MISSING)


def trial_record(trial: FrozenTrial) -> TrialRecord:
    """The typed record of a stored trial."""
    attrs = trial.user_attrs
    known = {k: v for k, v in attrs.items() if k in _FIELDS and not (v is None and k in _CONTAINERS)}
    return TrialRecord(number=trial.number, **known)


def write_trial(trial: BaseTrial, **attrs: Any) -> None:
    """Store attributes of a running trial.

    Raises:
        TypeError: For a name that is not a :class:`TrialRecord` field.
    """
    unknown = sorted(set(attrs) - _FIELDS)
    if unknown:
        raise TypeError(f"not trial record fields: {', '.join(unknown)}")
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


def trial_records(trials: Iterable[FrozenTrial]) -> list[TrialRecord]:
    return [trial_record(t) for t in trials]


# ------------------------------------------------------------------------------ stages
@dataclass(frozen=True)
class StageState:
    """Where a tuning stage stands: ``done`` once it decided, and what it decided.

    ``fixed`` holds the knob values a stage settled (graph coverage, context); the memory stage
    keeps its probes (``results``: fraction → verdict), the edge and what bounded it.
    """

    done: bool = False
    skipped: str | None = None  # why the stage did not run
    fixed: dict[str, Any] | None = None
    noise: float | None = None  # the run-to-run spread the stage's decision allowed for
    stalled: str | None = None  # why a search stage ended before its trial budget
    # -- the memory edge
    edge: float | None = None
    results: dict[str, str] | None = None  # fraction → verdict of each probe
    key: str | None = None  # the context and graph settings the edge holds for
    mode: str | None = None  # step | bisect
    note: str | None = None  # what the memory knob means on this engine
    ceiling: float | None = None  # the host's memory capped the probes here (CPU engines)
    kv_cache_memory_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def stage_state(study: optuna.Study, name: str) -> StageState | None:
    data = study.user_attrs.get(f"stage.{name}")
    if data is None:
        return None
    known = {f.name for f in dataclasses.fields(StageState)}
    return StageState(**{k: v for k, v in data.items() if k in known})


def set_stage_state(study: optuna.Study, name: str, state: StageState) -> None:
    study.set_user_attr(f"stage.{name}", state.to_json())


def stage_states(study: optuna.Study) -> dict[str, StageState]:
    """Every stage's state, by stage name."""
    names = [k.removeprefix("stage.") for k in study.user_attrs if k.startswith("stage.")]
    return {name: state for name in names if (state := stage_state(study, name)) is not None}


# ------------------------------------------------------------------------------ the study
def check_record_version(study: optuna.Study) -> None:
    """Stamp a new study with this layout's version; refuse one written by a newer layout.

    Raises:
        StudyError: When the study's record version is newer than this autotune reads.
    """
    version = study.user_attrs.get(_VERSION_KEY)
    if version is None:
        study.set_user_attr(_VERSION_KEY, RECORD_VERSION)
    elif int(version) > RECORD_VERSION:
        raise StudyError(
            f"study {study.study_name!r} was written with record version {version}; this autotune reads up to "
            f"{RECORD_VERSION}: upgrade autotune to open it"
        )


def study_fingerprint(study: optuna.Study) -> str | None:
    value = study.user_attrs.get("fingerprint")
    return None if value is None else str(value)


def study_config(study: optuna.Study) -> dict[str, Any]:
    """The job the study was created with: engine (without its environment), space, workload, study."""
    return dict(study.user_attrs.get("config") or {})


def set_study_config(study: optuna.Study, fingerprint: str, config: Mapping[str, Any]) -> None:
    study.set_user_attr("fingerprint", fingerprint)
    study.set_user_attr("config", dict(config))


def validation(study: optuna.Study) -> dict[int, dict[str, Any]]:
    """Finalist number → {values, median, spread, stable} from the validation stage.

    Kept on the study: Optuna forbids changing a trial once it is finished."""
    return {int(k): v for k, v in (study.user_attrs.get("validation") or {}).items()}


def set_validation(study: optuna.Study, checked: Mapping[int, Mapping[str, Any]]) -> None:
    study.set_user_attr("validation", {str(k): dict(v) for k, v in checked.items()})


def verdict(study: optuna.Study) -> dict[str, Any] | None:
    """Whether the winner beat the engine's defaults beyond the noise (``search/verdict.py``)."""
    value = study.user_attrs.get("verdict")
    return dict(value) if value else None


def verdict_on(study: optuna.Study, number: int | None) -> dict[str, Any]:
    """The verdict when it judged trial ``number`` (the study's winner), else {}: a verdict is
    never shown beside another trial."""
    said = verdict(study) or {}
    return said if number is not None and said.get("winner") == number else {}


def set_verdict(study: optuna.Study, value: Mapping[str, Any]) -> None:
    study.set_user_attr("verdict", dict(value))


def stopped(study: optuna.Study) -> dict[str, Any] | None:
    """Why the study stopped on its own (the engine fails whatever the flags), when it did."""
    value = study.user_attrs.get("stopped")
    return dict(value) if value else None


def set_stopped(study: optuna.Study, value: Mapping[str, Any]) -> None:
    study.set_user_attr("stopped", dict(value))


def memory_edges(study: optuna.Study) -> dict[str, float | None]:
    """The memory edge found for each context/graph setting (``StageState.key``)."""
    return dict(study.user_attrs.get("memory_edges") or {})


def set_memory_edge(study: optuna.Study, key: str, edge: float | None) -> None:
    study.set_user_attr("memory_edges", {**memory_edges(study), key: edge})


def lease(study: optuna.Study, key: str) -> dict[str, Any]:
    """A lease the workers of a shared study take in turn (``search/coordination.py``)."""
    return dict(study.user_attrs.get(key) or {})


def set_lease(study: optuna.Study, key: str, value: Mapping[str, Any]) -> None:
    study.set_user_attr(key, dict(value))


def weight_daemon(study: optuna.Study) -> dict[str, Any] | None:
    """The study's running weight-cache daemon (its process group and argv), while one runs."""
    value = study.user_attrs.get("weight_daemon")
    return dict(value) if value else None


def set_weight_daemon(study: optuna.Study, value: Mapping[str, Any] | None) -> None:
    """Stored when the daemon starts, cleared when it stops: one left here was orphaned by a
    killed tuner, and the next run reaps it."""
    study.set_user_attr("weight_daemon", dict(value) if value else None)
