"""The `autotune` command line. Commands parse their options, build a job, call one library
function and print its result; every AutotuneError becomes one line on stderr (exit 2 for bad
input, 1 otherwise), with the traceback only under --debug."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import optuna
import typer
from typer.core import TyperGroup

from autotune import __version__
from autotune.catalog import PACKAGE_ROOT, resolve_file
from autotune.config import Workload, load_yaml
from autotune.errors import AutotuneError, ConfigError
from autotune.helpstyle import flags_show_no_value_type
from autotune.jobs import EngineOptions, joined_job, recheck_source, tune_job
from autotune.report.bench import api_key, measure, write_result
from autotune.report.console import console, err_console
from autotune.report.export import FORMATS
from autotune.report.files import write_csv, write_front, write_parquet
from autotune.report.html import write_report
from autotune.report.launch import chosen_trial, export_trial
from autotune.report.recheck import print_recheck_verdict, recheck_plan, rounds_text
from autotune.report.run import print_closing, print_memory_edge, run_live
from autotune.report.status import TRIALS_HELP, print_status, print_trials
from autotune.report.table import trials_frame
from autotune.runtime import interrupt
from autotune.search import probe
from autotune.search.job import TuneJob
from autotune.search.progress import Progress
from autotune.search.recheck import run_recheck
from autotune.search.studies import open_named, study_folder
from autotune.search.tune import run_study

flags_show_no_value_type()
T = TypeVar("T")


class _OneLineErrors(TyperGroup):
    """Every command's AutotuneError ends as one line on stderr and its exit code: caught here,
    once, for all commands (``--debug`` lets it through with its traceback)."""

    def invoke(self, ctx: Any) -> Any:  # typer's own click Context
        try:
            return super().invoke(ctx)
        except AutotuneError as err:
            raise _fail(err) from None


app = typer.Typer(
    cls=_OneLineErrors,
    help="Closed-loop auto-tuner for LLM serving engines (vLLM, SGLang): launches the engine with "
    "candidate flags, drives your workload at it, lets Optuna pick the next flags, and exports "
    "the winner as a launch script.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
_state = {"debug": False}


def _print_version(value: bool) -> None:
    if value:
        console.print(f"autotune {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs.")] = False,
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", callback=_print_version, is_eager=True),
    ] = False,
) -> None:
    _state["debug"] = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    optuna.logging.set_verbosity(optuna.logging.DEBUG if debug else optuna.logging.WARNING)


def _fail(err: AutotuneError) -> typer.Exit:
    if _state["debug"]:
        raise err
    err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
    return typer.Exit(err.exit_code)


# ------------------------------------------------------------------------------------ commands
@app.command()
def tune(
    study: Annotated[str, typer.Option("--study", "-s", help="Study name; the same name resumes it.")] = "demo",
    engine: Annotated[
        str | None,
        typer.Option(
            help="vllm | sglang | sim (simulated vLLM) | sim-sglang. Default: the engine --python/--command "
            "runs; the simulator only when neither is given."
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model path or name (sim: a preset, e.g. meta-llama/Llama-3.1-8B-Instruct).")
    ] = None,
    python: Annotated[
        str | None, typer.Option(help="The engine venv's Python; runs `PYTHON -m <engine module>`.")
    ] = None,
    command: Annotated[
        str | None, typer.Option(help="Full launch command before the flags, e.g. 'vllm serve'.")
    ] = None,
    space: Annotated[
        str | None,
        typer.Option(help="Search-space YAML (or a shipped name). Default: vllm-default / sglang-throughput."),
    ] = None,
    workload: Annotated[str, typer.Option(help="Workload YAML (or a shipped name, e.g. chat).")] = "chat",
    trials: Annotated[int, typer.Option(min=1, help=TRIALS_HELP)] = 20,
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
    host_memory_margin: Annotated[
        float, typer.Option(min=0, help="GiB of available RAM a CPU engine's memory probes leave to the host.")
    ] = 2.0,
    baseline: Annotated[
        bool, typer.Option(help="Run the engine's defaults first (every gain is measured against them).")
    ] = True,
    host_check: Annotated[bool, typer.Option(help="CPU engine: re-run a run others took its cores from.")] = True,
    noise_runs: Annotated[int, typer.Option(min=0, help="Defaults re-launched after the baseline (the noise).")] = 1,
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
    weight_cache: Annotated[str, typer.Option(help="Weights held by a daemon across trials: auto|on|off.")] = "auto",
    early_stop: Annotated[bool, typer.Option(help="End a search trial's run once it cannot matter.")] = True,
    stop_when_done: Annotated[bool, typer.Option(help="End the search once more trials stop paying.")] = True,
    twin: Annotated[bool, typer.Option(help="Predict each search trial before it runs; record the error.")] = True,
    screen: Annotated[bool, typer.Option(help="Skip a search trial the twin shows cannot win (needs --twin).")] = True,
    stable_within: Annotated[float, typer.Option(min=0, max=0.5, help="Real runs: throughput ±this (0: any).")] = 0.05,
) -> None:
    """Create or resume a study: baseline, the tuning stages (or a plain search), then validation. The
    same command resumes it; boxes running it with one --study and --storage share the study."""
    _terminate_as_interrupt()
    options = EngineOptions(
        engine, model, python, command, fixed or [], env or [], startup_timeout, api_key_env, sim_gpu, sim_speedup
    )
    settings = dict(name=study, results_dir=results, storage=storage, trials=trials, time_budget_s=time_budget)
    settings.update(repeats=repeats, finalists=finalists, validation_runs=validation_runs, sampler=sampler, seed=seed)
    settings.update(method=method, memory_probe=memory_probe, host_memory_margin_gib=host_memory_margin)
    settings.update(baseline=baseline, noise_runs=noise_runs, parallel=parallel, gpus=gpus, heartbeat_s=heartbeat)
    settings.update(weight_cache=weight_cache, judge_host=host_check, early_stop=early_stop)
    settings.update(stop_when_done=stop_when_done, stable_within=stable_within or None, twin=twin, screen=screen)
    job, intro = tune_job(options, space, workload, settings, client=bench_client)
    _run_job(job, intro)


def _run_job(job: TuneJob, intro: list[str]) -> None:
    """Run the study, then say how it ended (``report/run.py``)."""
    finished, best, elapsed = _live(job, intro, lambda progress: run_study(job, progress))
    if code := print_closing(job, finished, best, elapsed):
        raise typer.Exit(code)


def _live(
    job: TuneJob, intro: list[str], body: Callable[[Progress], T], plan: str | None = None
) -> tuple[optuna.Study, T, float]:
    try:
        return run_live(job, intro, body, plan=plan)
    except KeyboardInterrupt:
        interrupt.acknowledge()
        err_console.print("interrupted: engines torn down, study saved; run the same command to resume")
        raise typer.Exit(130) from None


@app.command()
def worker(
    study: Annotated[str, typer.Option("--study", "-s", help="Name of the study to join.")],
    storage: Annotated[str, typer.Option(help="The study's shared storage URL, e.g. postgresql://...")],
    python: Annotated[str | None, typer.Option(help="This box's engine Python (default: as stored).")] = None,
    command: Annotated[str | None, typer.Option(help="This box's launch command (default: as stored).")] = None,
    env: Annotated[list[str] | None, typer.Option(help="KEY=VALUE environment for the engine (repeatable).")] = None,
    results: Annotated[Path, typer.Option(help="Results folder on this box (trial logs stay here).")] = Path("results"),
    parallel: Annotated[str, typer.Option(help="Trials at once on this box: N or auto.")] = "1",
    gpus: Annotated[str | None, typer.Option(help="GPUs trials may use (NVML indices), e.g. 0,1,4,5.")] = None,
    heartbeat: Annotated[int, typer.Option(min=1, help="Seconds between heartbeats.")] = 30,
    sim_gpu: Annotated[str, typer.Option(help="Simulator GPU preset (simulated studies).")] = "H100-80GB",
    sim_speedup: Annotated[float, typer.Option(help="Simulator time compression (simulated studies).")] = 20.0,
) -> None:
    """Join a study that `autotune tune` started on another box: engine, space, workload and
    settings come from the study; only where this box runs trials is given here."""
    _terminate_as_interrupt()
    options = EngineOptions(python=python, command=command, env=env or [], sim_gpu=sim_gpu, sim_speedup=sim_speedup)
    settings = {"results_dir": results, "parallel": parallel, "gpus": gpus, "heartbeat_s": heartbeat}
    job, intro = joined_job(study, storage, options, settings)
    _run_job(job, intro)


@app.command("probe-memory")
def probe_memory(
    study: Annotated[str, typer.Option("--study", "-s", help="Study name; the same name resumes it.")] = "memory",
    engine: Annotated[
        str | None,
        typer.Option(help="vllm | sglang | sim | sim-sglang. Default: what --python/--command runs, else sim."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model path or name.")] = None,
    python: Annotated[str | None, typer.Option(help="The engine venv's Python.")] = None,
    command: Annotated[str | None, typer.Option(help="Full launch command before the flags.")] = None,
    space: Annotated[str | None, typer.Option(help="Search space holding memory_fraction.")] = None,
    workload: Annotated[str, typer.Option(help="Workload whose peak shape loads each probe.")] = "chat",
    probes: Annotated[int, typer.Option(min=1, help="Most engine launches to spend.")] = 8,
    memory_probe: Annotated[str, typer.Option(help="step (0.02 steps up to failure) | bisect.")] = "step",
    host_memory_margin: Annotated[
        float, typer.Option(min=0, help="GiB of available RAM a CPU engine's probes leave to the host.")
    ] = 2.0,
    baseline: Annotated[
        bool, typer.Option(help="Run the engine's defaults first (on a CPU engine they may reserve most of the RAM).")
    ] = True,
    fixed: Annotated[list[str] | None, typer.Option(help="KEY=VALUE flag set on every probe.")] = None,
    env: Annotated[list[str] | None, typer.Option(help="KEY=VALUE environment for the engine.")] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
    sim_gpu: Annotated[str, typer.Option(help="Simulator GPU preset.")] = "H100-80GB",
    sim_speedup: Annotated[float, typer.Option(help="Simulator time compression.")] = 20.0,
) -> None:
    """Only the memory edge: the highest memory fraction that survives the workload's peak load."""
    _terminate_as_interrupt()
    options = EngineOptions(
        engine, model, python, command, fixed or [], env or [], sim_gpu=sim_gpu, sim_speedup=sim_speedup
    )
    settings = dict(name=study, results_dir=results, storage=storage, trials=probes, method="memory")
    settings.update(memory_probe=memory_probe, host_memory_margin_gib=host_memory_margin, baseline=baseline)
    job, intro = tune_job(options, space, workload, settings)
    job = probe.memory_job(job, probes)
    finished, found, elapsed = _live(job, intro, lambda progress: probe.probe_memory(job, progress))
    if code := print_memory_edge(job, finished, found, elapsed):
        raise typer.Exit(code)


