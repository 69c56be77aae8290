"""What a load-generator run returns: the measured result, progress snapshots, and the JSON form."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from autotune.bench.metrics import CLIENT, RequestRecord, latency_stats, workload_percentiles
from autotune.bench.prompts import PromptFormat
from autotune.bench.selfcheck import ClientCheck
from autotune.config import Workload

__all__ = ["SCHEMA_VERSION", "BenchProgress", "BenchResult"]

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class BenchProgress:
    """A progress snapshot passed to ``on_progress`` (at most every 0.25 s, and at each phase end).

    Attributes:
        phase: ``warmup`` or ``measure``.
        completed: Requests finished (successful or not) in this phase.
        failed: Of those, how many failed.
        total: Requests in this phase.
        elapsed_s: Seconds since the phase started.
        output_throughput: Token chunks received per second so far (≈ tokens/s; exact token
            counts arrive only with each request's final usage chunk).
    """

    phase: str
    completed: int
    failed: int
    total: int
    elapsed_s: float
    output_throughput: float


@dataclass
class BenchResult:
    """The outcome of one run.

    Attributes:
        metrics: ``compute_metrics`` output (vLLM key names).
        records: One record per measured request, in dispatch order.
        duration_s: Dispatch + gather time (modelled seconds against the simulator, see ``sim_clock``).
        model: Served model id used in the requests.
        workload: The workload that was run.
        prompt_format: ``ids`` or ``text``.
        client: The client self-check.
        clamped_requests: Successful requests whose ``usage.completion_tokens`` differs from
            ``max_tokens`` (vLLM clamps silently when prompt + max_tokens exceeds the context).
        prompt_len_mismatches: Successful completions whose ``usage.prompt_tokens`` differs from
            the planned length.
        prompts_off_target: Text prompts that did not re-tokenize to their planned length.
        deadline_hit: The whole-run deadline cut the run short.
        warmup_failed: Warm-up requests that failed.
        max_model_len: The server's context length, when its ``/tokenize`` reported it.
        num_sessions: Sessions of the run (= requests for single-turn datasets).
        salt: The prompt-content salt of the run (0: the seed's own content; by default a random
            one per run, so runs in different processes send different texts).
        prefix_cache_reset: The route that reset the engine's prefix cache before the run,
            ``"unsupported"``, ``"failed: ..."``, or None when the workload did not ask.
        warnings: One line each for a caller to print: a prefix cache that could not be reset
            although the workload asked for it, requests the client lost.
        client_workers: Event loops (processes) that generated the load.
        client_cpu_s: CPU seconds the event-loop threads spent on the measured run, all workers.
        date: Local start time, ``YYYYmmdd-HHMMSS`` as vLLM writes it.
        sim_clock: For a run against the simulator, measured in its modelled time:
            ``speedup`` (asked), ``achieved_speedup`` (modelled over wall duration) and
            ``wall_duration_s``; None for a real engine (wall-clock times).
        early_stop: Why the run ended early (``reason``, ``at_requests``, ``evidence``; see
            :mod:`autotune.bench.earlystop`), or None for a run that went to its end. A stopped
            run's records and metrics are the requests that finished before the stop.
    """

    metrics: dict[str, float | int]
    records: list[RequestRecord]
    duration_s: float
    model: str
    workload: Workload
    prompt_format: PromptFormat
    client: ClientCheck
    clamped_requests: int = 0
    prompt_len_mismatches: int = 0
    prompts_off_target: int = 0
    deadline_hit: bool = False
    warmup_failed: int = 0
    max_model_len: int | None = None
    num_sessions: int = 0
    salt: int = 0
    prefix_cache_reset: str | None = None
    warnings: list[str] = field(default_factory=list)
    client_workers: int = 1
    client_cpu_s: float = 0.0
    date: str = field(default_factory=lambda: datetime.now().strftime("%Y%m%d-%H%M%S"))
    early_stop: dict[str, Any] | None = None
    sim_clock: dict[str, float] | None = None

    @property
    def client_limited(self) -> bool:
        """Whether the client may have limited the run (see :class:`ClientCheck`)."""
        return self.client.limited

    @property
    def client_limited_reason(self) -> str:
        return self.client.reason

    @property
    def client_limited_kind(self) -> str:
        """``starved``, ``cpu_bound``, ``schedule_behind`` or "" (see :class:`ClientCheck`)."""
        return self.client.kind

    @property
    def client_failures(self) -> int:
        """Requests that failed on the client side (transport, local timeout, run deadline), after
        the one retry of a request that never reached the server. They are not in ``error_rate``;
        a run with any is no clean measurement of the engine, and a tuner should discard it rather
        than score the configuration by it."""
        return sum(not r.success and r.failure_side == CLIENT for r in self.records)

    @property
    def retried_requests(self) -> int:
        """Requests sent a second time because the first attempt never reached the server."""
        return sum(r.retried for r in self.records)

    def to_json(self, *, detailed: bool = False) -> dict[str, Any]:
        """A JSON-ready dict: ``vllm bench serve``'s result keys at the top level, then ours.

        NaN statistics (no successful request) are written as ``null``. ``failed`` counts every
        failed request (as vLLM's); ``failed_engine`` + ``failed_client`` split it by side and
        ``error_rate`` counts the engine's side only. Ours include ``client_failures`` (=
        ``failed_client``), ``client_error_samples``, ``retried_requests``, ``salt``,
        ``warnings`` and ``client_limited_kind``.

        Args:
            detailed: Add vLLM's per-request arrays (``input_lens``, ``ttfts``, ``itls``, ...).
        """
        w = self.workload
        out: dict[str, Any] = {
            "date": self.date,
            "endpoint_type": _backend(w),
            "backend": _backend(w),
            "label": w.name,
            "model_id": self.model,
            "tokenizer_id": self.model,  # the server's own tokenizer built the prompts
            "num_prompts": w.num_prompts,
            "request_rate": "inf" if math.isinf(w.arrival.request_rate) else w.arrival.request_rate,
            "burstiness": w.arrival.burstiness,
            "max_concurrency": w.arrival.concurrency,
            **_ramp(w),
            "request_goodput": None,  # vLLM writes null without --goodput; metrics overwrite it
            **self.metrics,
            **self._queue_stats(),
            **self._extras(),
        }
        if detailed:
            out.update(self._per_request())
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in out.items()}

    def _queue_stats(self) -> dict[str, float]:
        """vLLM's client-queue statistics, reported (as in vLLM) only with a concurrency cap."""
        w = self.workload
        if w.arrival.concurrency is None:
            return {}
        ok = [r for r in self.records if r.success]
        ps = workload_percentiles(w.slos)
        stats = latency_stats("client_queue_time", [r.client_queue_time for r in ok], ps)
        if not math.isinf(w.arrival.request_rate):
            incl = [r.latency + r.client_queue_time for r in ok]
            stats.update(latency_stats("e2el_including_client_queue", incl, ps))
        return stats

    def _extras(self) -> dict[str, Any]:
        w, c = self.workload, self.client
        return {
            "schema_version": SCHEMA_VERSION,
            "seed": w.seed,
            "salt": self.salt,
            **_dataset(w),
            "num_requests": len(self.records),
            "num_sessions": self.num_sessions,
            "prompt_format": self.prompt_format,
            "prefix_cache_reset": self.prefix_cache_reset,
            "warnings": list(self.warnings),
            "warmup_requests": w.warmup_requests,
            "warmup_failed": self.warmup_failed,
            "clamped_requests": self.clamped_requests,
            "prompt_len_mismatches": self.prompt_len_mismatches,
            "prompts_off_target": self.prompts_off_target,
            "deadline_hit": self.deadline_hit,
            "max_model_len": self.max_model_len,
            "client_workers": self.client_workers,
            "client_cpu_s": self.client_cpu_s,
            "client_limited": c.limited,
            "client_limited_reason": c.reason,
            "client_limited_kind": c.kind,
            "client_lag_tolerance_ms": c.lag_tolerance_ms,
            "client_cpu_share": c.cpu_share,
            "p99_schedule_lag_ms": c.p99_schedule_lag_ms,
            "p99_loop_lag_ms": c.p99_loop_lag_ms,
            "max_loop_lag_ms": c.max_loop_lag_ms,
            "error_samples": _error_samples(self.records),
            "client_failures": self.client_failures,
            "client_error_samples": _error_samples([r for r in self.records if r.failure_side == CLIENT]),
            "retried_requests": self.retried_requests,
            "retry_samples": _retry_samples(self.records),
            "early_stop": self.early_stop,
            "clock": "modelled" if self.sim_clock is not None else "wall",
            "sim_clock": self.sim_clock,
        }

    def _per_request(self) -> dict[str, list[Any]]:
        rs = self.records
        return {
            "input_lens": [r.prompt_len for r in rs],
            "output_lens": [r.output_len if r.success else 0 for r in rs],
            "ttfts": [r.ttft for r in rs],
            "itls": [r.itl for r in rs],
            "latencies": [r.latency for r in rs],
            "start_times": [r.start_time for r in rs],
            "queue_times": [r.client_queue_time for r in rs],
            "schedule_lags": [r.schedule_lag for r in rs],
            "errors": [r.error for r in rs],
            "failure_sides": [r.failure_side for r in rs],
            "retried": [r.retried for r in rs],
            "retry_delays": [r.retry_delay_s for r in rs],
            "session_ids": [r.session for r in rs],
            "turn_ids": [r.turn for r in rs],
        }


def _ramp(w: Workload) -> dict[str, Any]:
    """vLLM writes the ramp-up keys only for a ramp-up run."""
    ramp = w.arrival.ramp_up
    if ramp is None:
        return {}
    return {"ramp_up_strategy": ramp.strategy, "ramp_up_start_rps": ramp.start_rps, "ramp_up_end_rps": ramp.end_rps}


def _dataset(w: Workload) -> dict[str, Any]:
    d = w.dataset
    return {
        "dataset": d.kind,
        "input_len": d.input_len,
        "output_len": d.output_len,
        "range_ratio": d.range_ratio,
        "input_dist": d.input_dist.model_dump(),
        "output_dist": d.output_dist.model_dump(),
        "prefix_len": d.prefix_len,
        "num_prefixes": d.num_prefixes,
        "turns": d.turns.model_dump() if d.turns is not None else None,
        "think_time_s": d.think_time_s,
    }


def _backend(w: Workload) -> str:
    return "openai" if w.endpoint == "completions" else "openai-chat"


def _count_top(texts: Sequence[str], limit: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for text in texts:
        if text:
            counts[text] = counts.get(text, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:limit])


def _error_samples(records: Sequence[RequestRecord], limit: int = 5) -> dict[str, int]:
    return _count_top([r.error for r in records], limit)


def _retry_samples(records: Sequence[RequestRecord], limit: int = 3) -> dict[str, int]:
    """Why first attempts failed, for the retried requests."""
    return _count_top([r.retry_error for r in records if r.retried], limit)
