"""Typed, validated configuration: engine, search space, workload, SLOs and study settings.

Every model forbids unknown fields, so a typo in a YAML file is an error that names the field,
never a silently ignored setting. ``load_yaml`` turns any YAML or validation problem into one
``ConfigError`` line that names the file, the field path and the fix. This module imports nothing
from the rest of autotune except the error tree.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autotune.errors import ConfigError

__all__ = [
    "Arrival",
    "BoolParam",
    "CategoricalParam",
    "Dataset",
    "EngineSettings",
    "FloatParam",
    "IntParam",
    "Objective",
    "ObjectiveTerm",
    "Param",
    "SearchSpace",
    "StudySettings",
    "Workload",
    "load_yaml",
    "parse_model",
]

# Metric keys follow `vllm bench serve`'s JSON names so one parser reads ours and theirs.
LATENCY_KEY = re.compile(r"^(mean|median|std|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
THROUGHPUT_KEYS = ("output_throughput", "total_token_throughput", "request_throughput", "request_goodput")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------------------- engine
class EngineSettings(StrictModel):
    """How to start the engine. The tuner never imports it: it runs under its own Python."""

    kind: Literal["vllm", "sglang"] = Field(description="Engine dialect: vllm or sglang.")
    model: str = Field(description="Model path or name passed to the engine.")
    python: str | None = Field(
        default=None, description="Python of the engine's own venv; the launch runs `<python> -m <module>`."
    )
    command: list[str] | None = Field(
        default=None,
        description="Full launch command before the flags (overrides `python`), e.g. ['vllm', 'serve'].",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the engine.")
    fixed_flags: dict[str, Any] = Field(
        default_factory=dict, description="Flags every trial gets (e.g. enforce_eager: true)."
    )
    host: str = Field(default="127.0.0.1", description="Bind address; loopback unless you need otherwise.")
    startup_timeout_s: float = Field(default=600.0, gt=0, description="Deadline for the engine to be ready.")
    api_key_env: str | None = Field(
        default=None, description="Name of an environment variable holding the engine's API key."
    )
    simulated: bool = Field(
        default=False, description="True when the engine is autotune's simulator (numbers are modelled)."
    )


# ---------------------------------------------------------------------------------- search space
class _ParamBase(StrictModel):
    condition: dict[str, Any] | None = Field(
        default=None, description="Only sample this parameter when every named parameter has this value."
    )


class FloatParam(_ParamBase):
    type: Literal["float"]
    low: float
    high: float
    step: float | None = None
    log: bool = False

    @model_validator(mode="after")
    def _check(self) -> FloatParam:
        _check_range(self.low, self.high)
        if self.step is not None and self.log:
            raise ValueError("step and log cannot both be set (Optuna allows one or the other)")
        return self


class IntParam(_ParamBase):
    type: Literal["int"]
    low: int
    high: int
    step: int = 1
    log: bool = False

    @model_validator(mode="after")
    def _check(self) -> IntParam:
        _check_range(self.low, self.high)
        if self.log and self.step != 1:
            raise ValueError("log-scale ints need step 1")
        return self


class CategoricalParam(_ParamBase):
    type: Literal["categorical"]
    choices: list[Any] = Field(min_length=1)


class BoolParam(_ParamBase):
    type: Literal["bool"]


Param = Annotated[FloatParam | IntParam | CategoricalParam | BoolParam, Field(discriminator="type")]


def _check_range(low: float, high: float) -> None:
    if low > high:
        raise ValueError(f"low ({low}) is greater than high ({high}); swap them")


class SearchSpace(StrictModel):
    """Knobs to tune. Names are portable knobs (memory_fraction, max_running, batched_tokens,
    context_len, cuda_graph_max_bs) or the engine's own flag names (max_num_seqs, --block-size)."""

    name: str = ""
    description: str = ""
    engine: Literal["vllm", "sglang", "any"] = "any"
    params: dict[str, Param] = Field(default_factory=dict)
    fixed: dict[str, Any] = Field(default_factory=dict, description="Flags set on every trial.")

    @model_validator(mode="after")
    def _conditions_name_params(self) -> SearchSpace:
        for name, p in self.params.items():
            for other in p.condition or {}:
                if other not in self.params:
                    raise ValueError(f"params.{name}.condition names unknown parameter {other!r}")
        return self


# -------------------------------------------------------------------------------------- workload
class Dataset(StrictModel):
    """Request shape. `random`: exact token lengths, as `vllm bench serve --dataset-name random`."""

    kind: Literal["random"] = "random"
    input_len: int = Field(default=1024, gt=0)
    output_len: int = Field(default=128, gt=0)
    range_ratio: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="vLLM meaning: lengths uniform in [len*(1-r), len*(1+r)]."
    )
    prefix_len: int = Field(default=0, ge=0, description="Shared prefix tokens prepended to every prompt.")


class Arrival(StrictModel):
    """Fixed concurrency, or a Poisson/gamma request rate (optionally capped by concurrency)."""

    concurrency: int | None = Field(default=None, gt=0)
    request_rate: float = Field(default=math.inf, gt=0, description="Requests/s; inf sends all at once.")
    burstiness: float = Field(default=1.0, gt=0, description="Gamma shape; 1.0 is Poisson.")


class ObjectiveTerm(StrictModel):
    metric: str = Field(default="output_throughput", description="A metric key (vllm bench serve names).")
    direction: Literal["maximize", "minimize"] = "maximize"

    @field_validator("metric")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in THROUGHPUT_KEYS and not LATENCY_KEY.match(v):
            raise ValueError(f"unknown metric {v!r}; use one of {', '.join(THROUGHPUT_KEYS)} or e.g. p95_ttft_ms")
        return v


