"""Per-request records and the aggregate metrics of one run, as ``vllm bench serve`` defines them.

The definitions follow ``calculate_metrics`` in vLLM's ``benchmarks/serve.py`` (0.32) so that one
parser reads our JSON and vLLM's, and the numbers mean the same thing:

* TTFT is the first chunk that carries a choice; ITL is every later chunk gap, pooled over the
  successful requests (per chunk, not per token); E2EL is the last token chunk minus the send.
* TPOT = (E2EL − TTFT) / (n − 1), only for requests with n > 1 output tokens.
* Throughputs count successful requests only and divide by the run duration (dispatch + gather).
* Percentiles are ``np.percentile`` (linear interpolation); std is the population std (ddof 0).
* Goodput counts a request as good when every chosen per-request metric is ≤ its bound
  (TPOT counts as 0 when n ≤ 1).

Deliberate differences:

* vLLM reports a statistic over an empty set as 0 (``np.mean(x or 0)``), which reads as a
  perfect latency to an optimiser. Here it is NaN, and ``BenchResult.to_json`` writes it as
  ``null``.
* Each failed request says which side failed (``failure_side``): ``engine`` when the server
  answered with a failure (HTTP status, an error event, no tokens), ``client`` when the client or
  the transport failed (a write into a connection the server had closed, a connection lost
  before or during the answer, a local timeout). ``failed`` still counts both (as vLLM's does);
  ``error_rate`` counts engine-side failures only, over the requests the engine got to answer,
  because a request the client lost says nothing about the engine's configuration.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from autotune.config import LATENCY_KEY

__all__ = [
    "CLIENT",
    "DEFAULT_PERCENTILES",
    "ENGINE",
    "GOODPUT_METRICS",
    "FailureSide",
    "RequestRecord",
    "compute_metrics",
    "latency_stats",
    "percentile_key",
    "request_slos",
    "slo_violations",
    "workload_percentiles",
]

DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99)
# Per-request metrics vLLM's --goodput accepts (bounds in milliseconds).
GOODPUT_METRICS = ("ttft", "tpot", "e2el")

FailureSide = Literal["", "engine", "client"]
ENGINE: FailureSide = "engine"  # the server answered, with a failure
CLIENT: FailureSide = "client"  # the client or the transport failed; the engine gave no verdict


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it. Times are ``time.monotonic()`` seconds (one clock for
    every process on the machine, so records of worker processes can be merged); against the
    simulator they are its modelled seconds (:mod:`autotune.bench.simclock`), except
    ``sent_time`` and ``wall_end_time``, which are always the wall clock.

    Attributes:
        success: HTTP 200, at least one chunk with choices, and no error event in the stream.
        error: One line saying why the request failed ("" on success).
        failure_side: ``engine`` (HTTP status other than 200, an error event or a malformed
            stream, no token chunk) or ``client`` (connection lost or refused by the transport,
            write into a closed connection, local timeout, run deadline); "" on success.
        retried: The first attempt never reached the server (no response byte) and the request
            was sent once more on a fresh connection; timings are the retry's.
        retry_delay_s: Seconds from the first attempt's send to the retry's send.
        retry_error: Why the first attempt failed ("" when not retried).
        prompt_len: Prompt tokens; the planned length until the server's ``usage`` overwrites it.
        expected_prompt_len: The prompt length the prompt builder aimed for (0 when unknown).
        expected_output_len: ``max_tokens`` sent with the request.
        output_tokens: ``usage.completion_tokens`` (0 when the server sent no usage).
        ttft: First token chunk minus ``start_time``.
        itl: Gaps between consecutive token chunks.
        latency: Last token chunk minus ``start_time`` (usage and ``[DONE]`` excluded).
        start_time: Just before the request was sent (after the concurrency semaphore); for a
            retried request, just before the retry was sent.
        first_token_time: Arrival of the first token chunk.
        end_time: Arrival of the last token chunk.
        sent_time: Monotonic time the request (its retry, when retried) was sent.
        wall_end_time: Monotonic time the last token chunk arrived.
        client_queue_time: Time spent waiting for the concurrency semaphore (a retry's delay
            excluded).
        schedule_lag: How late the request left against its planned arrival time.
        n_chunks: Chunks with non-empty ``choices`` (token events).
        n_empty_chunks: Token events whose text was empty (chat role chunk, partial UTF-8).
        usage_seen: Whether a usage chunk arrived.
        session: Index of the request's session (of the request itself, for single-turn runs).
        turn: Index of the request within its session (0 for single-turn runs).
    """

    success: bool = False
    error: str = ""
    failure_side: FailureSide = ""
    retried: bool = False
    retry_delay_s: float = 0.0
    retry_error: str = ""
    prompt_len: int = 0
    expected_prompt_len: int = 0
    expected_output_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    first_token_time: float = 0.0
    end_time: float = 0.0
    sent_time: float = 0.0
    wall_end_time: float = 0.0
    client_queue_time: float = 0.0
    schedule_lag: float = 0.0
    n_chunks: int = 0
    n_empty_chunks: int = 0
    usage_seen: bool = False
    session: int = 0
    turn: int = 0

    @property
    def output_len(self) -> int:
        """Output tokens as vLLM counts them: ``usage.completion_tokens``.

        vLLM falls back to re-tokenizing the generated text with a local tokenizer; we keep no
        tokenizer on the client, so the fallback is the number of token chunks (one token per
        chunk on both engines without speculative decoding), at least 1 as in vLLM.
        """
        return self.output_tokens or max(self.n_chunks, 1)

    @property
    def tpot(self) -> float | None:
        """(latency − ttft) / (n − 1) for n > 1 output tokens, else None."""
        n = self.output_len
        return (self.latency - self.ttft) / (n - 1) if n > 1 else None


