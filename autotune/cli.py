"""The `autotune` command line. Commands parse and validate their options, call one library
function and render the result; every AutotuneError becomes one line on stderr (exit 2 for
bad input, 1 otherwise), with the traceback only under --debug."""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import optuna
import typer
from rich.box import SIMPLE_HEAD
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from typer.core import TyperGroup

from autotune import __version__
from autotune.bench.capacity import search_capacity
from autotune.bench.loadgen import BenchProgress, run_workload_sync
from autotune.bench.metrics import slo_violations
from autotune.bench.summary import capacity_rows, result_rows
from autotune.config import (
    BoolParam,
    CategoricalParam,
    EngineSettings,
    FloatParam,
    IntParam,
    Objective,
    ObjectiveTerm,
    Param,
    SearchSpace,
    StudySettings,
    Workload,
    load_yaml,
    parse_model,
)
from autotune.engines import ADAPTERS
from autotune.engines.base import canonical_flag
from autotune.errors import AutotuneError, ConfigError, EngineFailsRegardless, StudyError
from autotune.report.export import FORMATS
from autotune.report.html import write_report
from autotune.report.launch import engine_config, export_trial, objective_metric, value_summary
from autotune.report.live import LiveProgress
from autotune.report.summary import explain, format_value, launch_counts, no_winner_text
from autotune.report.table import parquet_ready, trials_frame
from autotune.runtime import interrupt
from autotune.search.storage import (
    best_trial,
    default_storage_url,
    load_study,
    pareto_front,
    validation,
)
from autotune.search.tune import TuneJob, join_job, run_study, scaled_startup_timeout


def _flags_show_no_value_type() -> None:
    """Typer's help prints a value type (``<bool>``) beside on/off flags, which reads as if the
    flag took a value (``--debug true``); flags take none, so their type column stays empty."""
    from typer.core import TyperOption

    original = getattr(TyperOption, "display_type_rich", None)
    if original is None or getattr(original, "_autotune_flags", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        if getattr(self, "is_flag", False):
            return None
        result: str | None = original(self, ctx)
        return result

    display_type_rich._autotune_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_show_no_value_type()


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
# Lines are never folded at the terminal width: logs of overnight runs get grepped (tables still fit it).
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)
_state = {"debug": False}

PACKAGE_ROOT = Path(__file__).resolve().parent
SHIPPED = PACKAGE_ROOT.parent  # search_spaces/ and workloads/ sit beside the package in a checkout
SIM_DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_SPACE = {"vllm": "vllm-default", "sglang": "sglang-throughput"}


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


# ------------------------------------------------------------------------------- option parsing
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str, option: str) -> float:
    """'8h', '30m', '90s', '3600' → seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"{option} {text!r} is not a duration; use e.g. 8h, 45m, 900s")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def parse_pairs(pairs: list[str], option: str) -> dict[str, str]:
    """KEY=VALUE options → {KEY: VALUE}, the value verbatim (a string; nothing is guessed)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{option} {pair!r} must look like KEY=VALUE")
        out[key.strip()] = value
    return out


def parse_env(pairs: list[str]) -> dict[str, str]:
    """``--env`` values: environment values are strings, kept exactly as given
    (``NCCL_DEBUG=off`` stays "off", ``UMASK=0755`` stays "0755", ``X=@file`` stays "@file")."""
    env = parse_pairs(pairs, "--env")
    for name in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(f"--env {name}=...: {name!r} is not an environment variable name (letters, digits, _)")
    return env


# ------------------------------------------------------------------------ flag values and types
#: What each portable knob takes: (kind, lowest, highest). Kinds: int, float, fraction (0 < x ≤ 1),
#: bool, str. The adapters map the knobs to each dialect's flag.
KNOB_TYPES: dict[str, tuple[str, float | None, float | None]] = {
    "memory_fraction": ("fraction", 0.0, 1.0),
    "max_running": ("int", 1, None),
    "batched_tokens": ("int", 1, None),
    "context_len": ("int", 1, None),
    "cuda_graph_max_bs": ("int", 1, None),
    "block_size": ("int", 1, None),
    "tensor_parallel": ("int", 1, None),
    "pipeline_parallel": ("int", 1, None),
    "prefix_caching": ("bool", None, None),
    "chunked_prefill": ("bool", None, None),
    "enforce_eager": ("bool", None, None),
    "kv_cache_dtype": ("str", None, None),
    "scheduling_policy": ("str", None, None),
}
#: Raw flags of known type that no portable knob maps to (vLLM and SGLang spellings).
FLAG_TYPES: dict[str, tuple[str, float | None, float | None]] = {
    "--data-parallel-size": ("int", 1, None),
    "--dp-size": ("int", 1, None),
    "--cuda-graph-max-bs": ("int", 1, None),
    "--schedule-conservativeness": ("float", 0.0, None),
    "--max-num-partial-prefills": ("int", 1, None),
    "--long-prefill-token-threshold": ("int", 0, None),
}
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


def _knob_flags(kind: str) -> dict[str, str]:
    adapter = ADAPTERS.get(kind)
    return dict(adapter.knobs) if adapter is not None else {}