@app.command()
def recheck(
    study: Annotated[str | None, typer.Argument(help="The tuned study (default: the only one in --results).")] = None,
    python: Annotated[str | None, typer.Option(help="The new release's Python; runs `PYTHON -m <module>`.")] = None,
    command: Annotated[str | None, typer.Option(help="The new release's launch command, e.g. 'vllm serve'.")] = None,
    env: Annotated[list[str] | None, typer.Option(help="KEY=VALUE for the new engine, over the launch's.")] = None,
    trial: Annotated[int | None, typer.Option(help="Trial to recheck (default: the validated best).")] = None,
    script: Annotated[Path | None, typer.Option(help="Recheck a script `export` wrote instead of a study.")] = None,
    workload: Annotated[str | None, typer.Option(help="With --script: the workload to measure on.")] = None,
    fixed: Annotated[list[str] | None, typer.Option(help="With --script: KEY=VALUE both sides keep.")] = None,
    rounds: Annotated[int, typer.Option(min=2, help="Rounds of tuned flags beside the new defaults.")] = 3,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL of the tuned study.")] = None,
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
) -> None:
    """A tuned launch on a new engine release: its flags and variables checked against the release
    (renamed, deprecated, removed, no longer read), then the translated flags beside the release's
    defaults, round by round on fresh engines; an updated script if they still win, else how to
    re-tune (exit 1)."""
    _terminate_as_interrupt()
    options = EngineOptions(python=python, command=command, fixed=fixed or [], env=env or [])
    launch, engine = recheck_source(
        study, options, trial=trial, script=script, workload=workload, storage=storage, results=results
    )
    plan = recheck_plan(launch, engine, rounds, storage=storage, results=results)
    if plan.tuned:
        finished, _, _ = _live(plan.job, [], lambda progress: run_recheck(plan, progress), plan=rounds_text(rounds))
        if code := print_recheck_verdict(plan, finished):
            raise typer.Exit(code)


