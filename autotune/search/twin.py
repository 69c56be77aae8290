"""The twin in the loop: every trial's numbers predicted before its engine starts, checked after.

The simulator's step model (``autotune_sim/twin.py``) is fitted on the runs this study already
served on this box — the baseline first, then every run after it — and asked what the next
configuration will serve. The tuner never imports the simulator: it runs ``python -m autotune_sim
twin`` (the tuner's own interpreter) with JSON in and out, as it does for the error bands.

What a trial records (``TrialRecord.twin``): the prediction and the fit it came from when it
starts, then the measured values and each one's relative error when it ends, so ``status``, the
live run and the report can say how far the twin is off on this box. A workload the step model
does not describe (an open-loop request rate, multi-turn sessions) gets no prediction, and says so.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from collections.abc import Iterable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from autotune.config import Workload
from autotune.search.record import TrialRecord
from autotune.search.stage import Stage

__all__ = [
    "PREDICTED",
    "SCREEN_AFTER",
    "TWIN_METRICS",
    "Pending",
    "Twin",
    "measured_error",
    "median_error",
    "worst_error",
]

#: The stages whose trials the twin predicts: the candidates a search proposes. The baseline and
#: the noise runs are what it is fitted on; probes run another workload; validation re-runs
#: configurations already measured.
PREDICTED = frozenset({Stage.SCENARIO, Stage.SEARCH, Stage.CUDA_GRAPH})
#: What the twin predicts, as the benchmark names it; the first is the headline error.
TWIN_METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")
TIMEOUT_S = 30.0
#: Predictions a study must have checked against its own trials before the twin may screen one.
SCREEN_AFTER = 3


class Twin:
    """Predictions for one study's workload, from the runs recorded so far."""

    def __init__(self, workload: Workload, fixed: Mapping[str, Any]):
        self.workload = workload
        self.fixed = dict(fixed)  # the knobs every trial runs with (engine and space fixed)
        self.unmodelled = _unmodelled(workload)

    def observation(self, record: TrialRecord) -> dict[str, Any] | None:
        """A served run of the study's workload as the twin's input (None: nothing to fit)."""
        if not record.served_its_workload or self.unmodelled:
            return None
        m = record.metrics
        completed = float(m.get("completed") or 0)
        if completed < 1 or not m.get("total_output_tokens"):
            return None
        shape = self._shape({**self.fixed, **(record.params or {})}, record.facts)
        shape.update(
            requests=int(completed),
            input_len=float(m.get("total_input_tokens", 0)) / completed,
            output_len=float(m["total_output_tokens"]) / completed,
        )
        return {**shape, "measured": {k: float(m[k]) for k in TWIN_METRICS if k in m}}

    def ask(self, pool: Executor, params: Mapping[str, Any], records: list[TrialRecord]) -> Pending:
        """The prediction for a trial with ``params``, asked on ``pool`` from ``records`` (the runs
        recorded before its launch) while its engine starts."""
        return Pending(pool.submit(self.predict, params, records), dict(params), records)

    def check(self, pending: Pending, metrics: Mapping[str, Any], served: bool, cut: bool) -> dict[str, Any]:
        """The trial's twin record once it ended: the prediction with what was measured. A run
        cut short is compared with the same fit's prediction for the requests it served; a run
        that served nothing is not compared."""
        twin = pending.future.result()
        if "predicted" not in twin or not served:
            return twin
        if cut:
            done = int(metrics.get("completed") or 0)
            partial = self.predict(pending.params, pending.records, requests=done) if done else {}
            if "predicted" not in partial:
                return twin
            return measured_error({**twin, "cut_at": done, "predicted_cut": partial["predicted"]}, metrics)
        return measured_error(twin, metrics)

    def predict(
        self, params: Mapping[str, Any], records: Iterable[TrialRecord], requests: int | None = None
    ) -> dict[str, Any]:
        """``{"predicted": {...}, "fit": {...}}`` for a trial with ``params`` (over ``requests``
        requests; None: as many as the runs served), or ``{"skipped": why}``."""
        if self.unmodelled:
            return {"skipped": self.unmodelled}
        observations = [o for o in map(self.observation, records) if o is not None]
        if not observations:
            return {"skipped": "no served run of the study's workload to fit on yet"}
        last = observations[-1]
        candidate = self._shape({**self.fixed, **params}, {})
        for key in ("requests", "input_len", "output_len"):
            candidate[key] = last[key]
        if requests is not None:
            candidate["requests"] = requests
        if candidate.get("kv_tokens") is None:
            candidate["kv_tokens"] = _pool_for(params, observations)
        request = {"observations": observations, "candidate": candidate}
        answer = _ask(request)
        if "error" in answer:
            return {"skipped": answer["error"]}
        return {"predicted": answer["predicted"], "fit": answer["fit"], "from_runs": len(observations)}

    def screen(
        self, params: Mapping[str, Any], records: list[TrialRecord], incumbent: float, noise: float
    ) -> dict[str, Any] | None:
        """The twin's answer for a candidate, with ``screened`` saying why when it rules the
        candidate out; None when it may not screen yet (too few trials checked).

        Ruled out: even if the twin's output throughput were as far too low as its largest error
        on this study's trials (:data:`SCREEN_AFTER` checked at least), and the noise favoured
        the candidate, it would still fall below ``incumbent``. A predicted failure rules out
        nothing: the step model does not know the engine's limits.
        """
        worst = worst_error(records)
        if worst is None or worst[1] < SCREEN_AFTER or worst[0] >= 1:
            return None
        answer = self.predict(params, records)
        predicted = (answer.get("predicted") or {}).get("output_throughput")
        if predicted is None or answer["predicted"].get("failure"):
            return answer
        best_case = predicted / (1 - worst[0]) * (1 + noise)
        if best_case >= incumbent:
            return answer
        why = (
            f"the twin predicts {predicted:,.1f} tok/s: even {worst[0]:.0%} low (its largest error over the "
            f"{worst[1]} trials it was checked on) and ±{noise:.1%} noise, {best_case:,.1f} is below the best "
            f"trial's {incumbent:,.1f}"
        )
        return {**answer, "screened": why}

    def _shape(self, knobs: Mapping[str, Any], facts: Mapping[str, Any]) -> dict[str, Any]:
        resolved = facts.get("resolved_knobs") or {}
        return {
            "concurrency": _concurrency(self.workload),
            "lockstep": _lockstep(self.workload),
            "max_running": knobs.get("max_running", resolved.get("max_running")),
            "batched_tokens": knobs.get("batched_tokens", resolved.get("batched_tokens")),
            "kv_tokens": facts.get("kv_tokens"),
            "memory_fraction": knobs.get("memory_fraction"),
        }