def flag_type(kind: str, key: str) -> tuple[str, tuple[str, float | None, float | None] | None]:
    """(the engine flag, its (kind, low, high)) for a knob or raw flag name; the type is None when
    nothing is known about it."""
    knobs = _knob_flags(kind)
    flag = knobs.get(key) or canonical_flag(key)
    knob = key if key in knobs else next((k for k, f in knobs.items() if f == flag), None)
    if knob in KNOB_TYPES:
        return flag, KNOB_TYPES[knob]
    return flag, FLAG_TYPES.get(flag)


def _describe(spec: tuple[str, float | None, float | None]) -> str:
    kind, low, high = spec
    if kind == "bool":
        return "true or false (an on/off flag)"
    if kind == "fraction":
        return "a fraction in (0, 1]"
    noun = "an integer" if kind == "int" else "a number" if kind == "float" else "a word"
    if kind == "str":
        return noun
    if low is not None and high is not None:
        return f"{noun} from {low:g} to {high:g}"
    if low is not None:
        return f"{noun} > {low:g}" if kind == "float" and low == 0 else f"{noun} ≥ {low:g}"
    return noun


def checked_value(value: Any, spec: tuple[str, float | None, float | None]) -> Any:
    """``value`` as the flag's type (a string from the command line is converted).

    Raises:
        ValueError: The value is not of the type, or outside its range.
    """
    kind, low, high = spec
    if kind == "str":
        return value
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, str):
        text = value.strip()
        if kind == "int":
            if not re.fullmatch(r"[+-]?\d+", text):
                raise ValueError
            value = int(text)
        else:
            number = float(text)  # ValueError for words
            value = int(number) if re.fullmatch(r"[+-]?\d+", text) else number
    if kind == "int" and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, (int, float)) or (kind == "int" and not isinstance(value, int)):
        raise ValueError
    if math.isnan(value) or math.isinf(value):
        raise ValueError
    if kind == "fraction":
        if not 0 < value <= 1:
            raise ValueError
    elif kind == "float" and low == 0:
        if value <= 0:
            raise ValueError
    elif (low is not None and value < low) or (high is not None and value > high):
        raise ValueError
    return value


def _param_spec(param: Param) -> tuple[str, float | None, float | None] | None:
    """A search-space parameter's own type, for a flag nothing else is known about."""
    if isinstance(param, BoolParam):
        return ("bool", None, None)
    if isinstance(param, IntParam):
        return ("int", None, None)
    if isinstance(param, FloatParam):
        return ("float", None, None)
    choices = [c for c in param.choices if c is not None]
    if choices and all(isinstance(c, bool) for c in choices):
        return ("bool", None, None)
    if choices and all(isinstance(c, int) and not isinstance(c, bool) for c in choices):
        return ("int", None, None)
    if choices and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices):
        return ("float", None, None)
    return None


def _as_written(text: str) -> Any:
    """A value of a flag whose type is unknown: a number or true/false only when it reads back
    exactly as written (``0755`` and ``1e3`` stay text), a JSON object for JSON-valued flags."""
    stripped = text.strip()
    if stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if re.fullmatch(r"-?[1-9]\d*|0", stripped):
        return int(stripped)
    with contextlib.suppress(ValueError):
        if repr(float(stripped)) == stripped:
            return float(stripped)
    if stripped.startswith(("{", "[")):
        with contextlib.suppress(ValueError):
            return json.loads(stripped)
    return text


def typed_fixed(kind: str, raw: dict[str, str], space: SearchSpace) -> dict[str, Any]:
    """``--fixed`` values typed by their flag: the knob's type, else the search space's declared
    type for it, else as written. A value of the wrong type or range is one ConfigError line."""
    out: dict[str, Any] = {}
    for key, text in raw.items():
        flag, spec = flag_type(kind, key)
        if spec is None and key in space.params:
            spec = _param_spec(space.params[key])
        if spec is None:
            out[key] = _as_written(text)
            continue
        try:
            out[key] = checked_value(text, spec)
        except ValueError:
            raise ConfigError(f"--fixed {key}={text}: {flag} takes {_describe(spec)}, not {text!r}") from None
    return out


def check_space_values(kind: str, space: SearchSpace, source: str) -> None:
    """Every value a search space can send (fixed values, ranges, choices) fits its flag's type.

    Raises:
        ConfigError: One line naming the file, the field, the flag, the value and the type.
    """
    for name, value in space.fixed.items():
        flag, spec = flag_type(kind, name)
        if spec is not None and "." not in name:
            try:
                checked_value(value, spec)
            except ValueError:
                raise ConfigError(f"{source}: fixed.{name}: {flag} takes {_describe(spec)}, not {value!r}") from None
    for name, param in space.params.items():
        flag, spec = flag_type(kind, name)
        if spec is None or "." in name:
            continue
        where = f"{source}: params.{name}"
        kind_of = spec[0]
        wrong_bool = isinstance(param, BoolParam) and kind_of != "bool"
        if wrong_bool or (isinstance(param, (IntParam, FloatParam)) and kind_of in ("bool", "str")):
            raise ConfigError(f"{where}: {flag} takes {_describe(spec)}, not type {param.type}; fix its type")
        if isinstance(param, FloatParam) and kind_of == "int":
            raise ConfigError(f"{where}: {flag} takes {_describe(spec)}; use type: int (or categorical choices)")
        if isinstance(param, (IntParam, FloatParam)):
            values = [("low", param.low), ("high", param.high)]
        elif isinstance(param, CategoricalParam):
            values = [(f"choices[{i}]", c) for i, c in enumerate(param.choices) if c is not None]
        else:
            values = []
        for field, value in values:
            try:
                checked_value(value, spec)
            except ValueError:
                raise ConfigError(f"{where}.{field}: {flag} takes {_describe(spec)}, not {value!r}") from None