def _terminate_as_interrupt() -> None:
    """SIGTERM/SIGHUP (kill, a closed terminal) take the Ctrl-C path: engines torn down, study
    kept; an interrupt swallowed by a finalizer is delivered again (``runtime/interrupt.py``)."""
    interrupt.install()


@app.command()
def status(
    study: Annotated[str | None, typer.Argument(help="Study name (default: the only study in --results).")] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
) -> None:
    """Trials so far, the best feasible trial, and failures by outcome."""
    print_status(open_named(study, storage, results))


@app.command()
def export(
    study: Annotated[str | None, typer.Argument(help="Study name (default: the only study in --results).")] = None,
    trial: Annotated[int | None, typer.Option(help="Trial number (default: the validated best).")] = None,
    fmt: Annotated[str | None, typer.Option("--format", help=f"One of: {', '.join(FORMATS)} (default bash).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write.")] = None,
    pareto: Annotated[
        bool, typer.Option(help="Write the Pareto front (JSON: each point's trial, values, flags).")
    ] = False,
    force: Annotated[bool, typer.Option(help="Export a trial that did not serve the workload too.")] = False,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
) -> None:
    """Write the best (or a chosen) trial as a launch script with the trial's exact argv and env.

    In a multi-objective study, --pareto writes the whole front; export any point with --trial N."""
    st = open_named(study, storage, results)
    folder = study_folder(st.study_name, storage, results)
    if pareto:
        if fmt not in (None, "json"):
            raise ConfigError(f"--pareto writes JSON only; drop --format {fmt} (or export one point with --trial N)")
        console.print(str(write_front(st, output or folder / "pareto.json")), highlight=False)
        return
    chosen = chosen_trial(st, trial)
    console.print(str(export_trial(st, chosen, fmt or "bash", output, folder, force=force)), highlight=False)


