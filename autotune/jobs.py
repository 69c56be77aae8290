"""From the command line's options to the job a study runs: which engine ``--python`` or
``--command`` launches, its settings (the simulator's command and ``AUTOTUNE_SIM_*`` settings
included), the search space and workload files, and the study's settings."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune.catalog import DEFAULT_SPACE, resolve_file
from autotune.config import EngineSettings, SearchSpace, StudySettings, Workload, load_yaml, parse_model
from autotune.engines import ADAPTERS, EngineAdapter, engines_named, get_adapter
from autotune.engines.drift import installed
from autotune.errors import ConfigError
from autotune.options import (
    check_space_values,
    parse_duration,
    parse_env,
    parse_gpus,
    parse_pairs,
    parse_parallel,
    typed_fixed,
)
from autotune.report.exported import read_exported
from autotune.report.launch import chosen_trial, engine_config
from autotune.report.simband import report_sentence
from autotune.search.job import TuneJob
from autotune.search.recheck import TunedLaunch, from_study
from autotune.search.space import for_release
from autotune.search.studies import open_named
from autotune.search.tune import join_job, scaled_startup_timeout

__all__ = [
    "SIM_DEFAULT_MODEL",
    "SIM_OWN_ENV",
    "EngineOptions",
    "engine_choice",
    "infer_engine",
    "joined_job",
    "recheck_engine",
    "recheck_source",
    "release_space",
    "tune_job",
]

SIM_DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SIM_CACHE_ROOT = Path.home() / ".cache" / "autotune" / "sim-vllm"
SIM_INTRO = "simulated engine: numbers are modelled by autotune's GPU simulator, not measured"


@dataclass(frozen=True)
class EngineOptions:
    """The engine as the command line names it (``--engine``, ``--model``, ``--python`` …)."""

    engine: str | None = None
    model: str | None = None
    python: str | None = None
    command: str | None = None
    fixed: list[str] = field(default_factory=list)  # KEY=VALUE, as typed
    env: list[str] = field(default_factory=list)  # KEY=VALUE, as typed
    startup_timeout: float | None = None
    api_key_env: str | None = None
    sim_gpu: str = "H100-80GB"
    sim_speedup: float = 20.0


def tune_job(
    options: EngineOptions,
    space: str | None,
    workload: str,
    study: dict[str, Any],
    *,
    client: str | None = None,
) -> tuple[TuneJob, list[str]]:
    """(the job, the lines to print first): engine, space (the engine's default when None),
    workload (``client`` overrides its measuring instrument) and study settings, each checked
    before anything is launched. ``study["time_budget_s"]`` may be a duration text (``8h``).

    Raises:
        ConfigError: One line naming the option or file at fault.
    """
    env = parse_env(options.env)
    fixed_raw = parse_pairs(options.fixed, "--fixed")
    engine, intro = engine_choice(options.engine, options.python, options.command)
    kind = (engine.partition("-")[2] or "vllm") if engine.startswith("sim") else engine
    space_path = resolve_file(space or DEFAULT_SPACE.get(kind, "vllm-default"), "search_spaces")
    space_model = load_yaml(space_path, SearchSpace)
    check_space_values(kind, space_model, str(space_path))
    settings = engine_settings(engine, options, typed_fixed(kind, fixed_raw, space_model), env)
    space_model, left_out = release_space(space_model, get_adapter(settings))
    budget = study.get("time_budget_s")
    if isinstance(budget, str):
        study = {**study, "time_budget_s": parse_duration(budget, "--time-budget")}
    if "parallel" in study:
        study = {**study, "parallel": parse_parallel(study["parallel"]), "gpus": parse_gpus(study.get("gpus"))}
    job = TuneJob(
        engine=settings,
        space=space_model,
        workload=_with_client(load_yaml(resolve_file(workload, "workloads"), Workload), client),
        study=parse_model(StudySettings, study, "tune options"),
    )
    return job, [*intro, *left_out]


def release_space(space: SearchSpace, adapter: EngineAdapter) -> tuple[SearchSpace, list[str]]:
    """The space without the knobs newer than the installed release (the adapter dates them),
    and a line for each left out; the engine's help is read only when the space has such a knob."""
    if not any(adapter.flag_for(name) in adapter.flags_since for name in space.params):
        return space, []
    known = adapter.discover_flags()
    return for_release(space, adapter, replace(known, version=known.version or installed(adapter).version))


def joined_job(name: str, storage: str, options: EngineOptions, study: dict[str, Any]) -> tuple[TuneJob, list[str]]:
    """The job of a study another box started, run from this box: engine, space, workload and
    settings as stored; this box's engine Python or command, environment, results folder,
    slots and GPUs from ``options`` and ``study``."""
    local_env = parse_env(options.env)
    engine: dict[str, Any] = {"env": local_env}
    stored = join_job(name, storage, engine={}, study={}).engine
    if stored.simulated:
        engine = {"env": {**_sim_env(options), **local_env}, "command": _sim_command(stored.kind)}
    if options.python is not None:
        engine.update(python=options.python, command=None)
    if options.command is not None:
        engine["command"] = shlex.split(options.command)
    study = {**study, "parallel": parse_parallel(study["parallel"]), "gpus": parse_gpus(study.get("gpus"))}
    job = join_job(name, storage, engine=engine, study=study)
    return job, [f"{SIM_INTRO} (the study's engine). {report_sentence()}"] if job.engine.simulated else []


def recheck_source(
    study: str | None,
    options: EngineOptions,
    *,
    trial: int | None,
    script: Path | None,
    workload: str | None,
    storage: str | None,
    results: Path,
) -> tuple[TunedLaunch, dict[str, Any]]:
    """(the tuned launch to recheck, what the new release changes of its engine): a study's
    trial (its validated best unless ``trial``), or an exported ``script`` measured on
    ``workload`` with the ``--fixed`` flags both sides keep.

    Raises:
        ConfigError: A script without --workload, a study beside --script, or no new engine.
    """
    if script is None:
        source = open_named(study, storage, results)
        return from_study(source, chosen_trial(source, trial)), recheck_engine(engine_config(source), options)
    if study is not None or trial is not None:
        raise ConfigError("--script rechecks an exported launch: drop the study name and --trial (or drop --script)")
    if workload is None:
        raise ConfigError("--script needs --workload: an exported launch does not say what it was tuned for")
    launch = read_exported(script)
    space = load_yaml(resolve_file(DEFAULT_SPACE[launch.kind], "search_spaces"), SearchSpace)
    return (
        TunedLaunch(
            origin=re.sub(r"[^A-Za-z0-9._-]", "-", script.name.split(".")[0]).lstrip("-._") or "launch",
            trial=None,
            flags=launch.flags,
            env=launch.env,
            fixed=typed_fixed(launch.kind, parse_pairs(options.fixed, "--fixed"), space),
            engine={"kind": launch.kind, "model": launch.model},
            workload=load_yaml(resolve_file(workload, "workloads"), Workload),
            space=space.name,
        ),
        recheck_engine({"kind": launch.kind}, options),
    )


def recheck_engine(stored: Mapping[str, Any], options: EngineOptions) -> dict[str, Any]:
    """What a recheck changes of a study's stored engine: the new release's Python or command
    (a simulated study runs this tuner's simulator, the release chosen by its environment), and
    the environment given on the command line.

    Raises:
        ConfigError: A real engine's study without --python or --command.
    """
    env = parse_env(options.env)
    if stored.get("simulated"):
        return {"command": _sim_command(str(stored["kind"])), "env": env}
    if not options.python and not options.command:
        raise ConfigError("--python (or --command) is required: the new release's engine to recheck the study on")
    command = shlex.split(options.command) if options.command else None
    return {"python": options.python, "command": command, "env": env}


def _sim_env(options: EngineOptions) -> dict[str, str]:
    """The simulator's GPU and clock, and its compile cache apart from a real vLLM's (it keeps
    marker files where vLLM keeps compiled graphs: ``~/.cache/vllm`` stays the real engine's)."""
    values = (options.sim_gpu, str(options.sim_speedup), str(SIM_CACHE_ROOT))
    return dict(zip(SIM_OWN_ENV, values, strict=True))


#: The variables the simulator's options set (``--sim-gpu``, ``--sim-speedup``, its cache).
SIM_OWN_ENV = ("AUTOTUNE_SIM_GPU", "AUTOTUNE_SIM_SPEEDUP", "VLLM_CACHE_ROOT")


def _sim_command(dialect: str) -> list[str]:
    return [sys.executable, "-m", "autotune_sim", dialect]


def _with_client(workload: Workload, client: str | None) -> Workload:
    """The workload measured with ``client`` (``--bench-client``), validated like the YAML field."""
    if client is None:
        return workload
    return parse_model(Workload, {**workload.model_dump(exclude_unset=True), "client": client}, "--bench-client")


_ENGINES = ("vllm", "sglang")

_PROBE = "import importlib.util as u; print(' '.join(m for m in ('vllm', 'sglang') if u.find_spec(m)))"


def _engines_importable(python: str, option: str) -> set[str]:
    """Which engines ``python`` can import (asked without importing them: package specs only)."""
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise ConfigError(
            f"{option} {python}: no such program; give the engine venv's Python, e.g. /opt/vllm/bin/python"
        ) from None
    except OSError as err:  # not executable, not a program
        raise ConfigError(f"{option} {python}: cannot run it ({err.strerror}); give the engine venv's Python") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{option} {python} did not answer within 60 s; name the engine with --engine") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise ConfigError(f"{option} {python} failed (exit {proc.returncode}: {tail}); name the engine with --engine")
    return set(proc.stdout.split()) & set(_ENGINES)


def infer_engine(python: str | None, command: str | None) -> str:
    """The engine ``--python`` / ``--command`` launch, when ``--engine`` was not given.

    Raises:
        ConfigError: They do not say (or say both); the message asks for ``--engine``.
    """
    if command:
        words = shlex.split(command)
        named = engines_named(words)
        if len(named) == 1:
            return named.pop()
        if len(named) == 2:
            raise ConfigError(f"--command {command!r} names both vllm and sglang; add --engine vllm or --engine sglang")
        if not (words and Path(words[0]).name.startswith("python")):
            raise ConfigError(
                f"--command {command!r} does not say which engine it starts; add --engine vllm or --engine sglang"
            )
        python, option = words[0], "--command"
    else:
        option = "--python"
    assert python is not None
    found = _engines_importable(python, option)
    if len(found) == 1:
        return found.pop()
    if found:
        raise ConfigError(f"{option} {python} can import both vllm and sglang; add --engine vllm or --engine sglang")
    raise ConfigError(
        f"{option} {python} imports neither vllm nor sglang; install the engine there, "
        "or add --engine vllm|sglang (--engine sim for the simulator)"
    )


def engine_choice(engine: str | None, python: str | None, command: str | None) -> tuple[str, list[str]]:
    """(engine, first lines to print): ``--engine``, else what ``--python``/``--command`` run,
    else the simulator when nothing real was named — said in the run's first line."""
    if engine is not None and engine not in (*ADAPTERS, "sim", *(f"sim-{kind}" for kind in ADAPTERS)):
        raise ConfigError(f"--engine {engine!r} is not known; use vllm, sglang, sim (= sim-vllm) or sim-sglang")
    if engine is None:
        if python or command:
            chosen = infer_engine(python, command)
            return chosen, [
                f"engine: {chosen} (found from {'--command' if command else '--python'}; --engine overrides)"
            ]
        engine, why = "sim", "no --engine, --python or --command was given"
    else:
        why = f"--engine {engine}"
    if not engine.startswith("sim"):
        return engine, []
    ignored = [o for o, v in (("--python", python), ("--command", command)) if v]
    note = f"; {' and '.join(ignored)} ignored" if ignored else ""
    return engine, [
        f"{SIM_INTRO} ({why}{note}); for a real engine pass --engine vllm|sglang and --python. {report_sentence()}"
    ]


def engine_settings(engine: str, options: EngineOptions, fixed: dict[str, Any], env: dict[str, str]) -> EngineSettings:
    """The engine's validated settings: a real engine's model, Python or command and start-up
    timeout (scaled to the model), or the simulator's own command and settings."""
    model, python, command = options.model, options.python, options.command
    startup_timeout, api_key_env = options.startup_timeout, options.api_key_env
    env_str = dict(env)
    if engine.startswith("sim"):
        dialect = engine.partition("-")[2] or "vllm"
        if dialect not in ADAPTERS:
            raise ConfigError(f"--engine {engine!r}: the simulator speaks sim-vllm or sim-sglang")
        env_str = {**_sim_env(options), **env_str}
        return parse_model(
            EngineSettings,
            {
                "kind": dialect,
                "model": model or SIM_DEFAULT_MODEL,
                "command": _sim_command(dialect),
                "env": env_str,
                "fixed_flags": fixed,
                "startup_timeout_s": startup_timeout or 120.0,  # the sim starts in about a second
                "simulated": True,
                "api_key_env": api_key_env,
            },
            "--engine sim",
        )
    if engine not in ADAPTERS:
        raise ConfigError(f"--engine {engine!r} is not known; use vllm, sglang, sim (= sim-vllm) or sim-sglang")
    if not model:
        raise ConfigError("--model is required for a real engine (a local path or a model name)")
    return parse_model(
        EngineSettings,
        {
            "kind": engine,
            "model": model,
            "python": python,
            "command": shlex.split(command) if command else None,
            "env": env_str,
            "fixed_flags": fixed,
            "startup_timeout_s": startup_timeout or scaled_startup_timeout(model),
            "api_key_env": api_key_env,
        },
        "engine options",
    )
