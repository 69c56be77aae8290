"""A run sharded over worker processes: merged records, one clock, shared cap, failures surface."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from test_loadgen_e2e import TinyServer

from autotune.bench.bodies import RequestShape
from autotune.bench.dispatch import Shard
from autotune.bench.loadgen import BenchResult, auto_workers, run_workload
from autotune.bench.plan import Session, Turn
from autotune.bench.workers import WorkerJob, WorkerPool, make_shards, split_concurrency
from autotune.config import Workload, parse_model
from autotune.errors import BenchmarkError

pytestmark = pytest.mark.slow  # each run spawns interpreters (about a second each here)


@pytest.mark.sim
def test_sharded_run_merges_every_record_on_one_clock() -> None:
    server = TinyServer(token_delay_s=0.002)
    w = parse_model(
        Workload,
        {
            "num_prompts": 30,
            "warmup_requests": 4,
            "dataset": {"input_len": 24, "output_len": 6},
            "arrival": {"concurrency": 6, "request_rate": 300},
        },
        "test",
    )

    async def go() -> BenchResult:
        srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        async with srv:
            return await run_workload(f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}", w, workers=2)

    res = asyncio.run(go())
    assert res.client_workers == 2 and server.completions == 34
    assert res.metrics["completed"] == 30 and res.metrics["failed"] == 0
    assert [r.session for r in res.records] == list(range(30))
    starts = [r.start_time for r in res.records]
    ends = [r.end_time for r in res.records]
    # Both workers' timestamps fit inside the one duration measured from the common start.
    assert max(ends) - min(starts) <= res.duration_s
    assert all(len(r.itl) == 5 for r in res.records)
    events = sorted([(r.start_time, 1) for r in res.records] + [(r.end_time, -1) for r in res.records])
    in_flight = peak = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak <= 6  # the per-worker caps add up to the workload's cap


@pytest.mark.sim
def test_a_failing_worker_is_one_benchmark_error() -> None:
    bad = Session((Turn({"not", "json"}, 1, 1),))  # type: ignore[arg-type]  # a body that cannot serialize
    job = WorkerJob(
        RequestShape("http://127.0.0.1:9/v1/completions", "m", chat=False),
        tls=False,
        collect_text=False,
        warm_sessions=[],
        warm_concurrency=None,
        shard=Shard([bad], [0], [0.0], None),
        deadline_s=5.0,
    )

    async def go() -> None:
        async with WorkerPool([job]) as pool:
            await pool.start()

    with pytest.raises(BenchmarkError, match="a load-generator worker failed: TypeError"):
        asyncio.run(go())


def test_shards_deal_sessions_round_robin_and_split_the_cap() -> None:
    sessions = [Session((Turn([i], 1, 1),)) for i in range(7)]
    shards = make_shards(sessions, [0.1 * i for i in range(7)], 3, 8)
    assert [s.session_ids for s in shards] == [[0, 3, 6], [1, 4], [2, 5]]
    assert [s.concurrency for s in shards] == [3, 3, 2]
    assert shards[1].offsets == pytest.approx([0.1, 0.4])
    assert split_concurrency(None, 2) == [None, None]


@pytest.mark.parametrize(
    ("arrival", "num_prompts", "cpus", "expected"),
    [
        ({"concurrency": 32}, 200, 8, 1),
        ({"concurrency": 256}, 1000, 8, 6),
        ({"concurrency": 256}, 1000, 2, 2),
        ({}, 100, 8, 3),  # all at once: every request is a stream
        ({"request_rate": 100}, 1000, 8, 1),
        ({"request_rate": 400}, 1000, 8, 3),
        ({"ramp_up": {"strategy": "linear", "start_rps": 10, "end_rps": 700}}, 1000, 16, 5),
        ({"concurrency": 4096}, 10_000, 64, 8),
    ],
)
def test_auto_workers_follow_the_load(arrival: dict[str, Any], num_prompts: int, cpus: int, expected: int) -> None:
    w = parse_model(Workload, {"arrival": arrival, "num_prompts": num_prompts}, "t")
    assert auto_workers(w, cpus) == expected
    assert math.isfinite(expected)