def percentile_key(p: float, metric: str) -> str:
    """vLLM's key for a percentile: ``p99_ttft_ms``, ``p99.9_itl_ms``."""
    word = str(int(p)) if int(p) == p else str(p)
    return f"p{word}_{metric}_ms"


def latency_stats(metric: str, seconds: Sequence[float], percentiles: Iterable[float]) -> dict[str, float]:
    """Mean, median, std and percentiles of ``seconds``, in ms, under vLLM's key names.

    Args:
        metric: Short metric name (``ttft``, ``tpot``, ``itl``, ``e2el``, ``client_queue_time``).
        seconds: Samples in seconds.
        percentiles: Percentiles to report (0–100).

    Returns:
        ``{mean_<m>_ms, median_<m>_ms, std_<m>_ms, p<P>_<m>_ms...}``; NaN values when empty.
    """
    ps = list(percentiles)
    if len(seconds) == 0:
        nan = math.nan
        return {
            f"mean_{metric}_ms": nan,
            f"median_{metric}_ms": nan,
            f"std_{metric}_ms": nan,
            **{percentile_key(p, metric): nan for p in ps},
        }
    ms = np.asarray(seconds, dtype=float) * 1000.0
    stats = {
        f"mean_{metric}_ms": float(np.mean(ms)),
        f"median_{metric}_ms": float(np.median(ms)),
        f"std_{metric}_ms": float(np.std(ms)),
    }
    if ps:
        values = np.percentile(ms, ps)
        stats.update({percentile_key(p, metric): float(v) for p, v in zip(ps, values, strict=True)})
    return stats


def _is_good(record: RequestRecord, bounds_s: Mapping[str, float]) -> bool:
    values = {"ttft": record.ttft, "tpot": record.tpot or 0.0, "e2el": record.latency}
    return all(values[name] <= bound for name, bound in bounds_s.items())


def _goodput_count(ok: Sequence[RequestRecord], slos_ms: Mapping[str, float]) -> int:
    unknown = sorted(set(slos_ms) - set(GOODPUT_METRICS))
    if unknown:
        raise ValueError(f"unknown goodput metric(s) {unknown}; use {', '.join(GOODPUT_METRICS)}")
    bounds_s = {name: bound / 1000.0 for name, bound in slos_ms.items()}
    return sum(_is_good(r, bounds_s) for r in ok)


def _token_times(record: RequestRecord) -> np.ndarray:
    """Arrival time of every token chunk, rebuilt from ttft and itl as vLLM does."""
    gaps = np.concatenate(([record.start_time + record.ttft], record.itl))
    return np.cumsum(gaps)


def _peaks(ok: Sequence[RequestRecord]) -> tuple[float, int]:
    """Peak output chunks/s and peak concurrent requests over 1-s buckets (vLLM l.672–730)."""
    if not ok:
        return 0.0, 0
    t0 = min(r.start_time for r in ok)
    t1 = max(r.start_time + r.latency for r in ok)
    n_buckets = math.ceil(t1 - t0) + 1
    times = np.concatenate([_token_times(r) for r in ok]) - t0
    buckets = times.astype(np.int64)
    buckets = buckets[(buckets >= 0) & (buckets < n_buckets)]
    tokens = np.bincount(buckets, minlength=n_buckets)
    # A request is active in every bucket from its start second to its end second inclusive.
    active = np.zeros(n_buckets + 1, dtype=np.int64)
    for r in ok:
        active[int(r.start_time - t0)] += 1
        active[int(r.start_time + r.latency - t0) + 1] -= 1
    return float(tokens.max()), int(np.cumsum(active)[:n_buckets].max())


