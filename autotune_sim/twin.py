"""The twin: the simulator's closed-loop step model, fitted on the user's box from a study's runs.

A step that decodes ``s`` sequences and prefills ``t`` prompt tokens takes ``step_s + seq_s × s +
token_s × t`` seconds: a fixed cost (launches, the scheduler, the weights read once per step), a
cost per running sequence (its KV read, its sampling, its bookkeeping) and a cost per prompt
token (its compute). The constants are fitted on the measurements the study already has (the
baseline's first, then every served run), so a CPU engine gets its own, not a GPU preset's.
Runs at one batch size cannot tell the fixed cost from the per-sequence one: a weak prior splits
the baseline's decode step between them half and half (``PRIOR_SHARE``, ``PRIOR_WEIGHT``), and
runs at other batch sizes outweigh it.

A closed loop of ``C`` streams sends ``N`` requests of ``I`` prompt and ``O`` output tokens to an
engine that runs at most ``M`` sequences and ``B`` batched tokens per step, with a KV pool of ``K``
tokens: ``b = min(C, M, K ÷ (I + O/2))`` sequences run at once, the rest queue. Two regimes:

- **lockstep** (every request the same length, as ``random`` datasets without a spread send):
  requests start and end together, in waves of ``b``. A wave of ``m`` prefills ``m × I`` tokens in
  ``p = ⌈m I ÷ B⌉`` steps, then decodes ``O − 1`` steps of ``m`` tokens: TTFT is its prefill
  steps (the mean request waits for half of them, and its own), TPOT the decode step;
- **staggered** (lengths that vary): requests start and end at different steps, so each step
  carries the decodes of ``b`` slots and their share of prompts: a cycle of ``n = max(O,
  b(I + O) ÷ B)`` steps of ``b(I + O) ÷ n`` tokens; the prompt's own step carries ``I + b`` tokens.

A request ``j`` is sent when request ``j − C`` ended (at once for the first ``C``) and waits for
its wave (lockstep) or slot; the run lasts until the last wave ends. TTFT, TPOT and
1 ÷ throughput are then linear in the three constants, so the fit is a least squares on relative
errors (each measurement counts by its own size), kept non-negative.
``python -m autotune_sim twin`` reads ``{"observations": [...], "candidate": {...}}`` as JSON on
standard input and prints the fit and the candidate's prediction (:func:`answer`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Fit", "Shape", "TwinInputError", "answer", "fit", "predict"]

#: The measurements the fit reads, and their unit's conversion to seconds (throughput: 1 ÷ tok/s).
FITTED = ("mean_ttft_ms", "mean_tpot_ms", "output_throughput")
#: The prior: the first run's decode step is this share fixed cost, the rest per-sequence cost,
#: held with this weight against each measurement's 1.
PRIOR_SHARE, PRIOR_WEIGHT = 0.5, 0.3


class TwinInputError(ValueError):
    """The request cannot be read; the message names the field."""


@dataclass(frozen=True)
class Shape:
    """One configuration under one closed-loop workload, as the twin sees it."""

    concurrency: int
    requests: int
    input_len: float
    output_len: float
    max_running: int | None = None  # None: the engine's cap is above the concurrency
    batched_tokens: int | None = None  # None: no per-step token budget binds
    kv_tokens: int | None = None  # None: the pool holds every stream
    lockstep: bool = False  # every request the same length: waves start and end together

    @property
    def batch(self) -> int:
        """Sequences that run at once."""
        b = self.concurrency
        if self.max_running:
            b = min(b, self.max_running)
        if self.kv_tokens is not None:
            b = min(b, int(self.kv_tokens // (self.input_len + self.output_len / 2)))
        return b

    def terms(self) -> dict[str, Linear]:
        """Each predicted quantity as ``(×step_s, ×seq_s, ×token_s)`` (seconds; throughput as s per token)."""
        waves = self._lockstep_waves() if self.lockstep else self._staggered_waves()
        n, o = self.requests, self.output_len
        ends, t = [], ZERO
        for wave in waves:
            t = _add(t, wave.cycle)
            ends.append(t)
        ttft, tpot = ZERO, ZERO
        for j in range(n):
            w = j // self.batch
            wave = waves[w]
            started = ends[w - 1] if w else ZERO
            sent = ends[(j - self.concurrency) // self.batch] if j >= self.concurrency else ZERO
            wait = _add(started, _scale(sent, -1.0))
            ttft = _add(ttft, _add(wave.first_token, wait))
            tpot = _add(tpot, wave.per_token)
        return {
            "mean_ttft_ms": _scale(ttft, 1.0 / n),
            "mean_tpot_ms": _scale(tpot, 1.0 / n),
            "output_throughput": _scale(ends[-1], 1.0 / (n * o)),
        }

    def _lockstep_waves(self) -> list[_Wave]:
        b, i, o = self.batch, self.input_len, self.output_len
        budget = self.batched_tokens or math.inf
        waves = []
        for first in range(0, self.requests, b):
            m = min(b, self.requests - first)
            steps = max(1, math.ceil(m * i / budget))
            prefill = (steps, 0.0, m * i)  # `steps` steps carrying m·I prompt tokens in all
            decode = (1.0, float(m), 0.0)
            # The mean request waits for half its wave's prefill steps, and its own.
            first_token = _scale(prefill, (steps + 1) / (2 * steps))
            cycle = _add(prefill, _scale(decode, o - 1))
            waves.append(_Wave(first_token, decode, cycle))
        return waves

    def _staggered_waves(self) -> list[_Wave]:
        b, i, o = self.batch, self.input_len, self.output_len
        budget = self.batched_tokens or math.inf
        steps = max(o, b * (i + o) / budget)
        step = (1.0, b * o / steps, b * i / steps)  # each step: its share of decodes and of prompts
        own = max(1, math.ceil(i / max(1.0, budget - b)))
        first_token = (own, own * b, i)  # the prompt's own steps, beside b decodes
        cycle = _scale(step, steps)
        per_token = _scale(_add(cycle, _scale(first_token, -1.0)), 1.0 / max(1.0, o - 1))
        return [_Wave(first_token, per_token, cycle)] * math.ceil(self.requests / b)


#: A quantity linear in the three constants: its coefficients on step_s, seq_s and token_s.
Linear = tuple[float, float, float]
ZERO: Linear = (0.0, 0.0, 0.0)


def _add(x: Linear, y: Linear) -> Linear:
    return (x[0] + y[0], x[1] + y[1], x[2] + y[2])


def _scale(x: Linear, k: float) -> Linear:
    return (x[0] * k, x[1] * k, x[2] * k)


@dataclass(frozen=True)
class _Wave:
    """One wave of requests: a request's time to its first token, per later token, and the wave's length."""

    first_token: Linear
    per_token: Linear
    cycle: Linear


@dataclass(frozen=True)
class Fit:
    """The box's step constants, and how many runs and measurements they were fitted on."""

    step_s: float
    seq_s: float
    token_s: float
    runs: int
    residual: float  # root-mean-square relative error of the fitted measurements

    @property
    def constants(self) -> Linear:
        return (self.step_s, self.seq_s, self.token_s)

    def as_json(self) -> dict[str, Any]:
        fields = ("step_s", "seq_s", "token_s", "runs", "residual")
        return {name: getattr(self, name) for name in fields}