# ------------------------------------------------------------------------------ which engine
_ENGINES = ("vllm", "sglang")
_PROBE = "import importlib.util as u; print(' '.join(m for m in ('vllm', 'sglang') if u.find_spec(m)))"


def _engines_in_command(words: list[str]) -> set[str]:
    """Engines a launch command names: its program (``vllm serve``) or its module (``-m sglang...``)."""
    found = set()
    for i, word in enumerate(words):
        name = Path(word).name
        if name in _ENGINES:
            found.add(name)
        if i and words[i - 1] == "-m" and word.split(".")[0] in _ENGINES:
            found.add(word.split(".")[0])
    return found


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
        named = _engines_in_command(words)
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


def _engine_choice(engine: str | None, python: str | None, command: str | None) -> tuple[str, list[str]]:
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
        f"simulated engine: numbers are modelled by autotune's GPU simulator, not measured ({why}{note}); "
        "for a real engine pass --engine vllm|sglang and --python"
    ]


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
    """A name like `chat` means the shipped workloads/chat.yaml; anything else is a path. A name
    that matches nothing is refused with the closest shipped names."""
    p = Path(path)
    if p.exists() or p.suffix in (".yaml", ".yml") or "/" in path:
        if not p.exists() and not (SHIPPED / folder / p.name).exists():
            hint = _closest(p.stem, _shipped(folder))
            if hint and p.parent in (Path("."), Path(folder)):
                raise ConfigError(f"{p}: file not found; did you mean {hint}? (shipped {folder}: {_list(folder)})")
        return p
    shipped = SHIPPED / folder / f"{path}.yaml"
    if not shipped.exists():
        option = "--workload" if folder == "workloads" else "--space"
        hint = _closest(path, _shipped(folder))
        fix = f"did you mean {hint}?" if hint else "give a YAML file path"
        raise ConfigError(f"{option} {path!r}: no such file or shipped name; {fix} (shipped: {_list(folder)})")
    return shipped


def _shipped(folder: str) -> list[str]:
    return sorted(f.stem for f in (SHIPPED / folder).glob("*.yaml"))


def _list(folder: str) -> str:
    return ", ".join(_shipped(folder))


def _closest(name: str, names: list[str]) -> str | None:
    match = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return match[0] if match else None


def _engine_settings(
    engine: str,
    model: str | None,
    python: str | None,
    command: str | None,
    fixed: dict[str, Any],
    env: dict[str, str],
    startup_timeout: float | None,
    sim_gpu: str,
    sim_speedup: float,
    api_key_env: str | None,
) -> EngineSettings:
    env_str = dict(env)
    if engine.startswith("sim"):
        dialect = engine.partition("-")[2] or "vllm"
        if dialect not in ADAPTERS:
            raise ConfigError(f"--engine {engine!r}: the simulator speaks sim-vllm or sim-sglang")
        env_str = {"AUTOTUNE_SIM_GPU": sim_gpu, "AUTOTUNE_SIM_SPEEDUP": str(sim_speedup), **env_str}
        return parse_model(
            EngineSettings,
            {
                "kind": dialect,
                "model": model or SIM_DEFAULT_MODEL,
                "command": [sys.executable, "-m", "autotune_sim", dialect],
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
    host_memory_margin: Annotated[
        float, typer.Option(min=0, help="GiB of available RAM a CPU engine's memory probes leave to the host.")
    ] = 2.0,
    baseline: Annotated[
        bool, typer.Option(help="Run the engine's defaults first (every gain is measured against them).")
    ] = True,
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
    env_values = parse_env(env or [])
    fixed_raw = parse_pairs(fixed or [], "--fixed")
    engine, intro = _engine_choice(engine, python, command)
    kind = (engine.partition("-")[2] or "vllm") if engine.startswith("sim") else engine
    space_path = _resolve_file(space or DEFAULT_SPACE.get(kind, "vllm-default"), "search_spaces")
    space_model = load_yaml(space_path, SearchSpace)
    check_space_values(kind, space_model, str(space_path))
    settings = _engine_settings(
        engine,
        model,
        python,
        command,
        typed_fixed(kind, fixed_raw, space_model),
        env_values,
        startup_timeout,
        sim_gpu,
        sim_speedup,
        api_key_env,
    )
    job = TuneJob(
        engine=settings,
        space=space_model,
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
                "host_memory_margin_gib": host_memory_margin,
                "baseline": baseline,
                "parallel": parse_parallel(parallel),
                "gpus": parse_gpus(gpus),
                "heartbeat_s": heartbeat,
            },
            "tune options",
        ),
    )
    _run_job(job, intro)