def compute_metrics(
    records: Sequence[RequestRecord],
    duration_s: float,
    *,
    percentiles: Iterable[float] = DEFAULT_PERCENTILES,
    goodput_slos: Mapping[str, float] | None = None,
) -> dict[str, float | int]:
    """Aggregate per-request records into ``vllm bench serve``'s metrics.

    Args:
        records: Every measured request, failed ones included (warm-up excluded).
        duration_s: Seconds from just before the first dispatch to after the last request ended.
        percentiles: Percentiles reported for each latency metric.
        goodput_slos: Per-request bounds in ms keyed ``ttft``/``tpot``/``e2el`` (vLLM's
            ``--goodput``); ``request_goodput`` is present only when given.

    Returns:
        A flat dict with vLLM's JSON key names (``completed``, ``failed``, ``output_throughput``,
        ``p99_ttft_ms`` ...), ``failed_engine`` and ``failed_client`` (``failed`` split by side),
        ``error_rate`` (engine-side failures over the requests not lost by the client) and
        ``mean_tokens_per_chunk``.

    Raises:
        ValueError: ``duration_s`` is not positive, or a goodput metric is unknown.
    """
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0 (got {duration_s})")
    ps = list(percentiles)
    ok = [r for r in records if r.success]
    failed = len(records) - len(ok)
    failed_client = sum(not r.success and r.failure_side == CLIENT for r in records)
    failed_engine = failed - failed_client  # a failure without a side is the engine's (conservative)
    answerable = len(records) - failed_client
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    chunks = sum(r.n_chunks for r in ok)
    peak_tokens, peak_concurrency = _peaks(ok)
    metrics: dict[str, float | int] = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": failed,
        "failed_engine": failed_engine,
        "failed_client": failed_client,
        "error_rate": failed_engine / answerable if answerable else 0.0,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s,
        "output_throughput": total_out / duration_s,
        "total_token_throughput": (total_in + total_out) / duration_s,
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_concurrency,
        # >1 means several tokens per chunk (speculative decoding, SGLang --stream-interval):
        # then ITL (per chunk) is larger than TPOT (per token).
        "mean_tokens_per_chunk": total_out / chunks if chunks else math.nan,
    }
    if goodput_slos:
        metrics["request_goodput"] = _goodput_count(ok, goodput_slos) / duration_s
    tpots = [t for r in ok if (t := r.tpot) is not None]
    itls = [gap for r in ok for gap in r.itl]
    for name, values in (
        ("ttft", [r.ttft for r in ok]),
        ("tpot", tpots),
        ("itl", itls),
        ("e2el", [r.latency for r in ok]),
    ):
        metrics.update(latency_stats(name, values, ps))
    return metrics


def workload_percentiles(slos: Mapping[str, float]) -> list[float]:
    """The default percentiles plus every percentile an SLO names, so each SLO can be checked.

    ``{"p97_ttft_ms": 800}`` gives ``[50, 90, 95, 97, 99]``.
    """
    ps = set(DEFAULT_PERCENTILES)
    for key in slos:
        match = LATENCY_KEY.match(key)
        if match is not None and match.group(1).startswith("p"):
            ps.add(float(match.group(1)[1:]))
    return sorted(ps)


def request_slos(slos: Mapping[str, float]) -> dict[str, float]:
    """Per-request goodput bounds from a workload's aggregate SLOs.

    ``{"p95_ttft_ms": 500, "p99_ttft_ms": 800, "mean_tpot_ms": 40}`` gives
    ``{"ttft": 500, "tpot": 40}``: a request is good when it meets the tightest bound named for
    each metric. ITL bounds are left out because vLLM's goodput has no per-request ITL.
    """
    bounds: dict[str, float] = {}
    for key, bound in slos.items():
        match = LATENCY_KEY.match(key)
        if match is None or match.group(3) not in GOODPUT_METRICS:
            continue
        name = match.group(3)
        bounds[name] = min(bound, bounds.get(name, math.inf))
    return bounds


def slo_violations(metrics: Mapping[str, float | int | None], slos: Mapping[str, float]) -> dict[str, float]:
    """Which SLO bounds a run missed, and by how much.

    Args:
        metrics: A metrics dict (``compute_metrics`` output or ``BenchResult.to_json()``).
        slos: Upper bounds keyed like the metrics, e.g. ``{"p95_ttft_ms": 1000}``.

    Returns:
        ``{key: measured − bound}`` for each bound that was exceeded. A missing, null or NaN
        metric (no successful request, percentile not computed) counts as ``inf``: a run
        without the measurement must never pass its SLO.
    """
    over: dict[str, float] = {}
    for key, bound in slos.items():
        value = metrics.get(key)
        if value is None or math.isnan(value):
            over[key] = math.inf
        elif value > bound:
            over[key] = float(value) - bound
    return over
