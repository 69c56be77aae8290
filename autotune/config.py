"""Typed, validated configuration: engine, search space, workload, SLOs and study settings.

Every model forbids unknown fields, so a typo in a YAML file is an error that names the field,
never a silently ignored setting. ``load_yaml`` turns any YAML or validation problem into one
``ConfigError`` line that names the file, the field path and the fix. This module imports nothing
from the rest of autotune except the error tree.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autotune.errors import ConfigError

__all__ = [
    "Arrival",
    "BoolParam",
    "CapacitySearch",
    "CategoricalParam",
    "CustomSession",
    "CustomTurn",
    "Dataset",
    "EmpiricalLength",
    "EngineSettings",
    "FixedLength",
    "FloatParam",
    "HistogramBin",
    "IntParam",
    "LengthDist",
    "LognormalLength",
    "NormalLength",
    "Objective",
    "ObjectiveTerm",
    "Param",
    "RampUp",
    "SearchSpace",
    "StudySettings",
    "UniformLength",
    "Workload",
    "load_yaml",
    "parse_model",
    "read_custom_file",
]

# Metric keys follow `vllm bench serve`'s JSON names so one parser reads ours and theirs.
LATENCY_KEY = re.compile(r"^(mean|median|std|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
THROUGHPUT_KEYS = ("output_throughput", "total_token_throughput", "request_throughput", "request_goodput")
#: The objective that runs a capacity search in every trial: the highest load whose SLOs hold.
CAPACITY_KEY = "max_slo_rate"


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
        self.in_dependency_order()
        return self

    def in_dependency_order(self) -> list[tuple[str, Param]]:
        """The parameters, each after those its condition names (the order they are picked in).

        Raises:
            ValueError: When conditions name each other in a cycle.
        """
        order: list[tuple[str, Param]] = []
        pending = dict(self.params)
        while pending:
            ready = [n for n, p in pending.items() if all(c not in pending for c in p.condition or {})]
            if not ready:
                cycle = ", ".join(sorted(pending))
                raise ValueError(f"the conditions of params {cycle} name each other in a cycle; drop one of them")
            order += [(name, pending.pop(name)) for name in ready]
        return order


# -------------------------------------------------------------------------------------- workload
# Standard normal quantile at 0.999: an unbounded length distribution without an explicit `max`
# is capped at its 99.9th percentile, so every request has a known longest length.
Z_999 = 3.090232306167813
# Tokens a chat template adds around one message (role markers, separators); an allowance for
# sizing the context, since the template is only known to the server.
CHAT_TEMPLATE_TOKENS_PER_MESSAGE = 8


class FixedLength(StrictModel):
    """Every request gets exactly ``value`` tokens (a bare integer in YAML means this)."""

    dist: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, description="Tokens.")

    @property
    def low(self) -> int:
        return self.value

    @property
    def high(self) -> int:
        return self.value


class UniformLength(StrictModel):
    """Integers uniform in ``[floor(mean·(1−r)), ceil(mean·(1+r))]``: vLLM's ``--random-range-ratio``."""

    dist: Literal["uniform"]
    mean: int = Field(gt=0, description="Centre of the range (vLLM's --random-input-len/--random-output-len).")
    range_ratio: float = Field(default=0.0, ge=0.0, lt=1.0, description="r; 0 gives exactly `mean`.")

    @property
    def low(self) -> int:
        return max(1, math.floor(self.mean * (1 - self.range_ratio)))

    @property
    def high(self) -> int:
        return max(1, math.ceil(self.mean * (1 + self.range_ratio)))


class NormalLength(StrictModel):
    """Rounded normal samples, clipped to ``[min, max]``; ``max`` defaults to the 99.9th percentile."""

    dist: Literal["normal"]
    mean: float = Field(gt=0)
    std: float = Field(gt=0)
    min: int = Field(default=1, ge=1)
    max: int | None = Field(default=None, ge=1, description="Cap; default ceil(mean + 3.09·std) (p99.9).")

    @property
    def low(self) -> int:
        return self.min

    @property
    def high(self) -> int:
        return self.max if self.max is not None else max(self.min, math.ceil(self.mean + Z_999 * self.std))

    @model_validator(mode="after")
    def _bounds(self) -> NormalLength:
        _check_range(self.min, self.high)
        return self