def _with_client(workload: Workload, client: str | None) -> Workload:
    """The workload measured with ``client`` (``--bench-client``), validated like the YAML field."""
    if client is None:
        return workload
    return parse_model(Workload, {**workload.model_dump(exclude_unset=True), "client": client}, "--bench-client")


def _run_job(job: TuneJob, intro: list[str] | None = None) -> None:
    """Run the study, then say how it ended: the winner and its launch script, or what the
    launches came to; and, when the time budget ended it, what it cut short."""
    opening = _opening_line(job)
    started = time.monotonic()
    try:
        with LiveProgress(console, simulated=job.engine.simulated, intro=intro, opening=opening) as progress:
            best = run_study(job, progress)
        finished = load_study(job.study.name, job.storage_url)
    except StudyError as err:
        # A refused resume: say which of engine, space and workload changed, and how.
        changed = _resume_difference(job)
        raise _fail(StudyError(changed) if changed else err) from None
    except EngineFailsRegardless as err:
        raise _fail(err) from None  # its one line is the diagnosis; `status` shows it too
    except KeyboardInterrupt:
        interrupt.acknowledge()
        err_console.print("interrupted: engines torn down, study saved; run the same command to resume")
        raise typer.Exit(130) from None
    stopped = _budget_line(job, finished, time.monotonic() - started)
    if stopped:
        console.print(stopped, highlight=False)
    if job.study.method == "memory":
        return
    if best is None:
        console.print(
            f"{no_winner_text(finished.get_trials(deepcopy=False))}; "
            f"see `autotune status {job.study.name}` for what happened to each trial and why",
            highlight=False,
        )
        raise typer.Exit(1)
    _print_best(finished, best)
    script = export_trial(finished, best, "bash", None, job.dir)
    console.print(f"launch script: {script}{_export_note(finished, best)}", highlight=False)


TUNING_EXCLUDED = ("baseline", "validation", "context")


def _existing_study(name: str, url: str) -> optuna.Study | None:
    """The study when it already exists in its storage (a SQLite file is never created here)."""
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return None
    try:
        return load_study(name, url)
    except AutotuneError:
        return None


def _opening_line(job: TuneJob) -> str:
    """The run's first study line: what exists already and what will run — counted from the
    storage, never assumed."""
    cfg = job.study
    if cfg.method == "memory":
        plan = f"up to {cfg.trials} memory probe{'s' if cfg.trials != 1 else ''}"
    else:
        plan = f"up to {cfg.trials} tuning trial{'s' if cfg.trials != 1 else ''}"
        if cfg.finalists and cfg.validation_runs:
            plan += f", then {cfg.finalists} finalist(s) × {cfg.validation_runs} fresh-engine re-run(s)"
    existing = _existing_study(job.study.name, job.storage_url)
    trials = existing.get_trials(deepcopy=False) if existing is not None else []
    if not trials:
        return f"study {cfg.name}: new, in {job.dir}; {plan}"
    stages = Counter(str(t.user_attrs.get("stage", "?")) for t in trials)
    recorded = ", ".join(f"{k} {v}" for k, v in stages.items())
    return f"study {cfg.name}: resuming with {len(trials)} trials recorded ({recorded}); {plan}"


def _budget_line(job: TuneJob, study: optuna.Study, elapsed: float) -> str | None:
    """When the time budget ended the run: what it ran of what was asked, and how to go on."""
    budget = job.study.time_budget_s
    if budget is None or elapsed < budget:
        return None
    finished = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    tuning = sum(1 for t in finished if t.user_attrs.get("stage") not in TUNING_EXCLUDED)
    planned = job.study.finalists * job.study.validation_runs if job.study.method != "memory" else 0
    reruns = sum(max(0, len(v.get("values", [])) - 1) for v in validation(study).values())
    if tuning >= job.study.trials and reruns >= planned:
        return None
    ran = f"{tuning} of {job.study.trials} tuning trials"
    if planned:
        ran += f" and {reruns} of {planned} validation re-runs"
    return (
        f"time budget {_seconds_text(budget)} used up after {_seconds_text(elapsed)}: ran {ran}; "
        "re-run the same command (a larger --time-budget) to go on"
    )