class Objective(ObjectiveTerm):
    """What a trial is scored by. ``also`` adds objectives: the study becomes multi-objective
    and keeps a Pareto front (e.g. output_throughput up, p95_ttft_ms down)."""

    also: list[ObjectiveTerm] = Field(default_factory=list, description="Further objectives (Pareto front).")
    throughput_floor: float | None = Field(
        default=None,
        gt=0,
        description="output_throughput must reach this (a constraint), e.g. when minimising latency.",
    )

    @property
    def terms(self) -> list[ObjectiveTerm]:
        return [ObjectiveTerm(metric=self.metric, direction=self.direction), *self.also]

    @property
    def directions(self) -> list[str]:
        return [t.direction for t in self.terms]


class Workload(StrictModel):
    name: str = "workload"
    description: str = ""
    endpoint: Literal["completions", "chat"] = "completions"
    dataset: Dataset = Field(default_factory=Dataset)
    num_prompts: int = Field(default=200, gt=0)
    warmup_requests: int = Field(default=4, ge=0, description="Sent first and excluded from the metrics.")
    arrival: Arrival = Field(default_factory=Arrival)
    seed: int = 0
    request_timeout_s: float = Field(default=300.0, gt=0)
    slos: dict[str, float] = Field(
        default_factory=dict, description="Upper bounds on latency keys, e.g. p95_ttft_ms: 1000."
    )
    max_error_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    objective: Objective = Field(default_factory=Objective)

    @field_validator("slos")
    @classmethod
    def _slo_keys(cls, v: dict[str, float]) -> dict[str, float]:
        for key, bound in v.items():
            if not LATENCY_KEY.match(key):
                raise ValueError(f"unknown SLO {key!r}; use e.g. p95_ttft_ms, p99_tpot_ms, mean_e2el_ms")
            if bound <= 0:
                raise ValueError(f"SLO {key} must be > 0 (got {bound})")
        return v

    @property
    def longest_request_tokens(self) -> int:
        d = self.dataset
        return d.prefix_len + int(d.input_len * (1 + d.range_ratio)) + int(d.output_len * (1 + d.range_ratio))


# --------------------------------------------------------------------------------------- loading
M = TypeVar("M", bound=BaseModel)
_PARAM_TAGS = {"float", "int", "categorical", "bool"}


def _format_validation(source: str, err: ValidationError) -> str:
    first = err.errors()[0]
    # Drop the discriminator tags pydantic puts in the path (params.x.int.low → params.x.low).
    where = ".".join(str(p) for p in first["loc"] if p not in _PARAM_TAGS) or "(top level)"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field; remove it or check its spelling"
    extra = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{source}: {where}: {msg}{extra}"


def parse_model(model: type[M], data: Any, source: str) -> M:
    """Validate ``data`` as ``model``; a failure is one ConfigError line naming source and field."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation(source, err)) from None


def load_yaml(path: str | Path, model: type[M]) -> M:
    """Read a YAML file into ``model`` with one-line errors (missing file, bad YAML, bad field)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: file not found; check the path")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(
            f"{p}:{where} is not valid YAML ({getattr(err, 'problem', err)}); fix the syntax there"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of fields at the top level")
    return parse_model(model, data, str(p))


# ----------------------------------------------------------------------------------------- study
class StudySettings(StrictModel):
    """How a tuning run is organised; stored in the study so a resume can check it."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    results_dir: Path = Path("results")
    storage: str | None = Field(default=None, description="Optuna storage URL; default SQLite in results/.")
    trials: int = Field(default=20, gt=0, description="Search trials to finish (baseline and validation extra).")
    time_budget_s: float | None = Field(default=None, gt=0)
    repeats: int = Field(default=1, gt=0, description="Benchmark runs per engine launch (median kept).")
    finalists: int = Field(default=2, ge=0, description="Top trials re-run with fresh engines.")
    validation_runs: int = Field(default=2, ge=0, description="Fresh-engine re-runs per finalist.")
    retries: int = Field(default=1, ge=0, description="Re-runs of a trial that crashed or timed out.")
    sampler: Literal["tpe", "random", "nsga2"] = "tpe"
    seed: int | None = None
    baseline: bool = Field(default=True, description="Run the engine's defaults first.")
    stall_timeout_s: float = Field(default=120.0, gt=0, description="Kill an engine that streams no token this long.")
    bench_timeout_s: float | None = Field(default=None, gt=0, description="Cap on one benchmark run.")
    method: Literal["staged", "search", "memory"] = Field(
        default="staged",
        description="staged: the articles' methodology; search: plain Optuna over the space; memory: the edge only.",
    )
    memory_probe: Literal["step", "bisect"] = Field(
        default="step", description="Memory-edge probe: 0.02 steps up to failure, or bisection (fewer launches)."
    )
    parallel: int | Literal["auto"] = Field(
        default=1,
        description="Trials run at once on this box: a number (≥ 1) or auto (every free GPU group; CPU: cores).",
    )
    gpus: list[int] | None = Field(
        default=None, description="NVML indices of the GPUs trials may use (default: every free GPU)."
    )
    heartbeat_s: int = Field(
        default=30,
        ge=1,
        description="Seconds between a worker's heartbeats on a shared storage; 3 missed beats fail its trials.",
    )

    @field_validator("parallel")
    @classmethod
    def _parallel_positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"parallel must be auto or at least 1 (got {v})")
        return v