@dataclass(frozen=True)
class Pending:
    """A prediction on its way, and what it was asked from (a cut run is compared with the same fit)."""

    future: Future[dict[str, Any]]
    params: dict[str, Any]
    records: list[TrialRecord]

    @classmethod
    def ready(cls, answer: dict[str, Any], params: Mapping[str, Any], records: list[TrialRecord]) -> Pending:
        """A prediction already made (by screening, or a replay of a stored study)."""
        future: Future[dict[str, Any]] = Future()
        future.set_result(answer)
        return cls(future, dict(params), records)


def measured_error(twin: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The trial's twin record completed with what was measured: ``measured`` and each
    predicted metric's relative ``error`` ((predicted − measured) ÷ measured), against the
    prediction for the requests a cut run served when there is one."""
    predicted = twin.get("predicted_cut") or twin.get("predicted") or {}
    measured = {k: float(metrics[k]) for k in TWIN_METRICS if k in metrics}
    error = {
        k: (float(predicted[k]) - v) / v
        for k, v in measured.items()
        if v > 0 and isinstance(predicted.get(k), int | float) and math.isfinite(predicted[k])
    }
    return {**twin, "measured": measured, "error": error}


def _errors(records: Iterable[TrialRecord], metric: str) -> list[float]:
    return [abs(float(e)) for r in records if (e := (r.twin or {}).get("error", {}).get(metric)) is not None]


def median_error(records: Iterable[TrialRecord], metric: str = TWIN_METRICS[0]) -> tuple[float, int] | None:
    """The median |error| of the twin's ``metric`` over the trials it predicted and that were
    measured, and how many; None before the first."""
    errors = _errors(records, metric)
    return (statistics.median(errors), len(errors)) if errors else None


def worst_error(records: Iterable[TrialRecord], metric: str = TWIN_METRICS[0]) -> tuple[float, int] | None:
    """The largest |error| of the twin's ``metric`` over the trials it was checked on, and how many."""
    errors = _errors(records, metric)
    return (max(errors), len(errors)) if errors else None


def _concurrency(workload: Workload) -> int:
    arrival = workload.arrival
    return int(arrival.concurrency or workload.num_prompts)


def _lockstep(workload: Workload) -> bool:
    """Whether every request has the same length (the closed loop then runs in waves)."""
    d = workload.dataset
    return d.kind == "random" and d.input is None and d.output is None and d.range_ratio == 0


def _unmodelled(workload: Workload) -> str | None:
    """Why the step model does not describe this workload (None: it does)."""
    if workload.dataset.kind == "multi_turn":
        return "multi-turn sessions are not modelled by the twin"
    arrival = workload.arrival
    if arrival.ramp_up is not None or not math.isinf(arrival.request_rate):
        return "an open-loop request rate is not modelled by the twin (a closed loop of streams is)"
    return None


def _pool_for(params: Mapping[str, Any], observations: list[dict[str, Any]]) -> int | None:
    """The candidate's KV pool: a run's with the same memory fraction, else the latest run's."""
    fraction = params.get("memory_fraction")
    same = [o for o in observations if o.get("kv_tokens") and o.get("memory_fraction") == fraction]
    pool = (same or observations)[-1].get("kv_tokens")
    return int(pool) if pool else None


def _ask(request: Mapping[str, Any]) -> dict[str, Any]:
    """The simulator's answer, or ``{"error": why}`` (the command failed: the trial runs anyway)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "autotune_sim", "twin"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as err:
        return {"error": f"the twin did not answer: {err}"}
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
        return {"error": lines[-1]}
    try:
        answer = json.loads(proc.stdout)
    except ValueError:
        return {"error": "the twin's answer is not JSON"}
    return answer if isinstance(answer, dict) else {"error": "the twin's answer is not an object"}
