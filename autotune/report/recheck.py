"""What ``autotune recheck`` says: the flag report before any engine starts, then the paired
verdict of the tuned flags against the new release's defaults, and either an updated launch
script (the tuned flags still win) or the command that re-tunes on the new release."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna

from autotune.jobs import SIM_OWN_ENV
from autotune.report.console import console
from autotune.report.launch import export_trial
from autotune.search.recheck import Recheck, TunedLaunch, plan_recheck
from autotune.search.record import verdict

__all__ = ["print_recheck_verdict", "recheck_plan", "retune_command", "rounds_text"]


def recheck_plan(
    launch: TunedLaunch, engine: Mapping[str, Any], rounds: int, *, storage: str | None, results: Path
) -> Recheck:
    """The recheck of ``launch`` on the engine ``engine`` names, with its flag report printed; a
    launch of the defaults is said to have nothing to measure."""
    plan = plan_recheck(launch, engine, rounds=rounds, results=results, storage=storage)
    console.print(f"recheck of {launch.title}", highlight=False)
    for line in plan.report.lines():
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    if not plan.tuned:
        console.print(f"{launch.title} ran the engine's defaults: no tuned flag to measure on the new release")
        return plan
    tuned = " ".join(f"{flag}={value}" for flag, value in plan.tuned.items())
    console.print(f"  tuned flags on the new release: {tuned}", highlight=False, soft_wrap=True)
    return plan


def rounds_text(rounds: int) -> str:
    """What a recheck launches, for its opening line."""
    return f"{rounds} rounds of the new release's defaults beside the tuned flags, each on fresh engines"


def print_recheck_verdict(plan: Recheck, study: optuna.Study) -> int:
    """The verdict and what to do next; the exit code is 0 when the tuned flags still win."""
    said = verdict(study) or {}
    release = f"{plan.report.engine} {plan.report.version or ''}".strip()
    # The study's verdict, said of the one configuration a recheck measures against the new defaults.
    line = str(said.get("line", "no rounds ran")).replace("the engine's defaults", f"{release}'s defaults")
    line = line.replace("no candidate beat", "they did not beat").replace("(winner ", "(tuned ")
    if said.get("pairs", 0) >= 2 and said.get("high", 0.0) < 0:
        line += f"; {release}'s defaults were ahead in every round"
    console.print(f"tuned flags of {plan.launch.title} on {release}: {line}", highlight=False, soft_wrap=True)
    if said.get("beats_defaults") is True:
        winner = next(t for t in study.get_trials(deepcopy=False) if t.number == said["winner"])
        script = export_trial(study, winner, "bash", None, plan.job.dir)
        console.print(f"updated launch script: {script}", highlight=False)
        return 0
    console.print(
        f"re-tune on {release}: {retune_command(plan)}",
        highlight=False,
        soft_wrap=True,
    )
    return 1


def retune_command(plan: Recheck) -> str:
    """The ``autotune tune`` command that tunes the same model, space and workload afresh on the
    new release (the simulator's own settings become its options)."""
    engine = plan.job.engine
    env = dict(engine.env)
    words = ["autotune", "tune", "--study", f"{plan.launch.origin}-{plan.release}"]
    if engine.simulated:
        words += ["--engine", f"sim-{engine.kind}"]
        words += ["--sim-gpu", env.pop("AUTOTUNE_SIM_GPU", "H100-80GB")]
        env = {k: v for k, v in env.items() if k not in SIM_OWN_ENV}
    else:
        words += ["--engine", engine.kind]
        words += ["--python", engine.python] if engine.python else ["--command", shlex.join(engine.command or [])]
    words += ["--model", engine.model, "--space", plan.launch.space, "--workload", plan.launch.workload.name or "chat"]
    words += [f"--env={name}={value}" for name, value in sorted(env.items())]
    return shlex.join(words)
