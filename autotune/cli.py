"""The `autotune` command line. Commands parse and validate their options, call one library
function and render the result; every AutotuneError becomes one line on stderr (exit 2 for
bad input, 1 otherwise), with the traceback only under --debug."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import optuna
import typer
import yaml
from rich.console import Console
from rich.table import Table

from autotune import __version__
from autotune.bench.capacity import search_capacity
from autotune.bench.loadgen import BenchProgress, run_workload_sync
from autotune.bench.summary import capacity_rows, result_rows
from autotune.config import (
    EngineSettings,
    Objective,
    ObjectiveTerm,
    SearchSpace,
    StudySettings,
    Workload,
    load_yaml,
    parse_model,
)
from autotune.errors import AutotuneError, ConfigError
from autotune.report.export import FORMATS, LaunchRecord, render
from autotune.report.html import write_report
from autotune.report.live import LiveProgress
from autotune.report.table import trials_frame
from autotune.search.storage import best_trial, default_storage_url, load_study, objective_summary, pareto_front
from autotune.search.tune import TuneJob, join_job, run_study, scaled_startup_timeout

app = typer.Typer(
    help="Closed-loop auto-tuner for LLM serving engines (vLLM, SGLang): launches the engine with "
    "candidate flags, drives your workload at it, lets Optuna pick the next flags, and exports "
    "the winner as a launch script.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
# Lines are never folded at the terminal width: logs of overnight runs get grepped (tables still fit it).
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)
_state = {"debug": False}

PACKAGE_ROOT = Path(__file__).resolve().parent
SHIPPED = PACKAGE_ROOT.parent  # search_spaces/ and workloads/ sit beside the package in a checkout
SIM_DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_SPACE = {"vllm": "vllm-default", "sglang": "sglang-throughput"}


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        console.print(f"autotune {__version__}")
        raise typer.Exit()
    _state["debug"] = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    optuna.logging.set_verbosity(optuna.logging.DEBUG if debug else optuna.logging.WARNING)


# ------------------------------------------------------------------------------- option parsing
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str, option: str) -> float:
    """'8h', '30m', '90s', '3600' → seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"{option} {text!r} is not a duration; use e.g. 8h, 45m, 900s")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def parse_pairs(pairs: list[str], option: str) -> dict[str, Any]:
    """KEY=VALUE options; values are read as YAML scalars (64 → int, true → bool)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{option} {pair!r} must look like KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value) if value else ""
    return out


def parse_parallel(text: str) -> int | str:
    """'auto' or a positive number of trials at once."""
    if text.strip().lower() == "auto":
        return "auto"
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError(f"--parallel {text!r} must be auto or a number ≥ 1")
    return int(text)


def parse_gpus(text: str | None) -> list[int] | None:
    """'0,1,4,5' or '0-3,6' → NVML indices."""
    if text is None:
        return None
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ConfigError(f"--gpus {text!r}: use NVML indices such as 0,1,4,5 or 0-3")
        out.extend(range(int(low), int(high if sep else low) + 1))
    if not out:
        raise ConfigError("--gpus is empty; name at least one GPU, e.g. --gpus 0")
    return sorted(set(out))


def _resolve_file(path: str, folder: str) -> Path:
    """A name like `chat` means the shipped workloads/chat.yaml; anything else is a path."""
    p = Path(path)
    if p.exists() or p.suffix in (".yaml", ".yml") or "/" in path:
        return p
    return SHIPPED / folder / f"{path}.yaml"


def _engine_settings(
    engine: str,
    model: str | None,
    python: str | None,
    command: str | None,
    fixed: dict[str, Any],
    env: dict[str, Any],
    startup_timeout: float | None,
    sim_gpu: str,
    sim_speedup: float,
    api_key_env: str | None,
) -> EngineSettings:
    env_str = {k: str(v) for k, v in env.items()}
    if engine.startswith("sim"):
        dialect = engine.partition("-")[2] or "vllm"
        if dialect not in ("vllm", "sglang"):
            raise ConfigError(f"--engine {engine!r}: the simulator speaks sim-vllm or sim-sglang")
        env_str = {"AUTOTUNE_SIM_GPU": sim_gpu, "AUTOTUNE_SIM_SPEEDUP": str(sim_speedup), **env_str}
        return parse_model(
            EngineSettings,
            {
                "kind": dialect,
                "model": model or SIM_DEFAULT_MODEL,
                "command": [sys.executable, "-m", "autotune.sim", dialect],
                "env": env_str,
                "fixed_flags": fixed,
                "startup_timeout_s": startup_timeout or 120.0,  # the sim starts in about a second
                "simulated": True,
                "api_key_env": api_key_env,
            },
            "--engine sim",
        )
    if engine not in ("vllm", "sglang"):
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


def _fail(err: AutotuneError) -> typer.Exit:
    if _state["debug"]:
        raise err
    err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
    return typer.Exit(err.exit_code)


# ------------------------------------------------------------------------------------ commands
@app.command()
def tune(
    study: Annotated[str, typer.Option("--study", "-s", help="Study name; the same name resumes it.")] = "demo",
    engine: Annotated[str, typer.Option(help="vllm | sglang | sim (simulated vLLM) | sim-sglang.")] = "sim",
    model: Annotated[
        str | None, typer.Option(help="Model path or name (sim: a preset, e.g. meta-llama/Llama-3.1-8B-Instruct).")
    ] = None,
    python: Annotated[
        str | None, typer.Option(help="The engine venv's Python; launches `PYTHON -m <engine module>`.")
    ] = None,
    command: Annotated[
        str | None, typer.Option(help="Full launch command before the flags, e.g. 'vllm serve'.")
    ] = None,
    space: Annotated[
        str | None,
        typer.Option(help="Search-space YAML (or a shipped name). Default: vllm-default / sglang-throughput."),
    ] = None,
    workload: Annotated[str, typer.Option(help="Workload YAML (or a shipped name, e.g. chat).")] = "chat",
    trials: Annotated[
        int, typer.Option(min=1, help="Search trials to finish (baseline and validation come on top).")
    ] = 20,
    time_budget: Annotated[str | None, typer.Option(help="Stop starting trials after this long, e.g. 8h.")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Benchmark runs per engine launch (median kept).")] = 1,
    finalists: Annotated[int, typer.Option(min=0, help="Top trials re-run with fresh engines.")] = 2,
    validation_runs: Annotated[int, typer.Option(min=0, help="Fresh-engine re-runs per finalist.")] = 2,
    fixed: Annotated[list[str] | None, typer.Option(help="KEY=VALUE flag set on every trial (repeatable).")] = None,
    env: Annotated[list[str] | None, typer.Option(help="KEY=VALUE environment for the engine (repeatable).")] = None,
    storage: Annotated[
        str | None, typer.Option(help="Optuna storage URL (default: SQLite in results/<study>/).")
    ] = None,
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
    method: Annotated[str, typer.Option(help="staged (the articles' method) | search (plain Optuna).")] = "staged",
    memory_probe: Annotated[str, typer.Option(help="Memory-edge probe: step (0.02 steps) | bisect.")] = "step",
    sampler: Annotated[str, typer.Option(help="tpe | random | nsga2 (multi-objective evolution).")] = "tpe",
    seed: Annotated[int | None, typer.Option(help="Sampler seed.")] = None,
    startup_timeout: Annotated[
        float | None, typer.Option(help="Seconds an engine may take to become ready (default: scaled to the model).")
    ] = None,
    api_key_env: Annotated[str | None, typer.Option(help="Env var holding the engine API key (never stored).")] = None,
    sim_gpu: Annotated[str, typer.Option(help="Simulator GPU preset.")] = "H100-80GB",
    sim_speedup: Annotated[float, typer.Option(help="Simulator time compression (modelled time / wall time).")] = 20.0,
    parallel: Annotated[
        str, typer.Option(help="Trials at once on this box: N, or auto (one per free GPU group; no GPU: cores/2).")
    ] = "1",
    gpus: Annotated[str | None, typer.Option(help="GPUs trials may use (NVML indices), e.g. 0,1,4,5.")] = None,
    heartbeat: Annotated[
        int, typer.Option(min=1, help="Seconds between heartbeats on a shared storage; 3 missed = worker dead.")
    ] = 30,
    bench_client: Annotated[
        str | None,
        typer.Option(help="Measuring instrument, overriding the workload's: autotune | vllm-bench | sglang-bench."),
    ] = None,
) -> None:
    """Create or resume a study: baseline, the tuning stages (or a plain search), then validation.

    Re-running the same command resumes the study where it stopped. Boxes that run it with the
    same --study and a shared --storage (PostgreSQL, MySQL) work on the study together."""
    _terminate_as_interrupt()
    try:
        settings = _engine_settings(
            engine,
            model,
            python,
            command,
            parse_pairs(fixed or [], "--fixed"),
            parse_pairs(env or [], "--env"),
            startup_timeout,
            sim_gpu,
            sim_speedup,
            api_key_env,
        )
        space_path = _resolve_file(space or DEFAULT_SPACE[settings.kind], "search_spaces")
        job = TuneJob(
            engine=settings,
            space=load_yaml(space_path, SearchSpace),
            workload=_with_client(load_yaml(_resolve_file(workload, "workloads"), Workload), bench_client),
            study=parse_model(
                StudySettings,
                {
                    "name": study,
                    "results_dir": results,
                    "storage": storage,
                    "trials": trials,
                    "time_budget_s": parse_duration(time_budget, "--time-budget") if time_budget else None,
                    "repeats": repeats,
                    "finalists": finalists,
                    "validation_runs": validation_runs,
                    "sampler": sampler,
                    "seed": seed,
                    "method": method,
                    "memory_probe": memory_probe,
                    "parallel": parse_parallel(parallel),
                    "gpus": parse_gpus(gpus),
                    "heartbeat_s": heartbeat,
                },
                "tune options",
            ),
        )
    except AutotuneError as err:
        raise _fail(err) from None
    _run_job(job)


def _with_client(workload: Workload, client: str | None) -> Workload:
    """The workload measured with ``client`` (``--bench-client``), validated like the YAML field."""
    if client is None:
        return workload
    return parse_model(Workload, {**workload.model_dump(exclude_unset=True), "client": client}, "--bench-client")


def _run_job(job: TuneJob) -> None:
    """Run the study, then print the winner and write its launch script."""
    try:
        with LiveProgress(console, simulated=job.engine.simulated) as progress:
            best = run_study(job, progress)
    except AutotuneError as err:
        raise _fail(err) from None
    except KeyboardInterrupt:
        err_console.print("interrupted: engines torn down, study saved; run the same command to resume")
        raise typer.Exit(130) from None
    if job.study.method == "memory":
        return
    if best is None:
        console.print("no trial met the SLOs; see `autotune status` for what failed and why")
        raise typer.Exit(1)
    finished = load_study(job.study.name, job.storage_url)
    _print_best(finished, best)
    console.print(f"launch script: {_export_trial(finished, best, 'bash', None)}")


@app.command()
def worker(
    study: Annotated[str, typer.Option("--study", "-s", help="Name of the study to join.")],
    storage: Annotated[str, typer.Option(help="The study's shared storage URL, e.g. postgresql://...")],
    python: Annotated[str | None, typer.Option(help="This box's engine Python (default: as stored).")] = None,
    command: Annotated[str | None, typer.Option(help="This box's launch command (default: as stored).")] = None,
    env: Annotated[list[str] | None, typer.Option(help="KEY=VALUE environment for the engine (repeatable).")] = None,
    results: Annotated[Path, typer.Option(help="Results folder on this box (trial logs stay here).")] = Path(
        "results"
    ),
    parallel: Annotated[str, typer.Option(help="Trials at once on this box: N or auto.")] = "1",
    gpus: Annotated[str | None, typer.Option(help="GPUs trials may use (NVML indices), e.g. 0,1,4,5.")] = None,
    heartbeat: Annotated[int, typer.Option(min=1, help="Seconds between heartbeats.")] = 30,
    sim_gpu: Annotated[str, typer.Option(help="Simulator GPU preset (simulated studies).")] = "H100-80GB",
    sim_speedup: Annotated[float, typer.Option(help="Simulator time compression (simulated studies).")] = 20.0,
) -> None:
    """Join a study that `autotune tune` started on another box: engine, space, workload and
    settings come from the study; only where this box runs trials is given here."""
    _terminate_as_interrupt()
    try:
        local_env = {k: str(v) for k, v in parse_pairs(env or [], "--env").items()}
        engine: dict[str, Any] = {"env": local_env}
        stored = join_job(study, storage, engine={}, study={}).engine
        if stored.simulated:
            sim_env = {"AUTOTUNE_SIM_GPU": sim_gpu, "AUTOTUNE_SIM_SPEEDUP": str(sim_speedup)}
            engine = {"env": {**sim_env, **local_env}, "command": [sys.executable, "-m", "autotune.sim", stored.kind]}
        if python is not None:
            engine.update(python=python, command=None)
        if command is not None:
            engine["command"] = shlex.split(command)
        job = join_job(
            study,
            storage,
            engine=engine,
            study={
                "results_dir": results,
                "parallel": parse_parallel(parallel),
                "gpus": parse_gpus(gpus),
                "heartbeat_s": heartbeat,
            },
        )
    except AutotuneError as err:
        raise _fail(err) from None
    _run_job(job)


@app.command("probe-memory")
def probe_memory(
    study: Annotated[str, typer.Option("--study", "-s", help="Study name; the same name resumes it.")] = "memory",
    engine: Annotated[str, typer.Option(help="vllm | sglang | sim | sim-sglang.")] = "sim",
    model: Annotated[str | None, typer.Option(help="Model path or name.")] = None,
    python: Annotated[str | None, typer.Option(help="The engine venv's Python.")] = None,
    command: Annotated[str | None, typer.Option(help="Full launch command before the flags.")] = None,
    space: Annotated[str | None, typer.Option(help="Search space holding memory_fraction.")] = None,
    workload: Annotated[str, typer.Option(help="Workload whose peak shape loads each probe.")] = "chat",
    probes: Annotated[int, typer.Option(min=1, help="Most engine launches to spend.")] = 8,
    memory_probe: Annotated[str, typer.Option(help="step (0.02 steps up to failure) | bisect.")] = "step",
    fixed: Annotated[list[str] | None, typer.Option(help="KEY=VALUE flag set on every probe.")] = None,
    env: Annotated[list[str] | None, typer.Option(help="KEY=VALUE environment for the engine.")] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
    sim_gpu: Annotated[str, typer.Option(help="Simulator GPU preset.")] = "H100-80GB",
    sim_speedup: Annotated[float, typer.Option(help="Simulator time compression.")] = 20.0,
) -> None:
    """Only the memory edge: the highest memory fraction that survives the workload's peak load."""
    tune(
        study=study,
        engine=engine,
        model=model,
        python=python,
        command=command,
        space=space,
        workload=workload,
        trials=probes,
        time_budget=None,
        repeats=1,
        finalists=0,
        validation_runs=0,
        fixed=fixed,
        env=env,
        storage=storage,
        results=results,
        method="memory",
        memory_probe=memory_probe,
        sampler="tpe",
        seed=None,
        startup_timeout=None,
        api_key_env=None,
        sim_gpu=sim_gpu,
        sim_speedup=sim_speedup,
    )
    st = _open_existing(study, storage, results)
    state = st.user_attrs.get("stage.memory_edge") or {}
    if state.get("skipped"):
        console.print(f"memory edge: skipped — {state['skipped']}")
        raise typer.Exit(1)
    console.print(f"memory edge: {state.get('edge')} ({state.get('note', '')})")
    console.print("probes: " + ", ".join(f"{k} {v}" for k, v in sorted((state.get("results") or {}).items())))