def _seconds_text(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def _differences(before: Any, after: Any, limit: int = 3) -> list[str]:
    """Up to ``limit`` fields that differ, as "field old → new"."""
    old, new = _flatten(json.loads(json.dumps(before))), _flatten(json.loads(json.dumps(after)))
    keys = [k for k in dict.fromkeys([*old, *new]) if old.get(k) != new.get(k)]
    shown = [f"{k} {json.dumps(old.get(k))} → {json.dumps(new.get(k))}" for k in keys[:limit]]
    return shown + ([f"+{len(keys) - limit} more"] if len(keys) > limit else [])


def _resume_difference(job: TuneJob) -> str | None:
    """Why an existing study refuses this job, naming what changed (engine, search space or
    workload, field by field), or None when its engine, space and workload are the same."""
    existing = _existing_study(job.study.name, job.storage_url)
    if existing is None:
        return None
    stored = existing.user_attrs.get("fingerprint")
    config = existing.user_attrs.get("config") or {}
    if stored is None or stored == job.fingerprint() or not config:
        return None
    changed: list[str] = []
    engine = config.get("engine") or {}
    now = {"kind": job.engine.kind, "model": job.engine.model}
    if any(engine.get(k) != v for k, v in now.items()):
        was = {"kind": engine.get("kind"), "model": engine.get("model")}
        changed.append(f"engine ({'; '.join(_differences(was, now))})")
    for part, model, option in (("space", job.space, "--space"), ("workload", job.workload, "--workload")):
        diff = _differences(config.get(part) or {}, model.model_dump(mode="json"))
        if diff:
            changed.append(f"{part} ({'; '.join(diff)}; check {option})")
    what = ", ".join(changed) or "engine/space/workload"
    return (
        f"study {job.study.name!r} was created with a different {what}; re-run with its original options "
        "or use a new --study name (nothing was changed)"
    )


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
    local_env = parse_env(env or [])
    engine: dict[str, Any] = {"env": local_env}
    stored = join_job(study, storage, engine={}, study={}).engine
    if stored.simulated:
        sim_env = {"AUTOTUNE_SIM_GPU": sim_gpu, "AUTOTUNE_SIM_SPEEDUP": str(sim_speedup)}
        engine = {"env": {**sim_env, **local_env}, "command": [sys.executable, "-m", "autotune_sim", stored.kind]}
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
    intro = (
        ["simulated engine: numbers are modelled by autotune's GPU simulator, not measured (the study's engine)"]
        if job.engine.simulated
        else []
    )
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
        host_memory_margin=host_memory_margin,
        baseline=baseline,
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
    probes_run = Counter(
        str(t.user_attrs.get("outcome", t.state.name.lower()))
        for t in st.get_trials(deepcopy=False)
        if t.user_attrs.get("stage") == "memory_edge" and t.state.is_finished()
    )
    console.print(memory_edge_line(state, dict(probes_run)), highlight=False)
    console.print("probes: " + ", ".join(f"{k} {v}" for k, v in sorted((state.get("results") or {}).items())))
    if state.get("edge") is None:
        raise typer.Exit(1)


def memory_edge_line(state: dict[str, Any], launches: dict[str, int] | None = None) -> str:
    """What the probes showed: an edge only when a fraction above the kept one failed.
    ``launches``: the memory-edge trials by outcome (named when no probe gave a verdict)."""
    results = {float(k): v for k, v in (state.get("results") or {}).items()}
    edge, note = state.get("edge"), state.get("note", "")
    failed_high = sorted(f for f, r in results.items() if r == "too_high")
    if not results:
        ran = launch_counts(launches or {})
        return f"memory edge: not found — no probe gave a memory verdict ({ran})"
    if edge is None:
        tried = ", ".join(f"{f:g} {r}" for f, r in sorted(results.items()))
        return f"memory edge: not found — no fraction survived the peak load ({tried})"
    pinned = state.get("kv_cache_memory_bytes")
    pool = f", KV pool kv_cache_memory_bytes={pinned}" if pinned else ""
    if not failed_high and state.get("ceiling") is not None and max(results) >= state["ceiling"] - 1e-9:
        return (
            f"memory edge: {edge:g}{pool} — the most this host can give now: every probe up to its ceiling "
            f"{state['ceiling']:g} passed under the peak load ({note})"
        )
    if not failed_high:
        return (
            f"memory edge: not reached — every probe up to {max(results):g} passed under the peak load; "
            f"{edge:g}{pool} is the highest tried, not an edge "
            f"(raise the space's memory_fraction high, or --probes) ({note})"
        )
    passing = max((f for f, r in results.items() if r == "ok"), default=edge)
    kept = "less one safety step" if edge < passing else "kept as is"
    return (
        f"memory edge: {edge:g}{pool} (highest passing fraction {passing:g}, {kept}; "
        f"{failed_high[0]:g} failed under the peak load) ({note})"
    )


def _terminate_as_interrupt() -> None:
    """SIGTERM/SIGHUP (kill, a closed terminal) take the Ctrl-C path: engines torn down, study
    kept; an interrupt swallowed by a finalizer is delivered again (``runtime/interrupt.py``)."""
    interrupt.install()


def _print_best(study: optuna.Study, best: optuna.trial.FrozenTrial) -> None:
    value, note = value_summary(study, best)
    metric = objective_metric(study)
    sim = " (modelled by the simulator)" if engine_config(study).get("simulated") else ""
    shown = "–" if value is None else f"{value:,.1f}"
    console.print(
        f"best trial {best.number} ({best.user_attrs.get('stage')}): {metric} {shown} ({note}){sim}",
        highlight=False,
    )
    console.print("flags: " + (_flags_text(best.user_attrs.get("flags", {})) or "(engine defaults)"), highlight=False)
    verdict = study.user_attrs.get("verdict")
    if verdict and verdict.get("winner") == best.number:
        console.print(verdict["line"], highlight=False)


def _stopped_line(study: optuna.Study) -> str | None:
    """Why the study stopped early (an engine failing whatever the flags), when it did."""
    stopped = study.user_attrs.get("stopped")
    return f"stopped: {stopped['line']}" if stopped else None


def _export_note(study: optuna.Study, best: optuna.trial.FrozenTrial) -> str:
    """What the exported script holds and why, when the winner did not clearly beat the defaults."""
    verdict = study.user_attrs.get("verdict") or {}
    if verdict.get("winner") != best.number or verdict.get("beats_defaults") is not False:
        return ""
    if not best.user_attrs.get("params"):
        return " (the engine's defaults: no candidate beat them)"
    return (
        " (the winner's flags; they did not beat the engine's defaults beyond the measured noise, "
        "so the defaults serve as well)"
    )


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


def _studies_in(results: Path) -> list[str]:
    """Names of the studies in a results folder (folders holding a study.db)."""
    if not results.is_dir():
        return []
    return sorted(d.name for d in results.iterdir() if (d / "study.db").is_file())


def _study_name(study: str | None, storage: str | None, results: Path) -> str:
    """The study a read-only command means: the one named, or the only one there is."""
    if study is not None:
        return study
    if storage is not None:
        try:
            names = sorted(optuna.get_all_study_names(storage))
        except Exception:  # SQLAlchemy raises many kinds; load_study words the problem
            names = []
        where = "that storage"
    else:
        names, where = _studies_in(results), f"{results}/"
    if len(names) == 1:
        return names[0]
    if not names:
        raise ConfigError(f"no study in {where}; run `autotune tune --study NAME` first (or pass --results)")
    raise ConfigError(f"{where} holds several studies ({', '.join(names)}); name one, e.g. {names[0]}")


def _open_existing(study: str, storage: str | None, results: Path) -> optuna.Study:
    url = storage or default_storage_url(results, study)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        names = _studies_in(results)
        hint = _closest(study, names)
        if hint:
            raise ConfigError(f"no study {study!r} under {results}/; did you mean {hint}?")
        there = f" (studies there: {', '.join(names)})" if names else ""
        raise ConfigError(f"no study {study!r} under {results}/{there}; run `autotune tune --study {study}` first")
    return load_study(study, url)


def _open_named(study: str | None, storage: str | None, results: Path) -> optuna.Study:
    return _open_existing(_study_name(study, storage, results), storage, results)


UNITS = {"output_throughput": "tok/s", "total_token_throughput": "tok/s"}


def metric_unit(metric: str) -> str:
    if metric.endswith("_ms"):
        return "ms"
    if metric in ("request_throughput", "request_goodput"):
        return "req/s"
    return UNITS.get(metric, "")


def _point_text(metrics: list[str], values: list[float]) -> str:
    parts = []
    for metric, value in zip(metrics, values, strict=False):
        unit = metric_unit(metric)
        parts.append(f"{metric} {value:,.1f}" + (f" {unit}" if unit else ""))
    return ", ".join(parts)


def _status_detail(t: optuna.trial.FrozenTrial) -> str:
    """The flags column: the trial's knobs, then (for anything not ok) what explains it."""
    params = " ".join(f"{k}={format_value(v)}" for k, v in (t.user_attrs.get("params") or {}).items())
    outcome = t.user_attrs.get("outcome", t.state.name.lower())
    reason = explain(t) if outcome != "ok" else ""
    if reason:
        return f"{params} — {reason[:160]}" if params else reason[:160]
    return params + _probe_pool(t)


def _probe_pool(t: optuna.trial.FrozenTrial) -> str:
    """A served memory probe's KV pool and whether the peak load ran it short (preemptions)."""
    facts = t.user_attrs.get("facts") or {}
    if "probe" not in t.user_attrs or "kv_tokens" not in facts:
        return ""
    preempted = facts.get("preemptions")
    return f" · KV {facts['kv_tokens']:,} tokens" + (f", {preempted} preemptions" if preempted is not None else "")


@app.command()
def status(
    study: Annotated[str | None, typer.Argument(help="Study name (default: the only study in --results).")] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
) -> None:
    """Trials so far, the best feasible trial, and failures by outcome."""
    st = _open_named(study, storage, results)
    trials = st.get_trials(deepcopy=False)
    outcomes = Counter(t.user_attrs.get("outcome", t.state.name.lower()) for t in trials)
    stages = Counter(t.user_attrs.get("stage", "?") for t in trials)
    console.print(
        f"study {st.study_name}: {len(trials)} trials ({', '.join(f'{k} {v}' for k, v in stages.items())})",
        highlight=False,
    )
    console.print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())), highlight=False)
    probes = [t for t in trials if "probe" in t.user_attrs]
    if workload_runs := [t for t in trials if "probe" not in t.user_attrs]:
        _print_trial_table(workload_runs)
    if probes:
        console.print(
            "memory probes, under the workload's peak shape (every slot busy with its longest request)"
            + (": their numbers are not comparable with the workload's above" if workload_runs else ""),
            highlight=False,
        )
        _print_trial_table(probes)
    if (edge_state := st.user_attrs.get("stage.memory_edge")) and edge_state.get("results"):
        console.print(memory_edge_line(edge_state), highlight=False)
    if len(st.directions) > 1:
        front = pareto_front(st)
        metrics = [term.metric for term in _objective_terms(st)]
        console.print(
            "Pareto front (feasible, non-dominated): "
            + "; ".join(f"#{t.number}: {_point_text(metrics, t.values)}" for t in front)
            if front
            else "Pareto front: empty",
            highlight=False,
        )
    if line := _stopped_line(st):
        console.print(line, highlight=False)
    best = best_trial(st)
    if best is None:
        console.print(f"best: none — {no_winner_text(trials)}", highlight=False)
    else:
        _print_best(st, best)