class LognormalLength(StrictModel):
    """Rounded lognormal samples (long-tailed, like chat prompts), clipped to ``[min, max]``.

    ``median`` is ``exp(μ)`` and ``sigma`` is σ of the underlying normal, so the mean is
    ``median·exp(σ²/2)``; ``max`` defaults to the 99.9th percentile ``median·exp(3.09σ)``.
    """

    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(gt=0)
    min: int = Field(default=1, ge=1)
    max: int | None = Field(default=None, ge=1, description="Cap; default the 99.9th percentile.")

    @property
    def low(self) -> int:
        return self.min

    @property
    def high(self) -> int:
        if self.max is not None:
            return self.max
        return max(self.min, math.ceil(self.median * math.exp(Z_999 * self.sigma)))

    @model_validator(mode="after")
    def _bounds(self) -> LognormalLength:
        _check_range(self.min, self.high)
        return self


class HistogramBin(StrictModel):
    """One bar of an empirical histogram: lengths uniform in ``[low, high]`` with weight ``weight``."""

    low: int = Field(ge=1)
    high: int = Field(ge=1)
    weight: float = Field(gt=0, description="Relative weight (the weights need not sum to 1).")

    @model_validator(mode="before")
    @classmethod
    def _triple(cls, data: Any) -> Any:
        # `[low, high, weight]` is the compact YAML spelling of a bin.
        if isinstance(data, list | tuple) and len(data) == 3:
            return {"low": data[0], "high": data[1], "weight": data[2]}
        return data

    @model_validator(mode="after")
    def _order(self) -> HistogramBin:
        _check_range(self.low, self.high)
        return self


class EmpiricalLength(StrictModel):
    """A histogram read off real traffic: pick a bin by weight, then a length uniform inside it."""

    dist: Literal["empirical"]
    bins: list[HistogramBin] = Field(min_length=1, description="Bins as {low, high, weight} or [low, high, weight].")

    @property
    def low(self) -> int:
        return min(b.low for b in self.bins)

    @property
    def high(self) -> int:
        return max(b.high for b in self.bins)


def _bare_int_is_fixed(data: Any) -> Any:
    if isinstance(data, int) and not isinstance(data, bool):
        return {"dist": "fixed", "value": data}
    return data


LengthDist = Annotated[
    Annotated[
        FixedLength | UniformLength | NormalLength | LognormalLength | EmpiricalLength, Field(discriminator="dist")
    ],
    BeforeValidator(_bare_int_is_fixed),
]
_LENGTH_TAGS = {"fixed", "uniform", "normal", "lognormal", "empirical"}
_LENGTH_FIELDS = {"input", "output", "turns"}


class CustomTurn(StrictModel):
    """One user message of a custom file; ``output_tokens`` defaults to the dataset's ``output``."""

    prompt: str = Field(min_length=1)
    output_tokens: int | None = Field(default=None, ge=1)


class CustomSession(StrictModel):
    """One line of a custom JSONL file: a single prompt, or a conversation's user turns."""

    turns: list[CustomTurn] = Field(min_length=1)
    think_time_s: float | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _shapes(cls, data: Any) -> Any:
        # vLLM's custom format is {"prompt", "output_tokens"}; a conversation lists its turns,
        # each a string or {"prompt", "output_tokens"}.
        if isinstance(data, dict) and "prompt" in data:
            rest = {k: v for k, v in data.items() if k not in ("prompt", "output_tokens")}
            turn = {k: data[k] for k in ("prompt", "output_tokens") if k in data}
            return {**rest, "turns": [turn]}
        if isinstance(data, dict) and isinstance(data.get("turns"), list):
            turns = [{"prompt": t} if isinstance(t, str) else t for t in data["turns"]]
            return {**data, "turns": turns}
        return data

    @property
    def text_bytes(self) -> int:
        return sum(len(t.prompt.encode()) for t in self.turns)