def _seconds(metric: str, value: float) -> float:
    """A measurement as the model's quantity: seconds, or seconds per output token."""
    return 1.0 / value if metric == "output_throughput" else value / 1000.0


def fit(observations: Sequence[tuple[Shape, Mapping[str, float]]]) -> Fit:
    """The constants that best explain ``observations`` (shape, measured metrics), non-negative.

    Raises:
        TwinInputError: When no observation has a positive measurement to fit.
    """
    rows: list[tuple[Linear, float]] = []  # (coefficients, target) of one relative residual
    for shape, measured in observations:
        if shape.batch < 1:
            continue
        terms = shape.terms()
        for metric in FITTED:
            value = measured.get(metric)
            if value is None or not value > 0:
                continue
            rows.append((_scale(terms[metric], 1.0 / _seconds(metric, float(value))), 1.0))
    if not rows:
        raise TwinInputError("observations: no run with a positive TTFT, TPOT or output throughput to fit")
    data = list(rows)
    rows += _prior(observations)
    x = _non_negative_least_squares(rows)
    rms = math.sqrt(sum((_dot(c, x) - y) ** 2 for c, y in data) / len(data))
    return Fit(*x, runs=sum(1 for s, _ in observations if s.batch >= 1), residual=rms)


def _prior(observations: Sequence[tuple[Shape, Mapping[str, float]]]) -> list[tuple[Linear, float]]:
    """Two weak rows: the first run with a TPOT splits its decode step between the fixed and the
    per-sequence cost by ``PRIOR_SHARE``."""
    for shape, measured in observations:
        tpot = measured.get("mean_tpot_ms")
        if shape.batch >= 1 and tpot and tpot > 0:
            step = tpot / 1000.0
            fixed = (PRIOR_WEIGHT / (PRIOR_SHARE * step), 0.0, 0.0)
            per_seq = (0.0, PRIOR_WEIGHT * shape.batch / ((1 - PRIOR_SHARE) * step), 0.0)
            return [(fixed, PRIOR_WEIGHT), (per_seq, PRIOR_WEIGHT)]
    return []