def _print_trial_table(trials: list[optuna.trial.FrozenTrial]) -> None:
    """One row per trial: number, stage, outcome, throughput, latency, then its flags or reason."""
    rows = []
    for t in trials:
        m = t.user_attrs.get("metrics") or {}
        latency = f"{_metric_cell(m.get('p95_ttft_ms'), ',.0f')} / {_metric_cell(m.get('p95_tpot_ms'), ',.1f')}"
        rows.append(
            (
                str(t.number),
                str(t.user_attrs.get("stage", "")),
                str(t.user_attrs.get("outcome", t.state.name.lower())),
                _metric_cell(m.get("output_throughput"), ",.1f"),
                latency if m else "",
                _status_detail(t),
            )
        )
    headers = ("#", "stage", "outcome", "tok/s", "p95 TTFT / TPOT ms")
    # Every column but the last is as wide as its longest cell (headers wrap at spaces) and there
    # are no vertical rules: at 80 columns the knobs column still holds "memory_fraction=0.88" on
    # one line, and what is longer wraps there. Nothing is cut short.
    widths = [max([*(len(w) for w in h.split()), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    table = _table(
        [
            *(
                (h, {"width": w, "justify": "right" if i in (0, 3, 4) else "left"})
                for i, (h, w) in enumerate(zip(headers, widths, strict=True))
            ),
            ("flags / reason", {}),
        ],
        box=SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for row in rows:
        table.add_row(*row)
    _print_table(table)


def _table(columns: list[tuple[str, dict[str, Any]]], **options: Any) -> Table:
    """A table whose cells wrap (folding long words) instead of being cut short with "…": a
    flag, a value or a reason is read whole or not at all."""
    table = Table(**options)
    for header, options in columns:
        table.add_column(header, overflow="fold", **options)
    return table


def _print_table(table: Table) -> None:
    """On a terminal the table fits its width (cells wrap); in a log or a pipe it takes the width
    it needs, so no cell is folded there either."""
    if console.is_terminal:
        console.print(table)
    else:
        wide = Measurement.get(console, console.options.update_width(10_000), table).maximum
        narrow = console.width
        console.width = max(narrow, wide)
        try:
            console.print(table)
        finally:
            console.width = narrow


def _metric_cell(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return format(value, spec)


def _study_folder(name: str, storage: str | None, results: Path) -> Path:
    """Where a study's files go on this box: results/<study>/ (for a shared storage without one
    here, the current folder)."""
    folder = results / name
    return folder if folder.is_dir() or storage is None else Path(".")


@app.command()
def export(
    study: Annotated[str | None, typer.Argument(help="Study name (default: the only study in --results).")] = None,
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
    st = _open_named(study, storage, results)
    name = st.study_name
    folder = _study_folder(name, storage, results)
    if pareto:
        console.print(str(_export_front(st, output or folder / "pareto.json")), highlight=False)
        return
    if trial is None:
        chosen = best_trial(st)
        if chosen is None:
            raise ConfigError(
                f"study {name!r} has no feasible trial ({no_winner_text(st.get_trials(deepcopy=False))}); "
                "pass --trial N to export another"
            )
    else:
        found = [t for t in st.get_trials(deepcopy=False) if t.number == trial]
        if not found:
            raise ConfigError(f"study {name!r} has no trial {trial}; see `autotune status {name}`")
        chosen = found[0]
    path = export_trial(st, chosen, fmt, output, folder)
    console.print(str(path), highlight=False)


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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"study": st.study_name, "objectives": metrics, "front": points}, indent=2) + "\n")
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror or err}; check -o") from None
    return path


def _objective_terms(st: optuna.Study) -> list[ObjectiveTerm]:
    objective = st.user_attrs.get("config", {}).get("workload", {}).get("objective", {})
    return parse_model(Objective, objective, "study config").terms


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
    frame = trials_frame(_open_named(study, storage, results), exact=True)
    for path, write in ((csv, _write_csv), (parquet, _write_parquet)):
        if path is not None:
            write(frame, path)
    shown = [c for c in frame.columns if c.startswith("param.")]
    metrics = [c for c in ("output_throughput", "p95_ttft_ms", "p95_tpot_ms") if c in frame.columns]
    table = _table(
        [(c, {}) for c in ("trial", "stage", "outcome", *[c.removeprefix("param.") for c in shown], *metrics)]
    )
    for r in frame.to_dict("records"):
        cells = [format_value(r.get(c)) for c in shown] + [_metric_cell(r.get(c), ",.1f") for c in metrics]
        table.add_row(str(r["trial"]), str(r["stage"]), str(r["outcome"]), *cells)
    _print_table(table)
    for path in (csv, parquet):
        if path is not None:
            console.print(str(path), highlight=False, soft_wrap=True)


def _write_csv(frame: Any, path: Path) -> None:
    try:
        frame.to_csv(path, index=False)
    except OSError as err:
        raise ConfigError(f"--csv {path}: cannot write it ({err.strerror or err})") from None


def _write_parquet(frame: Any, path: Path) -> None:
    try:
        parquet_ready(frame).to_parquet(path, index=False)
    except ImportError:
        raise ConfigError("--parquet needs pyarrow: pip install pyarrow (or use --csv)") from None
    except OSError as err:
        raise ConfigError(f"--parquet {path}: cannot write it ({err.strerror or err})") from None


@app.command()
def report(
    study: Annotated[str | None, typer.Argument(help="Study name (default: the only study in --results).")] = None,
    results: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL.")] = None,
    open_page: Annotated[bool, typer.Option("--open", help="Open the HTML report in the default browser.")] = False,
) -> None:
    """Write results/<study>/report.html (interactive plots, opens offline) and report.md (to paste)."""
    st = _open_named(study, storage, results)
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
    except KeyboardInterrupt:
        interrupt.acknowledge()
        _quiet_exit("interrupted: the benchmark was stopped; no result written")
    if capacity:
        header, rows = capacity_rows(found)
        table = Table(*header, title=f"capacity search: {w.name}")
        for row in rows:
            table.add_row(*row)
        console.print(table)
        console.print(capacity_line(found), highlight=False)
    else:
        verdict = bench_verdict(result.metrics, w, data.get("error_samples") or {})
        table = Table("metric", "value", title=f"{w.name}: {result.model}")
        for label, value in result_rows(result):
            table.add_row(label, verdict[0] if label == "SLOs" else value)
        console.print(table)
        console.print(verdict[1], highlight=False)
    if output is not None:
        output.write_text(json.dumps(data, indent=2, default=str) + "\n")
        console.print(str(output), soft_wrap=True, markup=False, highlight=False)


def bench_verdict(metrics: dict[str, Any], workload: Workload, errors: dict[str, int]) -> tuple[str, str]:
    """(the SLOs row, the closing line) of a run: failed requests are counted and the error rate
    is judged against ``max_error_rate`` with the latency SLOs — a run most of whose requests
    failed never "met the SLOs"."""
    completed, failed = int(metrics.get("completed") or 0), int(metrics.get("failed") or 0)
    total = completed + failed
    error_rate = float(metrics.get("error_rate") or 0.0)
    over = slo_violations(metrics, workload.slos) if workload.slos else {}
    missed = [f"{k} +{v:,.1f}" for k, v in over.items()]
    if error_rate > workload.max_error_rate:
        missed.insert(0, f"error rate {error_rate:.1%} > max_error_rate {workload.max_error_rate:.1%}")
    if completed == 0 and total:
        missed.insert(0, "no request succeeded")
    row = "met" if not missed else "missed: " + ", ".join(missed)
    if not workload.slos and not missed:
        row = f"error rate {error_rate:.1%} within max_error_rate {workload.max_error_rate:.1%} (no latency SLOs)"
    requests = f"{completed} of {total} requests succeeded, {failed} failed"
    if errors:
        top, count = max(errors.items(), key=lambda kv: kv[1])
        requests += f" (most often: {' '.join(str(top).split())[:120]} ×{count})"
    verdict = "workload met" if not missed else "workload NOT met"
    return row, f"{verdict}: {requests}; error rate {error_rate:.1%} (max_error_rate {workload.max_error_rate:.1%})"


def capacity_line(found: Any) -> str:
    """The capacity search's answer, saying when it is only a bound (the search ran out of runs,
    or its highest level still held)."""
    unit = "req/s" if found.dimension == "request_rate" else "concurrent requests"
    value, upper, reason = found.value, found.upper, found.stop_reason
    runs = len(found.runs)
    if reason == "below_low" or not value:
        return f"no load met the SLOs: even the lowest level tried failed ({reason}, {runs} runs)"
    head = f"highest load meeting the SLOs: {value:,.2f} {unit} ({reason})"
    if reason == "at_high":
        return f"{head} — a lower bound: the search's highest level (capacity.high) held; raise it to look further"
    if reason == "max_runs":
        above = f"; {upper:,.2f} {unit} failed" if upper is not None else "; no level that fails was found"
        return (
            f"{head} — a lower bound: the search stopped at its {runs}-run limit (capacity.max_runs) "
            f"before converging{above}"
        )
    return head + (f"; {upper:,.2f} {unit} failed" if upper is not None else "")


def _quiet_exit(line: str) -> None:
    """Say ``line`` and leave with exit 130, with nothing after it: the event loop's tasks and
    client workers torn down by the interrupt would otherwise print their tracebacks."""
    err_console.print(line)  # the asyncio teardown logger was silenced with the signal (runtime/interrupt.py)
    if sys.stderr is sys.__stderr__:  # the real command (not a test runner's captured streams)
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.__stderr__.flush()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - stays open until the interpreter exits
    raise typer.Exit(130)


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