def read_custom_file(path: Path) -> list[CustomSession]:
    """Parse a custom JSONL file: one JSON object per line, blank lines skipped.

    Raises:
        ConfigError: Unreadable file, a line that is not JSON, or a line of the wrong shape
            (the message names the line).
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the custom dataset ({err.strerror}); check the path") from None
    sessions = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError as err:
            raise ConfigError(f"{path}: line {number} is not JSON ({err})") from None
        sessions.append(parse_model(CustomSession, data, f"{path}: line {number}"))
    if not sessions:
        raise ConfigError(f'{path}: no prompts; write one JSON object per line, e.g. {{"prompt": "..."}}')
    return sessions


class Dataset(StrictModel):
    """Request shape.

    ``random``
        Exact token lengths with synthetic content, as ``vllm bench serve --dataset-name random``;
        with ``num_prefixes`` > 1 it is vLLM's ``prefix_repetition`` (RAG-like shared prefixes).
    ``multi_turn``
        Sessions of ``turns`` user messages; each turn's request carries the whole history
        (earlier messages and the answers the server gave), after ``think_time_s``.
    ``custom``
        Prompts or conversations from a JSONL file (``path``), token counts from the server.

    Lengths are ``input``/``output`` distributions; ``input_len``/``output_len``/``range_ratio``
    are the shorthand for a uniform one with vLLM's meaning and stay the default.
    """

    kind: Literal["random", "multi_turn", "custom"] = "random"
    input_len: int = Field(default=1024, gt=0, description="Prompt tokens (per turn for multi_turn).")
    output_len: int = Field(default=128, gt=0, description="Output tokens (max_tokens with ignore_eos).")
    range_ratio: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="vLLM meaning: lengths uniform in [len*(1-r), len*(1+r)]."
    )
    input: LengthDist | None = Field(default=None, description="Prompt-length distribution (replaces input_len).")
    output: LengthDist | None = Field(default=None, description="Output-length distribution (replaces output_len).")
    prefix_len: int = Field(default=0, ge=0, description="Shared prefix tokens prepended to every prompt.")
    num_prefixes: int = Field(
        default=1, ge=1, description="Distinct shared prefixes; requests are spread evenly over them (RAG, agents)."
    )
    turns: LengthDist | None = Field(default=None, description="multi_turn: user turns per session.")
    think_time_s: float = Field(default=0.0, ge=0, description="multi_turn: pause between an answer and the next turn.")
    think_time: Literal["fixed", "exponential"] = Field(
        default="fixed", description="multi_turn: think_time_s exactly, or exponential with that mean."
    )
    path: Path | None = Field(default=None, description="custom: JSONL file (relative to the workload file).")
    max_request_tokens: int | None = Field(
        default=None, gt=0, description="custom: the longest request in tokens, for sizing the context."
    )

    @field_validator("path")
    @classmethod
    def _resolve(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        if v is None:
            return None
        base = (info.context or {}).get("base_dir")
        p = v.expanduser()
        return (Path(base) / p if base is not None and not p.is_absolute() else p).resolve()

    @model_validator(mode="after")
    def _consistent(self) -> Dataset:
        given = self.model_fields_set
        if self.input is not None and given & {"input_len", "range_ratio"}:
            raise ValueError("set either input or input_len/range_ratio, not both")
        if self.output is not None and "output_len" in given:
            raise ValueError("set either output or output_len, not both")
        if self.num_prefixes > 1 and self.prefix_len == 0:
            raise ValueError("num_prefixes needs prefix_len > 0 (the length of each shared prefix)")
        self._check_kind_fields(given)
        return self

    def _check_kind_fields(self, given: set[str]) -> None:
        only = {"multi_turn": {"turns", "think_time_s", "think_time"}, "custom": {"path", "max_request_tokens"}}
        for kind, fields in only.items():
            stray = sorted(given & fields) if self.kind != kind else []
            if stray:
                raise ValueError(f"{', '.join(stray)} only apply to kind: {kind}")
        if self.kind == "multi_turn" and self.turns is None:
            raise ValueError("kind multi_turn needs turns (user turns per session, e.g. turns: 4)")
        if self.kind == "custom":
            if self.path is None:
                raise ValueError("kind custom needs path (a JSONL file of prompts or turns)")
            read_custom_file(self.path)  # a bad file is an error at load time, naming the line

    @property
    def input_dist(self) -> FixedLength | UniformLength | NormalLength | LognormalLength | EmpiricalLength:
        """The prompt-length distribution (``input``, else uniform from ``input_len``/``range_ratio``)."""
        return self.input or UniformLength(dist="uniform", mean=self.input_len, range_ratio=self.range_ratio)

    @property
    def output_dist(self) -> FixedLength | UniformLength | NormalLength | LognormalLength | EmpiricalLength:
        """The output-length distribution (``output``, else uniform from ``output_len``/``range_ratio``)."""
        return self.output or UniformLength(dist="uniform", mean=self.output_len, range_ratio=self.range_ratio)

    @property
    def max_turns(self) -> int:
        return self.turns.high if self.turns is not None and self.kind == "multi_turn" else 1


class RampUp(StrictModel):
    """``vllm bench serve --ramp-up-strategy``: the rate moves from start to end over the requests."""

    strategy: Literal["linear", "exponential"]
    start_rps: float = Field(gt=0, description="Rate of the first request (req/s).")
    end_rps: float = Field(gt=0, description="Rate of the last request (req/s).")


class Arrival(StrictModel):
    """When requests (sessions, for multi_turn) start.

    Fixed concurrency (``concurrency`` alone: closed loop), a Poisson/gamma request rate with
    ``vllm bench serve``'s schedule (optionally capped by ``concurrency``), or a ramp-up.
    """

    concurrency: int | None = Field(default=None, gt=0, description="Most requests in flight.")
    request_rate: float = Field(default=math.inf, gt=0, description="Requests/s; inf sends all at once.")
    burstiness: float = Field(default=1.0, gt=0, description="Gamma shape; 1.0 is Poisson, < 1 burstier.")
    ramp_up: RampUp | None = Field(default=None, description="A rate that ramps (replaces request_rate).")

    @model_validator(mode="after")
    def _one_rate(self) -> Arrival:
        if self.ramp_up is not None and not math.isinf(self.request_rate):
            raise ValueError("ramp_up replaces request_rate (vLLM refuses both); remove request_rate")
        return self


class CapacitySearch(StrictModel):
    """How the capacity search finds the highest load whose SLOs hold (``max_slo_rate``).

    The search runs the workload at one load level per run: it brackets (doubling or halving
    from ``start``), then bisects until the bracket is narrower than ``rel_tol``.
    """

    dimension: Literal["request_rate", "concurrency"] = Field(
        default="request_rate", description="Search the request rate (open loop) or the concurrency."
    )
    start: float | None = Field(
        default=None, gt=0, description="First level; default: the workload's own rate or concurrency, if set."
    )
    low: float | None = Field(default=None, gt=0, description="Give up below this (default 0.1 req/s or 1).")
    high: float | None = Field(default=None, gt=0, description="Stop doubling above this (default 10000 or 4096).")
    rel_tol: float = Field(default=0.1, gt=0, lt=1, description="Stop when the bracket is this narrow (relative).")
    max_runs: int = Field(default=10, ge=2, description="Most benchmark runs one search may make.")
    confirm: bool = Field(default=True, description="Re-run the level found; a failure there moves the search down.")
    seconds_per_run: float | None = Field(
        default=None, gt=0, description="Size each rate run to about this many seconds of arrivals."
    )


class ObjectiveTerm(StrictModel):
    metric: str = Field(default="output_throughput", description="A metric key (vllm bench serve names).")
    direction: Literal["maximize", "minimize"] = "maximize"

    @field_validator("metric")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in (*THROUGHPUT_KEYS, CAPACITY_KEY) and not LATENCY_KEY.match(v):
            raise ValueError(
                f"unknown metric {v!r}; use one of {', '.join(THROUGHPUT_KEYS)}, {CAPACITY_KEY} or e.g. p95_ttft_ms"
            )
        return v

    @model_validator(mode="after")
    def _capacity_up(self) -> ObjectiveTerm:
        if self.metric == CAPACITY_KEY and self.direction != "maximize":
            raise ValueError(f"{CAPACITY_KEY} is maximised (the highest load whose SLOs hold); remove direction")
        return self


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
    """What a benchmark run sends (dataset, arrivals), how it is judged (SLOs, objective), and how
    runs against one engine are kept independent (fresh prompts, prefix-cache reset)."""

    name: str = "workload"
    description: str = ""
    endpoint: Literal["completions", "chat"] = "completions"
    dataset: Dataset = Field(default_factory=Dataset)
    num_prompts: int = Field(default=200, gt=0, description="Requests per run (sessions, for multi_turn).")
    warmup_requests: int = Field(default=4, ge=0, description="Sent first and excluded from the metrics.")
    arrival: Arrival = Field(default_factory=Arrival)
    seed: int = 0
    request_timeout_s: float = Field(default=300.0, gt=0)
    slos: dict[str, float] = Field(
        default_factory=dict, description="Upper bounds on latency keys, e.g. p95_ttft_ms: 1000."
    )
    max_error_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    objective: Objective = Field(default_factory=Objective)
    fresh_prompts_per_run: bool = Field(
        default=True,
        description="Each run draws new prompt content (same lengths), so a repeat against the same engine "
        "does not reuse the previous run's prefix cache; shared prefixes stay shared within a run.",
    )
    reset_prefix_cache: bool = Field(
        default=True,
        description="Ask the engine to drop its prefix cache before each run where it allows it (vLLM "
        "/reset_prefix_cache with VLLM_SERVER_DEV_MODE=1, SGLang /flush_cache).",
    )
    capacity: CapacitySearch = Field(
        default_factory=CapacitySearch, description="Settings of the capacity search (max_slo_rate)."
    )
    client: Literal["autotune", "vllm-bench", "sglang-bench"] = Field(
        default="autotune",
        description="The measuring instrument: autotune's load generator, or the engine's own `vllm bench serve` "
        "/ `python -m sglang.bench_serving` run from the engine's Python (random datasets only).",
    )
    quality_min_agreement: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Compare each trial's greedy answers to fixed prompts with the baseline's; below this "
        "agreement (0–1) the trial is infeasible. Use with lossy knobs (fp8 KV, quantization, speculation).",
    )
    max_startup_s: float | None = Field(
        default=None,
        gt=0,
        description="Seconds an engine may take from launch to ready (for autoscaling): a trial that starts "
        "slower is infeasible. Reads each trial's own start, so a warm compile cache counts as it does there.",
    )

    @property
    def judges_latency(self) -> bool:
        """Whether a latency decides anything: an SLO, or a latency objective."""
        return bool(self.slos) or any(LATENCY_KEY.match(t.metric) for t in self.objective.terms)

    @property
    def searches_capacity(self) -> bool:
        """Whether each trial runs a capacity search (an objective term is ``max_slo_rate``)."""
        return any(t.metric == CAPACITY_KEY for t in self.objective.terms)

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
        """Prompt plus output tokens of the longest request the workload can send (context sizing).

        Random datasets: shared prefix + the largest input and output lengths (the cap of an
        unbounded distribution, by default its 99.9th percentile). Multi-turn: the last turn of
        the longest session carries every earlier message and answer. Custom files: their token
        counts are known only to the server, so this is ``max_request_tokens`` when given, else
        an upper bound: UTF-8 bytes of the session's prompts (a BPE or byte-fallback token
        covers at least one byte) plus its output tokens. Chat adds an allowance of
        ``CHAT_TEMPLATE_TOKENS_PER_MESSAGE`` per message for the template.
        """
        d = self.dataset
        if d.kind == "custom":
            return self._longest_custom()
        turns = d.max_turns
        tokens = d.prefix_len + turns * (d.input_dist.high + d.output_dist.high)
        return tokens + self._template_allowance(turns)

    def peak_dataset(self) -> Dataset:
        """A random dataset whose every request is the workload's longest (memory-edge probes).

        Output at its largest, prompt filling the rest of ``longest_request_tokens`` after the
        shared prefix and the chat-template allowance, one shared prefix: whatever the dataset
        kind or length distribution, the peak fits the context the tuner sized from it.
        """
        d = self.dataset
        out = d.output_dist.high
        prompt = self.longest_request_tokens - out - d.prefix_len - self._template_allowance(d.max_turns)
        return Dataset(input=FixedLength(value=max(1, prompt)), output=FixedLength(value=out), prefix_len=d.prefix_len)

    def _template_allowance(self, turns: int) -> int:
        # One user message per turn and one answer per earlier turn, plus the generation prompt.
        return CHAT_TEMPLATE_TOKENS_PER_MESSAGE * 2 * turns if self.endpoint == "chat" else 0

    def _longest_custom(self) -> int:
        d = self.dataset
        if d.max_request_tokens is not None:
            return d.max_request_tokens
        assert d.path is not None  # validated: custom needs a path
        out_cap = d.output_dist.high
        longest = 0
        for s in read_custom_file(d.path):
            outputs = sum(t.output_tokens or out_cap for t in s.turns)
            longest = max(longest, s.text_bytes + outputs + self._template_allowance(len(s.turns)))
        return longest


# --------------------------------------------------------------------------------------- loading
M = TypeVar("M", bound=BaseModel)
_PARAM_TAGS = {"float", "int", "categorical", "bool"}


def _format_validation(model: type[BaseModel], source: str, err: ValidationError) -> str:
    errors = err.errors()
    meant = {i: _meant(model, e) for i, e in enumerate(errors) if e["type"] == "extra_forbidden"}
    # A misspelt field also leaves the field it meant "required": name the misspelling first.
    index = next((i for i, close in meant.items() if close), 0)
    first = errors[index]
    where = ".".join(str(p) for p in _without_tags(first["loc"])) or "(top level)"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        close = meant[index]
        msg = f"unknown field; did you mean {close}?" if close else "unknown field; remove it or check its spelling"
    extra = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {where}: {msg}{extra}"


def _meant(model: type[BaseModel], error: Any) -> str | None:
    """The field an unknown one most likely misspells, at its place in ``model``."""
    return _closest(str(error["loc"][-1]), _fields_at(model, _without_tags(error["loc"])[:-1]))


def _closest(word: str, known: set[str]) -> str | None:
    """The known name a misspelling most likely meant: the same letters swapped (``stpe`` →
    ``step``) first, else the closest by difflib."""
    swapped = [k for k in sorted(known) if sorted(k) == sorted(word)]
    close = swapped or difflib.get_close_matches(word, sorted(known), n=1, cutoff=0.6)
    return close[0] if close else None


def _fields_at(model: type[BaseModel], path: list[int | str]) -> set[str]:
    """The field names a mapping at ``path`` inside ``model`` may hold (every variant's, where the
    path runs through a union), for a "did you mean" on an unknown one."""
    models: list[type[BaseModel]] = [model]
    for part in path:
        if isinstance(part, int):
            continue  # a list index: the same models
        found: list[type[BaseModel]] = []
        for m in models:
            field = m.model_fields.get(str(part)) or next((f for f in m.model_fields.values() if f.alias == part), None)
            if field is not None:
                found.extend(_models_in(field.annotation))
        models = found or models  # not a field: a mapping's key (params.<name>), same models
    return {f.alias or name for m in models for name, f in m.model_fields.items()}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold: itself, or inside an Optional, a union, a list
    or a mapping's values."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _without_tags(loc: tuple[int | str, ...]) -> list[int | str]:
    """Drop the discriminator tags pydantic puts in the path (params.x.int.low → params.x.low,
    dataset.input.lognormal.sigma → dataset.input.sigma)."""
    out: list[int | str] = []
    for part in loc:
        if part in _PARAM_TAGS or (part in _LENGTH_TAGS and out and out[-1] in _LENGTH_FIELDS):
            continue
        out.append(part)
    return out


def parse_model(model: type[M], data: Any, source: str, base_dir: Path | None = None) -> M:
    """Validate ``data`` as ``model``; a failure is one ConfigError line naming source and field.

    Args:
        model: The pydantic model.
        data: Parsed YAML/JSON.
        source: Named first in an error (the file, or e.g. "tune options").
        base_dir: Relative file paths inside ``data`` (a custom dataset) are resolved against it.
    """
    try:
        return model.model_validate(data, context={"base_dir": base_dir} if base_dir is not None else None)
    except ValidationError as err:
        raise ConfigError(_format_validation(model, source, err)) from None


def as_given(model: type[BaseModel], data: Mapping[str, Any]) -> dict[str, Any]:
    """A stored ``model_dump(mode="json")`` without the values that equal their defaults, as a user
    would have written it: some models check which fields were given, and a full dump gives them
    all. ``model.model_validate(as_given(model, dump))`` rebuilds what was dumped."""
    out: dict[str, Any] = {}
    for name, value in data.items():
        field = model.model_fields.get(name)
        if field is None:
            out[name] = value
            continue
        kind = field.annotation
        if isinstance(value, dict) and isinstance(kind, type) and issubclass(kind, BaseModel):
            value = as_given(kind, value)
        default = field.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            default = as_given(type(default), default.model_dump(mode="json"))
        elif default is not None and not isinstance(default, (str, int, float, bool, list, dict)):
            default = str(default)
        if value != default:
            out[name] = value
    return out


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
    return parse_model(model, data, str(p), base_dir=p.parent)


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
    partition_cpus: bool = Field(
        default=True,
        description="With an engine on this host's CPUs, pin it and the load generator to separate cores.",
    )
    judge_host: bool = Field(
        default=True,
        description="With the engine on its own CPU cores, run again a run during which other processes took more "
        "than a tenth of them (the run measured the host).",
    )
    sampler: Literal["tpe", "random", "nsga2"] = "tpe"
    seed: int | None = None
    baseline: bool = Field(default=True, description="Run the engine's defaults first.")
    noise_runs: int = Field(
        default=1,
        ge=0,
        description="Launches of the engine's defaults right after the baseline (of the first run that served, "
        "when the defaults did not), to measure the run-to-run noise every decision allows for (0: none; trials "
        "are then never cut as unable to win until re-runs measure it).",
    )
    stable_within: float | None = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="A real engine's run is lengthened (up to about a minute) until its throughput is known within "
        "this fraction (95 % interval over one-second buckets); null: each run serves the workload as declared.",
    )
    stall_timeout_s: float = Field(default=120.0, gt=0, description="Kill an engine that streams no token this long.")
    bench_timeout_s: float | None = Field(default=None, gt=0, description="Cap on one benchmark run.")
    method: Literal["staged", "search", "memory"] = Field(
        default="staged",
        description="staged: the articles' methodology; search: plain Optuna over the space; memory: the edge only.",
    )
    host_memory_margin_gib: float = Field(
        default=2.0,
        ge=0,
        description="An engine on this host's CPUs: memory probes leave this much of the available RAM to the rest.",
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
    weight_cache: Literal["off", "auto", "on"] = Field(
        default="auto",
        description="A daemon holds the weights across trials (vLLM ≥ 0.34): auto where the engine has one, on, off.",
    )
    stop_when_done: bool = Field(
        default=True,
        description="End a search before its trial budget once a third of the budget in a row has not beaten "
        "the best trial by more than the measured run-to-run noise (from 12 search trials on).",
    )
    early_stop: bool = Field(
        default=True,
        description="End a search trial's benchmark once it cannot matter: an SLO already lost, a throughput "
        "that cannot beat the best trial, or a dead engine.",
    )
    twin: bool = Field(
        default=True,
        description="Predict each search trial's throughput, TTFT and TPOT before its engine starts, with the "
        "simulator's step model fitted on the study's own runs, and record the error once measured.",
    )
    screen: bool = Field(
        default=True,
        description="Skip launching a search trial the twin predicts to lose to the best trial by more than its "
        "largest measured error plus the study's noise (from 3 predictions checked on the study's own trials).",
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