def _dot(c: Linear, x: Linear) -> float:
    return c[0] * x[0] + c[1] * x[1] + c[2] * x[2]


def _non_negative_least_squares(rows: Sequence[tuple[Linear, float]]) -> Linear:
    """Least squares over the constants, each ≥ 0: a constant that comes out negative is held at
    zero and the rest solved again (three unknowns: at most three rounds)."""
    free = [0, 1, 2]
    x = [0.0, 0.0, 0.0]
    while free:
        solved = _solve(rows, free)
        if solved is None:
            free.pop()
            continue
        worst = min(range(len(free)), key=lambda k: solved[k])
        if solved[worst] >= 0:
            for k, i in enumerate(free):
                x[i] = solved[k]
            break
        free.pop(worst)
    return (x[0], x[1], x[2])


def _solve(rows: Sequence[tuple[Linear, float]], free: list[int]) -> list[float] | None:
    """The normal equations over the ``free`` constants, by Gaussian elimination (None: singular)."""
    n = len(free)
    a = [[sum(c[i] * c[j] for c, _ in rows) for j in free] + [sum(c[i] * y for c, y in rows)] for i in free]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12 * max(1.0, max(abs(v) for row in a for v in row[:n])):
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                k = a[r][col] / a[col][col]
                a[r] = [v - k * p for v, p in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


def predict(constants: Fit, shape: Shape) -> dict[str, Any]:
    """What ``shape`` should measure on the fitted box (``failure`` when it cannot serve)."""
    if shape.batch < 1:
        return {"failure": "kv_insufficient", "batch": 0}
    out: dict[str, Any] = {"batch": shape.batch, "failure": None}
    for metric, coefficients in shape.terms().items():
        seconds = _dot(coefficients, constants.constants)
        out[metric] = (
            (1.0 / seconds if seconds > 0 else math.inf) if metric == "output_throughput" else 1000.0 * seconds
        )
    return out


# ------------------------------------------------------------------------------ the command
def _shape(data: Any, where: str) -> Shape:
    if not isinstance(data, Mapping):
        raise TwinInputError(f"{where}: expected an object")
    try:
        shape = Shape(
            concurrency=int(data["concurrency"]),
            requests=int(data["requests"]),
            input_len=float(data["input_len"]),
            output_len=float(data["output_len"]),
            max_running=_optional_int(data.get("max_running")),
            batched_tokens=_optional_int(data.get("batched_tokens")),
            kv_tokens=_optional_int(data.get("kv_tokens")),
            lockstep=bool(data.get("lockstep", False)),
        )
    except KeyError as err:
        raise TwinInputError(f"{where}: missing field {err.args[0]}") from None
    except (TypeError, ValueError) as err:
        raise TwinInputError(f"{where}: {err}") from None
    if min(shape.concurrency, shape.requests, shape.output_len) < 1 or shape.input_len < 0:
        raise TwinInputError(f"{where}: concurrency, requests and output_len must be ≥ 1, input_len ≥ 0")
    return shape


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def answer(request: Any) -> dict[str, Any]:
    """The command's reply to one request: the fit and the candidate's prediction.

    Raises:
        TwinInputError: For a request that cannot be read (the message names the field).
    """
    if not isinstance(request, Mapping) or not isinstance(request.get("observations"), list):
        raise TwinInputError('request: expected {"observations": [...], "candidate": {...}}')
    observations = []
    for n, item in enumerate(request["observations"]):
        measured = item.get("measured") if isinstance(item, Mapping) else None
        if not isinstance(measured, Mapping):
            raise TwinInputError(f"observations[{n}].measured: expected an object of metrics")
        observations.append((_shape(item, f"observations[{n}]"), measured))
    constants = fit(observations)
    return {"fit": constants.as_json(), "predicted": predict(constants, _shape(request.get("candidate"), "candidate"))}
