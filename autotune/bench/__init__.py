"""The load generator, its metrics and Prometheus scraping.

``run_workload`` drives a :class:`~autotune.config.Workload` against an OpenAI-compatible server
with ``vllm bench serve``'s exact semantics (arrivals, timing, metric definitions, JSON keys);
``search_capacity`` finds the highest load whose SLOs hold; ``prometheus`` reads engine-side
counters around a run. Nothing here imports the engine or the search layer.
"""

from __future__ import annotations

from autotune.bench import prometheus
from autotune.bench.arrivals import arrival_offsets, schedule
from autotune.bench.capacity import CapacityResult, CapacityRun, search_capacity, search_capacity_async
from autotune.bench.loadgen import auto_workers, run_workload, run_workload_sync
from autotune.bench.metrics import (
    DEFAULT_PERCENTILES,
    RequestRecord,
    compute_metrics,
    request_slos,
    slo_violations,
)
from autotune.bench.prompts import Prompt, PromptSet, ServerTokenizer, build_prompts
from autotune.bench.result import BenchProgress, BenchResult
from autotune.bench.selfcheck import ClientCheck
from autotune.bench.transport import ClientLanes, make_client

__all__ = [
    "DEFAULT_PERCENTILES",
    "BenchProgress",
    "BenchResult",
    "CapacityResult",
    "CapacityRun",
    "ClientCheck",
    "ClientLanes",
    "Prompt",
    "PromptSet",
    "RequestRecord",
    "ServerTokenizer",
    "arrival_offsets",
    "auto_workers",
    "build_prompts",
    "compute_metrics",
    "make_client",
    "prometheus",
    "request_slos",
    "run_workload",
    "run_workload_sync",
    "schedule",
    "search_capacity",
    "search_capacity_async",
    "slo_violations",
]