def _terminate_as_interrupt() -> None:
    """SIGTERM/SIGHUP (kill, a closed terminal) take the Ctrl-C path: engines torn down, study kept."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def _objective_metric(study: optuna.Study) -> str:
    return str(study.user_attrs.get("config", {}).get("workload", {}).get("objective", {}).get("metric", "objective"))


def _print_best(study: optuna.Study, best: optuna.trial.FrozenTrial) -> None:
    value, note = objective_summary(study, best)
    metric = _objective_metric(study)
    sim = " (modelled by the simulator)" if _engine_config(study).get("simulated") else ""
    console.print(
        f"best trial {best.number} ({best.user_attrs.get('stage')}): {metric} {value:,.1f}"
        + (f" ({note})" if note else "")
        + sim,
        highlight=False,
    )
    console.print("flags: " + (_flags_text(best.user_attrs.get("flags", {})) or "(engine defaults)"), highlight=False)


def _flags_text(flags: dict[str, Any]) -> str:
    words = []
    for flag, value in flags.items():
        if value is True:
            words.append(flag)
        elif isinstance(value, (dict, list)):  # JSON-valued flags (--speculative-config), as the engine reads them
            words.append(f"{flag} {shlex.quote(json.dumps(value, separators=(',', ':')))}")
        elif value is not False and value is not None:
            words.append(f"{flag} {shlex.quote(str(value))}")
    return " ".join(words)


def _open_existing(study: str, storage: str | None, results: Path) -> optuna.Study:
    url = storage or default_storage_url(results, study)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        raise ConfigError(f"no study {study!r} under {results}/; run `autotune tune --study {study}` first")
    return load_study(study, url)


@app.command()
def status(
    study: Annotated[str, typer.Argument(help="Study name.")] = "demo",
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
) -> None:
    """Trials so far, the best feasible trial, and failures by outcome."""
    try:
        st = _open_existing(study, storage, results)
    except AutotuneError as err:
        raise _fail(err) from None
    trials = st.get_trials(deepcopy=False)
    outcomes = Counter(t.user_attrs.get("outcome", t.state.name.lower()) for t in trials)
    stages = Counter(t.user_attrs.get("stage", "?") for t in trials)
    console.print(f"study {study}: {len(trials)} trials ({', '.join(f'{k} {v}' for k, v in stages.items())})")
    console.print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    table = Table("#", "stage", "outcome", "output tok/s", "p95 TTFT ms", "p95 TPOT ms", "flags / reason")
    for t in trials:
        m = t.user_attrs.get("metrics") or {}
        detail = " ".join(f"{k}={v}" for k, v in (t.user_attrs.get("params") or {}).items())
        if not m:
            detail = (t.user_attrs.get("reason") or detail)[:100]
        table.add_row(
            str(t.number),
            t.user_attrs.get("stage", ""),
            t.user_attrs.get("outcome", t.state.name.lower()),
            f"{m['output_throughput']:,.1f}" if m else "",
            f"{m['p95_ttft_ms']:,.0f}" if m else "",
            f"{m['p95_tpot_ms']:,.1f}" if m else "",
            detail,
        )
    console.print(table)
    if len(st.directions) > 1:
        front = pareto_front(st)
        console.print(
            "Pareto front (feasible, non-dominated): "
            + ", ".join(f"#{t.number} " + "/".join(f"{v:,.1f}" for v in t.values) for t in front)
            if front
            else "Pareto front: empty"
        )
    best = best_trial(st)
    if best is None:
        console.print("best: none yet (no trial served the workload within its SLOs)")
    else:
        _print_best(st, best)


def _engine_config(st: optuna.Study) -> dict[str, Any]:
    return dict(st.user_attrs.get("config", {}).get("engine", {}))


def _export_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial, fmt: str, output: Path | None) -> Path:
    ua = trial.user_attrs
    if not ua.get("argv"):
        raise ConfigError(f"trial {trial.number} has no recorded launch (outcome {ua.get('outcome')}); pick another")
    engine_cfg = _engine_config(study)
    value, note = objective_summary(study, trial)
    summary = f"outcome {ua.get('outcome')}, {_objective_metric(study)} {value:,.2f}" if value is not None else ""
    summary += f" ({note})" if note else ""
    rec = LaunchRecord(
        study=study.study_name,
        trial=trial.number,
        argv=ua["argv"],
        env=ua.get("env", {}),
        flags=ua.get("flags", {}),
        metrics=ua.get("metrics", {}),
        summary=summary,
        simulated=bool(engine_cfg.get("simulated")),
        engine=str(engine_cfg.get("kind", "vllm")),
        engine_version=(ua.get("facts") or {}).get("engine_version"),
        engine_args=ua.get("engine_args"),
    )
    suffix, text = render(rec, fmt)
    results_dir = Path(ua.get("trial_dir", ".")).parent.parent if ua.get("trial_dir") else Path(".")
    if not results_dir.is_dir():  # the trial ran on another box of a shared study
        results_dir = Path(".")
    path = output or results_dir / f"launch-trial{trial.number}{suffix}"
    path.write_text(text)
    if fmt == "bash":
        path.chmod(0o755)
    return path


@app.command()
def export(
    study: Annotated[str, typer.Argument(help="Study name.")] = "demo",
    trial: Annotated[int | None, typer.Option(help="Trial number (default: the validated best).")] = None,
    fmt: Annotated[str, typer.Option("--format", help=f"One of: {', '.join(FORMATS)}.")] = "bash",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write.")] = None,
    pareto: Annotated[
        bool, typer.Option(help="Write the Pareto front (JSON: each point's trial, values, flags).")
    ] = False,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
) -> None:
    """Write the best (or a chosen) trial as a launch script with the trial's exact argv and env.

    In a multi-objective study, --pareto writes the whole front; export any point with --trial N."""
    try:
        st = _open_existing(study, storage, results)
        if pareto:
            console.print(str(_export_front(st, output or results / study / "pareto.json")))
            return
        if trial is None:
            chosen = best_trial(st)
            if chosen is None:
                raise ConfigError(f"study {study!r} has no feasible trial yet; pass --trial N to export another")
        else:
            found = [t for t in st.get_trials(deepcopy=False) if t.number == trial]
            if not found:
                raise ConfigError(f"study {study!r} has no trial {trial}; see `autotune status {study}`")
            chosen = found[0]
        path = _export_trial(st, chosen, fmt, output)
    except AutotuneError as err:
        raise _fail(err) from None
    console.print(str(path))


def _export_front(st: optuna.Study, path: Path) -> Path:
    metrics = [t.metric for t in _objective_terms(st)]
    points = [
        {
            "trial": t.number,
            "values": dict(zip(metrics, t.values, strict=False)),
            "flags": t.user_attrs.get("flags", {}),
            "export": f"autotune export {st.study_name} --trial {t.number}",
        }
        for t in pareto_front(st)
    ]
    path.write_text(json.dumps({"study": st.study_name, "objectives": metrics, "front": points}, indent=2) + "\n")
    return path


def _objective_terms(st: optuna.Study) -> list[ObjectiveTerm]:
    objective = st.user_attrs.get("config", {}).get("workload", {}).get("objective", {})
    return parse_model(Objective, objective, "study config").terms


@app.command()
def trials(
    study: Annotated[str, typer.Argument(help="Study name.")] = "demo",
    csv: Annotated[Path | None, typer.Option(help="Also write every column to this CSV file.")] = None,
    parquet: Annotated[Path | None, typer.Option(help="Also write every column to this Parquet file.")] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
) -> None:
    """One row per trial: stage, outcome, flags, key metrics, engine facts (table, CSV, Parquet)."""
    try:
        frame = trials_frame(_open_existing(study, storage, results))
        if parquet is not None:
            try:
                frame.to_parquet(parquet, index=False)
            except ImportError:
                raise ConfigError("--parquet needs pyarrow: pip install pyarrow (or use --csv)") from None
    except AutotuneError as err:
        raise _fail(err) from None
    if csv is not None:
        frame.to_csv(csv, index=False)
    shown = [c for c in frame.columns if c.startswith("param.")] + ["output_throughput", "p95_ttft_ms", "p95_tpot_ms"]
    table = Table("trial", "stage", "outcome", *[c.removeprefix("param.") for c in shown])
    for r in frame.to_dict("records"):
        table.add_row(str(r["trial"]), str(r["stage"]), str(r["outcome"]), *[_cell(r.get(c)) for c in shown])
    console.print(table)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None or NaN
        return ""
    return f"{value:,.1f}" if isinstance(value, float) else str(value)


@app.command()
def report(
    study: Annotated[str, typer.Argument(help="Study name.")] = "demo",
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    open_page: Annotated[bool, typer.Option("--open", help="Open the HTML report in the default browser.")] = False,
) -> None:
    """Write results/<study>/report.html (interactive plots, opens offline) and report.md (to paste)."""
    try:
        html_path, md_path = write_report(_open_existing(study, storage, results), results / study)
    except AutotuneError as err:
        raise _fail(err) from None
    for path in (html_path, md_path):
        console.print(str(path), soft_wrap=True, markup=False, highlight=False)
    if open_page:
        typer.launch(html_path.resolve().as_uri())


@app.command()
def bench(
    url: Annotated[str, typer.Option(help="Server root of any OpenAI-compatible API, e.g. http://127.0.0.1:8000.")],
    workload: Annotated[str, typer.Option(help="Workload YAML (or a shipped name, e.g. chat).")] = "chat",
    model: Annotated[str | None, typer.Option(help="Model id (default: the first the server lists).")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="Env var holding the server's API key.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the result JSON here.")] = None,
    capacity: Annotated[
        bool, typer.Option(help="Search the highest request rate (or concurrency) whose SLOs hold.")
    ] = False,
    workers: Annotated[int | None, typer.Option(min=1, help="Client processes (default: by load).")] = None,
) -> None:
    """Run one workload against an already running server, print the result and optionally save it
    (vllm bench serve's JSON keys)."""
    try:
        w = load_yaml(_resolve_file(workload, "workloads"), Workload)
        key = os.environ.get(api_key_env) if api_key_env else None
        if api_key_env and key is None:
            raise ConfigError(f"--api-key-env {api_key_env}: that environment variable is not set")
        with console.status(f"{w.name} against {url}") as status:

            def show(p: BenchProgress) -> None:
                status.update(f"{w.name} {p.phase}: {p.completed}/{p.total} requests, {p.output_throughput:,.0f} tok/s")

            if capacity:
                found = search_capacity(
                    url,
                    w,
                    model=model,
                    api_key=key,
                    workers=workers,
                    on_run=lambda r: status.update(f"{w.name}: level {r.level:g} {'held' if r.passed else 'missed'}"),
                )
                data = found.to_json()
            else:
                result = run_workload_sync(url, w, model=model, api_key=key, workers=workers, on_progress=show)
                data = result.to_json(detailed=True)
    except AutotuneError as err:
        raise _fail(err) from None
    if capacity:
        header, rows = capacity_rows(found)
        table = Table(*header, title=f"capacity search: {w.name}")
        for row in rows:
            table.add_row(*row)
        console.print(table)
        unit = "req/s" if found.dimension == "request_rate" else "concurrent requests"
        console.print(f"highest load meeting the SLOs: {found.value:,.2f} {unit} ({found.stop_reason})")
    else:
        table = Table("metric", "value", title=f"{w.name}: {result.model}")
        for label, value in result_rows(result):
            table.add_row(label, value)
        console.print(table)
    if output is not None:
        output.write_text(json.dumps(data, indent=2, default=str) + "\n")
        console.print(str(output), soft_wrap=True, markup=False, highlight=False)


@app.command("make-tiny-model")
def make_tiny_model(
    out: Annotated[Path, typer.Argument(help="Folder to write the model into.")],
    python: Annotated[
        str, typer.Option(help="A Python with torch, transformers and tokenizers (the engine's venv).")
    ] = sys.executable,
    seed: Annotated[int, typer.Option(help="Seed for weights and tokenizer training.")] = 0,
) -> None:
    """Write a tiny random-weight Llama (+ trained tokenizer and chat template) for CPU tests.

    Runs under the engine's Python, since that is where torch lives; no network needed."""
    script = PACKAGE_ROOT / "tinymodel.py"
    proc = subprocess.run([python, str(script), str(out), "--seed", str(seed)], check=False)
    if proc.returncode != 0:
        err_console.print(
            f"[bold red]error:[/] tiny model generation failed (exit {proc.returncode}); "
            f"check that {python} has torch, transformers and tokenizers"
        )
        raise typer.Exit(1)
    console.print(str(out))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
