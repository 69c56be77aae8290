"""Our metrics are ``vllm bench serve``'s: the same request records give the same numbers.

Live comparisons of the two clients on one engine are limited by the engine's run-to-run noise
(see ``benchmarks/README.md``). This test removes the engine: one set of request records, with
failures, single-token answers and long tails, goes through our ``compute_metrics`` and through
``calculate_metrics`` of the installed vLLM (in its own venv; the tuner never imports vLLM), and
every metric both report must match to float precision.
"""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from autotune.bench.metrics import RequestRecord, compute_metrics

pytestmark = pytest.mark.real_engine

PERCENTILES = [50.0, 90.0, 95.0, 99.0, 99.9]
GOODPUT = {"ttft": 400.0, "tpot": 30.0, "e2el": 3000.0}

# Runs in the vLLM venv: records as JSON on stdin, vLLM's metrics as JSON on stdout.
VLLM_SIDE = """
import contextlib, dataclasses, json, sys
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
from vllm.benchmarks.serve import calculate_metrics
job = json.load(sys.stdin)
outputs = [RequestFuncOutput(**r) for r in job["records"]]
with contextlib.redirect_stdout(sys.stderr):  # vLLM prints failures and plotting tips
    metrics, _ = calculate_metrics([], outputs, job["duration"], None, job["percentiles"], job["goodput"])
out = {}
for key, value in dataclasses.asdict(metrics).items():
    if key.startswith("percentiles_"):
        for p, v in value:
            word = str(int(p)) if int(p) == p else str(p)
            out[f"p{word}_" + key.removeprefix("percentiles_")] = v
    else:
        out[key] = value
print(json.dumps(out))
"""


def _records(n: int, seed: int) -> list[RequestRecord]:
    rng = random.Random(seed)
    records = []
    for i in range(n):
        start = rng.uniform(0, 20)
        if i % 17 == 5:  # a failed request
            records.append(RequestRecord(success=False, error="boom", prompt_len=100, start_time=start))
            continue
        out = 1 if i % 23 == 7 else rng.randint(2, 200)  # single-token answers have no TPOT
        ttft = rng.lognormvariate(-2.0, 1.0)
        itl = [rng.expovariate(1 / 0.02) for _ in range(out - 1)]
        records.append(
            RequestRecord(
                success=True,
                prompt_len=rng.randint(16, 2048),
                output_tokens=out,
                ttft=ttft,
                itl=itl,
                latency=ttft + sum(itl),
                start_time=start,
                n_chunks=out,
            )
        )
    return records


def _vllm_metrics(vllm_python: str, records: list[RequestRecord], duration: float) -> dict[str, float]:
    job = {
        "records": [
            {
                "success": r.success,
                "error": r.error,
                "prompt_len": r.prompt_len,
                "output_tokens": r.output_tokens,
                "ttft": r.ttft,
                "itl": r.itl,
                "latency": r.latency,
                "start_time": r.start_time,
            }
            for r in records
        ],
        "duration": duration,
        "percentiles": PERCENTILES,
        "goodput": GOODPUT,
    }
    proc = subprocess.run(
        [vllm_python, "-c", VLLM_SIDE], input=json.dumps(job), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("seed", [0, 1])
def test_same_records_give_vllm_bench_serves_numbers(vllm_python: str, seed: int) -> None:
    records = _records(400, seed)
    duration = 23.5
    theirs = _vllm_metrics(vllm_python, records, duration)
    ours = compute_metrics(records, duration, percentiles=PERCENTILES, goodput_slos=GOODPUT)
    renamed = {"total_input": "total_input_tokens", "total_output": "total_output_tokens"}
    compared = []
    for key, value in theirs.items():
        mine = ours.get(renamed.get(key, key))
        if mine is None:
            continue
        assert mine == pytest.approx(value, rel=1e-9, abs=1e-9), key
        compared.append(key)
    # Every headline metric took part, not just whatever happened to share a name.
    must = {"output_throughput", "request_goodput", "mean_ttft_ms", "p99_tpot_ms", "p99.9_itl_ms", "median_e2el_ms"}
    assert must <= set(compared), sorted(set(theirs) - set(compared))
    assert {"max_output_tokens_per_s", "max_concurrent_requests", "failed", "total_input"} <= set(compared)