@app.command()
def trials(
    study: Annotated[str | None, typer.Argument(help="Study name (default: the only study in --results).")] = None,
    csv: Annotated[Path | None, typer.Option(help="Also write every column to this CSV file.")] = None,
    parquet: Annotated[Path | None, typer.Option(help="Also write every column to this Parquet file.")] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
) -> None:
    """One row per trial: stage, outcome, flags, key metrics, engine facts (table, CSV, Parquet)."""
    # Values as recorded: an integer knob stays 2048, a fraction 0.88 (no float column rounding).
    frame = trials_frame(open_named(study, storage, results), exact=True)
    for path, write in ((csv, write_csv), (parquet, write_parquet)):
        if path is not None:
            write(frame, path)
    print_trials(frame)
    for path in (csv, parquet):
        if path is not None:
            console.print(str(path), highlight=False, soft_wrap=True)


@app.command()
def report(
    study: Annotated[str | None, typer.Argument(help="Study name (default: the only study in --results).")] = None,
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    open_page: Annotated[bool, typer.Option("--open", help="Open the HTML report in the default browser.")] = False,
) -> None:
    """Write results/<study>/report.html (interactive plots, opens offline) and report.md (to paste)."""
    st = open_named(study, storage, results)
    html_path, md_path = write_report(st, results / st.study_name)
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
    _terminate_as_interrupt()
    try:
        w = load_yaml(resolve_file(workload, "workloads"), Workload)
        data, show = measure(url, w, model=model, api_key=api_key(api_key_env), workers=workers, capacity=capacity)
    except KeyboardInterrupt:
        interrupt.acknowledge()
        err_console.print("interrupted: the benchmark was stopped; no result written")
        interrupt.silence_stderr()  # the asyncio teardown logger was silenced with the signal
        raise typer.Exit(130) from None
    show()
    if output is not None:
        console.print(str(write_result(data, output)), soft_wrap=True, markup=False, highlight=False)


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
