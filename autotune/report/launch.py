"""A finished trial as a launch: its record (argv, env, flags, what it measured) and the file
``autotune export`` writes from it, in any of the export formats."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import optuna

from autotune.errors import ConfigError
from autotune.report.console import cut
from autotune.report.export import LaunchRecord, render
from autotune.report.summary import SERVED, no_winner_text
from autotune.search.record import study_config, trial_record, validation, verdict_on
from autotune.search.storage import best_trial, primary_value

__all__ = [
    "chosen_trial",
    "engine_config",
    "export_trial",
    "launch_record",
    "objective_metric",
    "runs_on_cpu",
    "value_summary",
]


def engine_config(study: optuna.Study) -> dict[str, Any]:
    """The engine section of the study's stored config."""
    return dict(study_config(study).get("engine") or {})


def objective_metric(study: optuna.Study) -> str:
    workload = study_config(study).get("workload") or {}
    return str((workload.get("objective") or {}).get("metric", "objective"))


def value_summary(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> tuple[float | None, str]:
    """(value, how it was measured): the validated median and its spread over the runs that
    happened, or the one run, saying why validation did not add more."""
    checked = validation(study).get(trial.number)
    if checked is None:
        finalists = (study_config(study).get("study") or {}).get("finalists")
        why = "validation is off (--finalists 0)" if finalists == 0 else "not validated"
        return primary_value(trial), f"one run, {why}"
    values = checked.get("values") or []
    if len(values) < 2:
        return checked.get("median"), "one run; the time budget ended before its validation re-runs"
    return checked.get("median"), f"median of {len(values)} runs, spread {checked.get('spread', 0.0):.1%}"


def runs_on_cpu(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether the trial ran a CPU build (vLLM-CPU): from the engine's facts, its environment or
    its log (``CPU KV cache size``, ``device_config=cpu``)."""
    record = trial_record(trial)
    facts = record.facts
    if facts.get("kv_device") == "cpu" or str(facts.get("engine_version", "")).endswith("+cpu"):
        return True
    if any(name.startswith("VLLM_CPU_") for name in record.env):
        return True
    log_path = record.log_path
    if log_path:
        with contextlib.suppress(OSError):
            text = Path(log_path).read_text(errors="replace")[:400_000]
            return "CPU KV cache size" in text or "device_config=cpu" in text
    return False


def launch_record(study: optuna.Study, trial: optuna.trial.FrozenTrial, *, force: bool = False) -> LaunchRecord:
    """What a launch script of this trial needs.

    Raises:
        ConfigError: the trial never launched (nothing to export), or it did not serve the
            workload and ``force`` is not set (a script that starts a failing engine).
    """
    record = trial_record(trial)
    if not record.argv:
        raise ConfigError(f"trial {trial.number} has no recorded launch (outcome {record.outcome}); pick another")
    if not force and record.outcome and record.outcome not in SERVED:  # interrupted, withdrawn too
        why = f": {cut(record.reason, 100)}" if record.reason else ""
        raise ConfigError(
            f"trial {trial.number} did not serve the workload ({record.outcome}{why}); export a served trial "
            "(see `autotune status`), or pass --force to write its launch anyway"
        )
    engine_cfg = engine_config(study)
    value, note = value_summary(study, trial)
    summary = f"outcome {record.outcome}, {objective_metric(study)} {value:,.2f}" if value is not None else ""
    summary += f" ({note})" if note and summary else ""
    return LaunchRecord(
        study=study.study_name,
        trial=trial.number,
        argv=record.argv,
        env=record.env,
        flags=record.flags,
        metrics=record.metrics,
        summary=summary,
        simulated=bool(engine_cfg.get("simulated")),
        engine=str(engine_cfg.get("kind", "vllm")),
        engine_version=record.facts.get("engine_version"),
        engine_args=record.engine_args,
        device="cpu" if runs_on_cpu(trial) else "gpu",
        model=engine_cfg.get("model"),
        weights_from=(record.facts.get("startup") or {}).get("weights_from"),
        verdict=_verdict_line(study, trial),
    )


def _verdict_line(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> str:
    """The study's paired verdict against the defaults, when this trial is the one it judged."""
    return str(verdict_on(study, trial.number).get("line", ""))


def export_trial(
    study: optuna.Study,
    trial: optuna.trial.FrozenTrial,
    fmt: str = "bash",
    output: Path | None = None,
    folder: Path = Path("."),
    *,
    force: bool = False,
) -> Path:
    """Write the trial's launch in ``fmt`` to ``output``, or into ``folder`` (the study's own
    results folder: never a folder the stored trial paths point at, which may be another copy).

    Raises:
        ConfigError: the trial never launched, or the file cannot be written.
    """
    suffix, text = render(launch_record(study, trial, force=force), fmt)
    path = output or folder / f"launch-trial{trial.number}{suffix}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if fmt in ("bash", "docker"):  # scripts: run as written
            path.chmod(0o755)
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror or err}; check -o") from None
    return path


def chosen_trial(study: optuna.Study, number: int | None) -> optuna.trial.FrozenTrial:
    """Trial ``number``, or the validated best when None.

    Raises:
        ConfigError: No such trial, or no feasible one to pick.
    """
    name = study.study_name
    if number is None:
        best = best_trial(study)
        if best is None:
            trials = study.get_trials(deepcopy=False)
            raise ConfigError(
                f"study {name!r} has no feasible trial ({no_winner_text(trials)}); pass --trial N to export another"
            )
        return best
    found = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    if not found:
        raise ConfigError(f"study {name!r} has no trial {number}; see `autotune status {name}`")
    return found[0]
