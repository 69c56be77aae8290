"""The vLLM dialect: ``python -m autotune_sim vllm --model M [vLLM flags]``.

It behaves as ``vllm serve`` / ``python -m vllm.entrypoints.openai.api_server`` does (facts in
``reference/vllm.md``):

* Log lines ``(APIServer pid=N) INFO MM-DD HH:MM:SS [file.py:line] msg`` on stdout, uvicorn's on
  stderr, in start-up order: version, ``non-default args``, max model len, engine config, model
  loading, ``Available KV cache memory``, ``GPU KV cache size: 442,160 tokens, Maximum concurrency
  for 131,072 tokens per request: 3.37x``, graph capture, ``Starting vLLM server on …``,
  ``Application startup complete.``; then ``Engine 000: Avg prompt throughput …`` every
  ``VLLM_LOG_STATS_INTERVAL`` (10) modelled seconds while busy. Preemptions are never logged.
* The port is bound first and refuses connections until the engine is ready.
* Start-up failures end with ``EngineCore failed to start.`` and exit 1; argparse errors exit 2.
* A runtime death (CUDA OOM under load, injected crash) logs ``EngineCore encountered a fatal
  error.``, turns ``/health`` into 503, ends every stream with ``data: {"error": …}`` and
  ``[DONE]``, and exits with **code 0** about 5 modelled seconds later.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import os
from dataclasses import replace
from typing import Any

from autotune_sim.compile_cache import CompileCache
from autotune_sim.dialects.base import (
    Dialect,
    Router,
    fmt_commas,
    gib,
    modelled_banner,
    new_pool,
    rank_footprint,
    torch_oom,
    ts_vllm,
)
from autotune_sim.dialects.vllm_args import (
    SUPPORTED_VERSIONS,
    ConfigFailure,
    build_parser,
    preprocess,
    resolve,
)
from autotune_sim.dialects.vllm_ipc import MAP_S, IpcFailure, IpcResult, negotiate
from autotune_sim.engine import Engine, Fatal
from autotune_sim.http import Request, Responder
from autotune_sim.memory import (
    FRAGMENTATION,
    GIB,
    VllmMemory,
    VllmMemoryPlan,
    plan_vllm,
    plan_vllm_cpu,
)
from autotune_sim.metrics import CONTENT_TYPE, Exposition
from autotune_sim.openai import EngineGroup, OpenAIServer, ServingConfig
from autotune_sim.perf import GraphMode, PerfModel
from autotune_sim.scheduler import Batch, VllmScheduler
from autotune_sim.settings import this_host_gib
from autotune_sim.stats import EngineStats
from autotune_sim.tokenizer import Tokenizer

__all__ = ["VllmDialect"]

IMPORT_S = 8.0  # Python imports and argument handling before the first line
CORE_START_S = 3.0
COMPILE_S = 14.0
# Loading compiled artifacts still re-traces the model with Dynamo: a warm start cuts compile time
# by 60 %, the upper end of the 37-61 % reported for vLLM's AOT artifacts (vllm#37198).
COMPILE_WARM_S = 0.4 * COMPILE_S
PROFILE_S = 2.0
CAPTURE_S_PER_GRAPH = 0.1
EXIT_AFTER_DEATH_S = 5.0
DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
CORE_FILE = "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py"


class VllmDialect(Dialect):
    """vLLM's process story."""

    name = "vllm"

    # ------------------------------------------------------------------------------ entry
    def main(self, argv: list[str]) -> int:
        version = self.settings.vllm_version
        if version not in SUPPORTED_VERSIONS:
            self.log.write(
                f"autotune simulator: AUTOTUNE_SIM_VLLM_VERSION={version} is not one of "
                f"{', '.join(SUPPORTED_VERSIONS)}",
                stderr=True,
            )
            return 2
        if argv[:1] == ["preload"]:
            from autotune_sim.dialects.vllm_preload import run_preload

            return run_preload(self.settings, self.log, argv[1:])
        argv = preprocess(argv)
        try:
            ns = build_parser(version).parse_args(argv)
        except SystemExit as exc:
            return int(exc.code or 0)
        if ns.help is not None:
            self._print_help(version, ns.help)
            return 0
        return asyncio.run(self._run(ns))

    def _print_help(self, version: str, topic: str) -> None:
        topic_l = topic.lower()
        if topic_l == "all":
            parser = build_parser(version)
        else:
            parser = build_parser(
                version,
                lambda group, flags: group.lower() == topic_l or any(topic_l in f for f in flags),
            )
        self.log.write(parser.format_help())

    # ---------------------------------------------------------------------------- logging
    def _line(
        self, proc: str, pid: int, level: str, where: str, msg: str, stderr: bool = False, flush: bool = True
    ) -> None:
        prefix = f"({proc} pid={pid}) {level} {ts_vllm()} [{where}] "
        self.log.write("\n".join(prefix + part for part in msg.split("\n")), stderr=stderr, flush=flush)

    def api(self, msg: str, where: str = "api_server.py:1972", level: str = "INFO", flush: bool = True) -> None:
        self._line("APIServer", self.pid, level, where, msg, flush=flush)

    def core(self, msg: str, where: str = "core.py:93", level: str = "INFO") -> None:
        self._line("EngineCore_DP0", self.pid + 1, level, where, msg)

    def worker(self, rank: int, msg: str, where: str, level: str = "INFO") -> None:
        if self.cfg.tp * self.cfg.pp == 1:
            self.core(msg, where, level)
        else:
            self._line(f"Worker_TP{rank}", self.pid + 2 + rank, level, where, msg)

    def uvicorn(self, msg: str) -> None:
        self.log.write(f"INFO:     {msg}", stderr=True)

    # ------------------------------------------------------------------------------ story
    async def _run(self, ns: Any) -> int:
        self.pid = os.getpid()
        self.dead = False
        self.rt.on_signals(self._on_signal)
        await self.rt.pause(IMPORT_S)
        s = self.settings
        self.api(
            f"vLLM server version {s.vllm_version}, serving model {ns.model_tag or ns.model}", "api_server.py:1839"
        )
        self.api(modelled_banner(s), "autotune_sim.py:1", level="WARNING")
        try:
            self.cfg = cfg = resolve(ns, s, dict(s.engine_env))
        except ConfigFailure as failure:
            self._api_traceback(failure.lines)
            return 1
        self.api(f"non-default args: {cfg.non_default}", "utils.py:253")
        try:
            sock = self.rt.bind(cfg.host, cfg.port)
        except OSError as exc:
            self._api_traceback([f"OSError: [Errno {exc.errno}] {exc.strerror}"])
            return 1
        self.api(f"Resolved architecture: {cfg.model.architecture}", "model.py:547")
        if cfg.max_model_len is not None:
            self.api(f"Using max model len {cfg.max_model_len}", "model.py:1510")
        if cfg.chunked_prefill:
            self.api(
                f"Chunked prefill is enabled with max_num_batched_tokens={cfg.max_num_batched_tokens}.",
                "scheduler.py:205",
            )
        await self.rt.pause(CORE_START_S)
        self.core(f"Initializing a V1 LLM engine (v{cfg.version}) with config: {self._config_text()}")
        if s.faults.hang_startup:
            await self.rt.hang()
        self.ipc: IpcResult | None = None
        if not await self._weight_source():
            return 1
        plan = self._plan()
        if not await self._start_engine(plan):
            return 1
        await self._serve(sock, plan)
        await asyncio.Event().wait()
        return 0

    def _config_text(self) -> str:
        c = self.cfg
        graphs = {
            "cudagraph_mode": c.cudagraph_mode,
            "cudagraph_capture_sizes": c.capture_sizes,
            "max_cudagraph_capture_size": c.max_capture,
        }
        dtype = "torch.float32" if c.dtype in ("float", "float32") else "torch.bfloat16"
        return (
            f"model='{c.model_name}', speculative_config=None, tokenizer='{c.model_name}', "
            f"skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, trust_remote_code=False, "
            f"dtype={dtype}, max_seq_len={c.max_model_len or c.derived_max_len}, download_dir=None, "
            f"load_format={c.load_format}, tensor_parallel_size={c.tp}, pipeline_parallel_size={c.pp}, "
            f"data_parallel_size={c.dp}, disable_custom_all_reduce=False, quantization={c.quantization}, "
            f"enforce_eager={c.cudagraph_mode == 'NONE'}, kv_cache_dtype={c.kv_dtype}, "
            f"device_config={'cpu' if self.settings.cpu else 'cuda'}, "
            f"seed={c.seed}, served_model_name={c.served_names[0]}, enable_prefix_caching={c.prefix_caching}, "
            f"enable_chunked_prefill={c.chunked_prefill}, compilation_config={graphs}"
        )

    def _plan(self) -> VllmMemoryPlan:
        c, s = self.cfg, self.settings
        self.fp = rank_footprint(c, s.gpu)
        self.memory = VllmMemory(
            gpu=s.gpu,
            fp=self.fp,
            utilization=c.utilization,
            max_batched_tokens=c.max_num_batched_tokens,
            max_num_seqs=c.max_num_seqs,
            capture_sizes=c.capture_sizes if c.graphs_per_size else [],
            graphs_per_size=c.graphs_per_size,
            block_size=c.block_size,
            max_model_len=c.max_model_len,
            derived_max_len=c.derived_max_len,
            kv_cache_memory_bytes=c.kv_cache_memory_bytes,
            num_gpu_blocks_override=c.num_gpu_blocks_override,
            check_free=not c.extensible_kv,
            **self._daemon_memory(),
        )
        if s.cpu:
            return self._plan_cpu()
        plan = plan_vllm(self.memory)
        if c.extensible_kv and plan.failure in (None, "capture_oom"):
            # 0.34's VMM cache is sized after warm-up and capture: capture cannot run out first.
            plan = _extensible(plan, self.memory)
        return plan

    def _plan_cpu(self) -> VllmMemoryPlan:
        """vLLM-CPU's planning against the node's memory (the simulator's setting, else this host's)."""
        s = self.settings
        total, available = (v * GIB for v in (s.host_memory_gib or this_host_gib()))
        space = s.engine_env.get("VLLM_CPU_KVCACHE_SPACE")
        return plan_vllm_cpu(self.memory, total, available, float(space) * GIB if space else None)

    async def _start_engine(self, plan: VllmMemoryPlan) -> bool:
        """Model load → profile → KV cache → graph capture, stopping at the planned failure."""
        c = self.cfg
        if self.settings.cpu:
            return await self._start_cpu(plan)
        if plan.failure in ("free_memory", "external_exceeds"):
            return self._core_failed([self._budget_refusal(plan)])
        self._external_budget_line(plan)
        if not await self._load(plan):
            return False
        if c.extensible_kv:  # 0.34: graphs first, then the cache grows into what is left
            if not await self._capture(plan):
                return False
            free_after = plan.free_after_load - plan.graph_actual
            self.core(f"Memory after warmup: {gib(free_after):.2f} GiB free", "gpu_worker.py:512")
            self.core(
                f"Extended KV cache to {plan.num_blocks} blocks ({gib(plan.kv_bytes):.2f} GiB).", "kv_cache.py:201"
            )
            if not self._kv_lines(plan):
                return False
        elif not self._kv_lines(plan) or not await self._capture(plan):
            return False
        self._init_engine_line()
        return True

    def _budget_refusal(self, plan: VllmMemoryPlan) -> str:
        """``request_memory``'s refusals (v1/worker/utils.py), with or without a daemon's mapped weights."""
        c, external = self.cfg, self._external_bytes()
        device = f"cuda:0 ({gib(plan.free_at_start):.2f}/{gib(plan.total):.2f} GiB)"
        if plan.failure == "external_exceeds":
            return (
                f"ValueError: Externally held weights on device cuda:0 ({gib(external):.2f}/{gib(plan.total):.2f} "
                f"GiB) exceed the desired GPU memory utilization ({c.utilization}, "
                f"{gib(plan.requested + external):.2f} GiB). Increase GPU memory utilization or reduce GPU memory "
                "used by other processes."
            )
        if external:
            return (
                f"ValueError: Free memory on device {device} on startup is less than the engine's budget after "
                f"excluding external process's weights ({c.utilization}, {gib(plan.requested):.2f} GiB). "
                "Decrease GPU memory utilization or reduce GPU memory used by other processes."
            )
        return (
            f"ValueError: Free memory on device {device} on startup is less than desired GPU memory utilization "
            f"({c.utilization:.2f}, {gib(plan.requested):.2f} GiB). Decrease GPU memory utilization or "
            "reduce GPU memory used by other processes."
        )

    def _external_bytes(self) -> float:
        ipc = self.ipc
        return ipc.external_bytes if ipc is not None and ipc.mapped and ipc.mode == "zero_copy" else 0.0

    def _external_budget_line(self, plan: VllmMemoryPlan) -> None:
        external = self._external_bytes()
        if external:
            self.worker(
                0,
                f"Weights are held outside this process: of the {gib(plan.requested + external):.2f} GiB "
                f"utilization budget, {gib(external):.2f} GiB is externally held and {gib(plan.requested):.2f} GiB "
                "remains for the engine's own allocations.",
                "utils.py:773",
            )

    def _init_engine_line(self) -> None:
        """The engine core's start-up summary: profile, compile, KV cache and capture, not the load."""
        compile_s = self._compile_s
        init_s = compile_s + PROFILE_S + self._capture_s
        if self.cfg.version < "0.34":
            self.core(f"init engine (profile, create kv cache, warmup model) took {init_s:.2f} seconds", "core.py:239")
        elif compile_s:
            self.core(
                f"init engine (profile, create kv cache, warmup model) took {init_s:.2f} s "
                f"(compilation: {compile_s:.2f} s)",
                "core.py:452",
            )
        else:
            self.core(f"init engine (profile, create kv cache, warmup model) took {init_s:.2f} s", "core.py:459")

    async def _weight_source(self) -> bool:
        """``--load-format ipc_cache`` (0.34): ask the weight-cache daemon before memory is planned,
        as the worker does at init (``get_external_weight_memory``) and at load (``get_state``)."""
        c = self.cfg
        if c.load_format != "ipc_cache" or c.version < "0.34":
            return True
        if self.settings.cpu:
            return self._core_failed(
                [
                    "vllm.model_executor.model_loader.weight_cache.protocol.UnsupportedPlatformForIPCError: platform "
                    "'cpu' does not support CUDA IPC weight sharing; only CUDA and ROCm are supported. Use the "
                    "default --load-format for this platform."
                ]
            )
        try:
            self.ipc = await negotiate(self.rt, c)
        except IpcFailure as failure:
            return self._core_failed(failure.lines)
        return True

    def _daemon_memory(self) -> dict[str, float]:
        """How a weight-cache daemon on this GPU enters the memory plan (see ``VllmMemory``)."""
        ipc = self.ipc
        if ipc is None:
            return {}
        held = {"other_process_gib": ipc.daemon_bytes / GIB}
        if ipc.mapped and ipc.mode == "zero_copy":
            return {**held, "external_weight_bytes": ipc.external_bytes}
        if ipc.mapped:
            return {**held, "released_after_start": ipc.daemon_bytes}
        return {**held, "fallback_credit_bytes": ipc.external_bytes}

    async def _start_cpu(self, plan: VllmMemoryPlan) -> bool:
        """vLLM-CPU's worker: the node-memory reservation, the load, then the KV cache it sets."""
        c = self.cfg
        node = f"node 0 ({gib(plan.free_at_start):.2f}/{gib(plan.total):.2f} GiB)"
        explicit = c.kv_cache_memory_bytes is not None or "VLLM_CPU_KVCACHE_SPACE" in self.settings.engine_env
        if plan.failure == "cpu_reserve":
            return self._core_failed(
                [
                    f"ValueError: Available memory on {node} on startup is less than desired CPU memory utilization "
                    f"({c.utilization}, {gib(plan.requested):.2f} GiB). On the CPU backend, the "
                    "`--gpu-memory-utilization` flag controls the fraction of CPU memory reserved (despite its "
                    "name). To resolve: decrease `--gpu-memory-utilization` (e.g. `--gpu-memory-utilization 0.5`) "
                    "or reduce CPU memory used by other processes."
                ]
            )
        if not await self._load(plan):
            return False
        if plan.failure == "cpu_kv":
            asked = f"{gib(plan.kv_bytes):.2f}" if explicit else f"{gib(plan.kv_bytes):.2f}/{gib(plan.requested):.2f}"
            fix = (
                "Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, "
                "or reduce CPU memory used by other processes."
                if explicit
                else "Reduce CPU memory used by other processes."
            )
            return self._core_failed(
                [
                    f"ValueError: Available memory on {node} on kv cache allocation is less than requested memory "
                    f"for kv ({asked} GiB). {fix}"
                ]
            )
        if explicit:
            line = f"Explicitly set ({gib(plan.kv_bytes):.2f}/{gib(plan.total):.2f}) GiB for KV cache on node 0."
        else:
            line = (
                f"Auto set ({gib(plan.kv_bytes):.2f}/{gib(plan.total):.2f}) GiB for KV cache on node 0, with "
                f"{gib(plan.requested):.2f} GiB requested memory for the worker. {gib(plan.consumed):.2f} GiB "
                "memory was consumed by non-kv usages."
            )
        self.worker(0, line, "cpu_worker.py:260")
        if plan.failure == "kv_too_small":
            return self._core_failed([self._too_small(plan)])
        concurrency = plan.kv_tokens / plan.max_model_len
        self.core(
            f"CPU KV cache size: {fmt_commas(plan.kv_tokens)} tokens, Maximum concurrency for "
            f"{fmt_commas(plan.max_model_len)} tokens per request: {concurrency:.2f}x",
            "kv_cache_utils.py:1087",
        )
        return True

    async def _load(self, plan: VllmMemoryPlan) -> bool:
        """Weights, torch.compile and the memory profile."""
        c, s, gpu = self.cfg, self.settings, self.settings.gpu
        await self.rt.pause(s.faults.slow_startup_s)
        for rank in range(c.tp * c.pp):
            self.worker(rank, f"Starting to load model {c.model_name}...", "gpu_model_runner.py:3330")
        if c.load_format == "ipc_cache" and c.version < "0.34":
            return self._core_failed(["ValueError: Load format `ipc_cache` is not supported"])
        self._ipc_lines()
        mapped = self.ipc is not None and self.ipc.mapped
        load_s = MAP_S if mapped else s.weight_read_s(self.fp.weight_bytes * c.tp * c.pp)
        await self.rt.pause(load_s)
        if plan.failure == "load_oom":
            return self._core_failed(torch_oom(self.fp.weight_bytes / 8, plan.free_after_load, gpu.torch_total_gib))
        ipc = self.ipc
        if ipc is not None and ipc.watch is not None:
            self._watch_task = asyncio.create_task(self._watch_daemon(ipc.watch, ipc.socket_path))
        if ipc is not None and ipc.mapped:
            self.worker(
                0, f"Mapped {ipc.tensors} tensors from the weight cache daemon ({ipc.mode} mode)", "ipc_loader.py:330"
            )
        held = 0.0 if self._external_bytes() else self.fp.weight_bytes
        for rank in range(c.tp * c.pp):
            self.worker(
                rank,
                f"Model loading took {gib(held):.2f} GiB memory and {load_s:.6f} seconds",
                "gpu_model_runner.py:3380",
            )
        if ipc is not None and not ipc.mapped and ipc.external_bytes:
            self.worker(
                0,
                f"Updated engine memory budget after disk fallback: {gib(plan.requested):.2f} GiB",
                "gpu_worker.py:607",
            )
        self._compile_s = await self._compile() if c.compile else 0.0
        await self.rt.pause(PROFILE_S)
        if plan.graph_estimate and not c.extensible_kv:
            self.core(
                f"Estimated CUDA graph memory: {gib(plan.graph_estimate):.2f} GiB total", "gpu_model_runner.py:4257"
            )
        return True

    async def _watch_daemon(self, stream: asyncio.StreamReader, path: str) -> None:
        """The daemon serving zero-copy weights exited: vLLM keeps serving from the mapping."""
        with contextlib.suppress(OSError):
            while await stream.read(1):
                pass
        self.worker(
            0,
            f"Weight cache daemon at {path} exited. This engine keeps serving: the CUDA driver keeps its mapped "
            "weights alive until the engine exits. A restarted daemon holds a second copy of the weights on this "
            "GPU, and engine restarts miss the cache until a daemon serves again.",
            "ipc_loader.py:590",
            level="WARNING",
        )

    def _ipc_lines(self) -> None:
        """What the IPC loader said while it talked to the daemon."""
        if self.ipc is None:
            return
        for where, msg in self.ipc.infos:
            self.worker(0, msg, where)
        for where, msg in self.ipc.warnings:
            self.worker(0, msg, where, level="WARNING")

    async def _compile(self) -> float:
        """torch.compile: load the artifacts of an earlier start with the same key, else compile and
        store them (``compilation/backends.py``, ``monitor.py``); returns the modelled seconds."""
        c = self.cfg
        cache = CompileCache(self.settings.engine_env, c.compile_factors)
        rng = f"(1, {c.max_num_batched_tokens})"
        if cache.enabled:
            self.worker(
                0, f"[backbone] Using cache directory: {cache.local_dir} for vLLM's torch.compile", "backends.py:1110"
            )
        else:
            self.worker(0, "[backbone] vLLM's torch.compile cache is disabled.", "backends.py:1108")
        if cache.warm:
            total = COMPILE_WARM_S
            await self.rt.pause(total)
            self.worker(
                0,
                f"[backbone] Directly load the compiled graph(s) for compile range {rng} from the cache, "
                f"took {total:.3f} s",
                "backends.py:314",
            )
        else:
            total = COMPILE_S
            await self.rt.pause(total)
            if cache.enabled:
                self.worker(0, f"[backbone] Cache the graph of compile range {rng} for later use", "backends.py:405")
            self.worker(
                0, f"[backbone] Compiling a graph for compile range {rng} takes {0.9 * total:.2f} s", "backends.py:421"
            )
            cache.store()
        if c.version < "0.34":
            self.core(f"torch.compile takes {total:.2f} s in total", "monitor.py:34")
        else:
            self.core(f"torch.compile took {total:.2f} s in total", "monitor.py:62")
        return total

    async def _capture(self, plan: VllmMemoryPlan) -> bool:
        """CUDA-graph capture, or the OOM it runs into after the KV cache took its share."""
        c, gpu = self.cfg, self.settings.gpu
        self._capture_s = 0.0
        if not plan.graph_actual:
            return True
        capture_s = self._capture_s = CAPTURE_S_PER_GRAPH * len(c.capture_sizes) * c.graphs_per_size
        await self.rt.pause(capture_s)
        if plan.failure == "capture_oom":
            free = plan.free_after_load - plan.num_blocks * c.block_size * self.fp.kv_bytes_per_token
            return self._core_failed(
                torch_oom(plan.capture_need - max(free, 0) + 0.25 * GIB, free, gpu.torch_total_gib)
            )
        self.core(
            f"Graph capturing finished in {capture_s:.0f} secs, took {gib(plan.graph_actual):.2f} GiB",
            "gpu_model_runner.py:4373",
        )
        diff = plan.graph_actual - plan.graph_estimate
        self.core(
            f"CUDA graph pool memory: {gib(plan.graph_actual):.2f} GiB (actual), "
            f"{gib(plan.graph_estimate):.2f} GiB (estimated), difference: {gib(diff):.2f} GiB "
            f"({100 * diff / plan.graph_actual:.1f}%).",
            "gpu_worker.py:470",
        )
        return True

    def _kv_lines(self, plan: VllmMemoryPlan) -> bool:
        """KV planning: the budget lines, or the too-low failures."""
        c = self.cfg
        if plan.failure == "no_kv":
            return self._core_failed(
                [
                    "ValueError: No available memory for the cache blocks. Try increasing "
                    "`gpu_memory_utilization` when initializing the engine."
                ]
            )
        if plan.failure == "auto_fit_impossible":
            return self._core_failed(
                [
                    "ValueError: Cannot auto-fit max_model_len: not enough GPU memory available "
                    "to serve even a single token."
                ]
            )
        self.core(f"Available KV cache memory: {gib(plan.kv_bytes):.2f} GiB", "gpu_worker.py:298")
        if plan.failure == "kv_too_small":
            return self._core_failed([self._too_small(plan)])
        if c.max_model_len is None:
            self.core(
                f"Auto-fit max_model_len: reduced from {c.derived_max_len} to {plan.max_model_len} to fit the "
                "available KV cache memory.",
                "kv_cache_utils.py:1160",
            )
        if plan.graph_estimate and not c.extensible_kv:
            without = (plan.requested - plan.graph_estimate) / plan.total
            self.core(
                f"CUDA graph memory profiling is enabled (default since v0.21.0). The current "
                f"--gpu-memory-utilization={c.utilization:.4f} is equivalent to --gpu-memory-utilization="
                f"{without:.4f} without CUDA graph memory profiling. To maintain the same effective KV cache size as "
                f"before, increase --gpu-memory-utilization to {2 * c.utilization - without:.4f}. To disable, set "
                "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.",
                "gpu_worker.py:655",
            )
        if c.num_gpu_blocks_override is not None:
            natural = int(plan.kv_bytes // (c.block_size * self.fp.kv_bytes_per_token))
            self.core(
                f"Overriding num_gpu_blocks={natural} with num_gpu_blocks_override={c.num_gpu_blocks_override}",
                "kv_cache_utils.py:1005",
            )
        concurrency = plan.kv_tokens / plan.max_model_len
        self.core(
            f"GPU KV cache size: {fmt_commas(plan.kv_tokens)} tokens, Maximum concurrency for "
            f"{fmt_commas(plan.max_model_len)} tokens per request: {concurrency:.2f}x",
            "kv_cache_utils.py:1087",
        )
        fits = int(plan.kv_bytes)
        full = int(plan.free_after_load - plan.peak - plan.graph_estimate)
        self.core(
            f"Free memory on device ({gib(plan.free_at_start):.2f}/{gib(plan.total):.2f} GiB) on startup. Desired GPU "
            f"memory utilization is ({c.utilization}, {gib(plan.requested):.2f} GiB). Actual usage is "
            f"{gib(plan.consumed):.2f} GiB for consumed memory (weights + non-torch), {gib(plan.peak):.2f} GiB for "
            f"peak activation, and {gib(plan.graph_estimate):.2f} GiB for CUDAGraph memory. Replace "
            f"gpu_memory_utilization config with `--kv-cache-memory={fits}` to fit into requested memory, or "
            f"`--kv-cache-memory={full}` to fully utilize gpu memory. Current kv cache memory in use is "
            f"{int(plan.num_blocks * c.block_size * self.fp.kv_bytes_per_token)} bytes.",
            "gpu_worker.py:386",
        )
        return True

    def _too_small(self, plan: VllmMemoryPlan) -> str:
        need = plan.max_model_len * self.fp.kv_bytes_per_token
        return (
            f"ValueError: To serve at least one request with the model's max seq len ({plan.max_model_len}), "
            f"({gib(need):.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({gib(plan.kv_bytes):.2f} GiB). Based on the available memory, the estimated maximum model "
            f"length is {plan.estimated_max_len}. Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine."
        )

    def _core_failed(self, error_lines: list[str]) -> bool:
        """EngineCore's start-up failure, then the API server's RuntimeError (exit 1)."""
        trace = [
            "EngineCore failed to start.",
            "Traceback (most recent call last):",
            f'  File "{CORE_FILE}", line 857, in run_engine_core',
            "    engine_core = EngineCoreProc(*args, **kwargs)",
            f'  File "{CORE_FILE}", line 640, in __init__',
            "    super().__init__(vllm_config, executor_class, log_stats,",
            *error_lines,
        ]
        self.core("\n".join(trace), "core.py:866", level="ERROR")
        self._api_traceback(
            [
                "RuntimeError: Engine core initialization failed. See root cause above. "
                "Failed core proc(s): {'EngineCore': 1}"
            ]
        )
        return False

    def _api_traceback(self, lines: list[str]) -> None:
        head = [
            "Traceback (most recent call last):",
            '  File "<frozen runpy>", line 198, in _run_module_as_main',
            '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/api_server.py", line 2055, '
            "in <module>",
            "    uvloop.run(run_server(args))",
        ]
        self.log.write("\n".join(head + lines), stderr=True)

    # ---------------------------------------------------------------------------- serving
    def _build_engines(self, plan: VllmMemoryPlan) -> EngineGroup:
        c, s = self.cfg, self.settings
        self.stats = EngineStats(max_model_len=plan.max_model_len)
        self.tokenizer = Tokenizer(c.model.vocab, c.model.bos)
        fp8 = bool(c.quantization and "fp8" in c.quantization.lower())
        perf = PerfModel(c.model, s.gpu, self.fp, tp=c.tp, pp=c.pp, fp8_compute=fp8)
        engines: list[Engine] = []
        for rank in range(c.dp):
            pool = new_pool(plan.num_blocks - 1, c.block_size, c.prefix_caching)  # one null block
            sched = VllmScheduler(
                pool,
                self.stats,
                self.tokenizer.output_token,
                max_num_seqs=c.max_num_seqs,
                max_batched_tokens=c.max_num_batched_tokens,
                chunked_prefill=c.chunked_prefill,
                long_prefill_threshold=c.long_prefill_threshold,
                priority_policy=c.priority_policy,
                reserve_full_isl=c.reserve_full_isl,
                graph_mode=c.cudagraph_mode,
                max_capture=c.max_capture,
            )
            engines.append(self.rt.build_engine(sched, perf, self.stats, self.fp, plan.runtime_free, self, rank))
        self.engines = EngineGroup(engines)
        return self.engines

    async def _serve(self, sock: Any, plan: VllmMemoryPlan) -> None:
        c, s = self.cfg, self.settings
        group = self._build_engines(plan)
        serving = ServingConfig(
            dialect="vllm",
            served_names=c.served_names,
            model_path=c.model_name,
            max_model_len=plan.max_model_len,
            max_input_len=plan.max_model_len - 1,
            stream_interval=c.stream_interval,
            force_include_usage=c.force_include_usage,
            api_key=c.api_key,
            seed=s.seed,
            drop_connections=s.faults.drop_connections,
        )
        self.openai = OpenAIServer(serving, self.tokenizer, group, lambda: DEAD_MESSAGE if self.dead else None)
        router = self._routes()
        self.api("Supported tasks: ['generate']", "api_server.py:1607")
        host = c.host or "0.0.0.0"
        self.api(f"Starting vLLM server on http://{host}:{c.port}", "api_server.py:1880")
        self.api("Available routes are:", "launcher.py:46")
        for path, methods in router.paths():
            self.api(f"Route: {path}, Methods: {', '.join(methods)}", "launcher.py:54")
        self.uvicorn(f"Started server process [{self.pid}]")
        self.uvicorn("Waiting for application startup.")
        await self.rt.listen(sock, router)
        self.uvicorn("Application startup complete.")
        self._tasks = [asyncio.create_task(engine.run()) for engine in group.engines]
        self._next_log = 0.0
        self._log_base = (0, 0, 0, 0)
        self._graph_stats: dict[tuple[int, int, int, str], int] = {}
        self._sizes = sorted(self.cfg.capture_sizes)  # once: every step looks its padded size up
        if s.faults.crash_after_s is not None:
            self.rt.later(s.faults.crash_after_s, lambda: group.engines[0].die(Fatal("crash")))

    def _routes(self) -> Router:
        api, r = self.openai, Router()
        r.add("GET", "/health", self._health)
        r.add(("GET", "POST"), "/ping", self._health)
        r.add("GET", "/version", lambda q, p: p.json(200, {"version": self.cfg.version}))
        r.add(
            "GET",
            "/load",
            lambda q, p: p.json(
                200,
                {"server_load": sum(len(e.scheduler.running) + len(e.scheduler.waiting) for e in self.engines.engines)},
            ),
        )
        r.add("GET", "/metrics", self._metrics)
        r.add("GET", "/v1/models", api.guard(api.models))
        r.add("POST", "/tokenize", api.guard(api.tokenize))
        r.add("POST", "/detokenize", api.guard(api.detokenize))
        r.add("POST", "/v1/completions", api.guard(self._gated(api.completions)))
        r.add("POST", "/v1/chat/completions", api.guard(self._gated(api.chat)))
        if self.settings.engine_env.get("VLLM_SERVER_DEV_MODE") == "1":
            r.add("GET", "/server_info", self._server_info)
            r.add("POST", "/reset_prefix_cache", self._reset_prefix_cache)
        return r

    def _gated(self, handler: Any) -> Any:
        """``--max-num-queued-reqs``: refuse with 503 beyond the queue limit."""
        limit = self.cfg.max_queued_reqs
        if limit is None:
            return handler

        def gated(request: Request, resp: Responder) -> None:
            if sum(len(e.scheduler.waiting) for e in self.engines.engines) >= limit:
                resp.json(503, self.openai.error_payload(503, "Too many queued requests", "ServiceUnavailable"))
                return
            handler(request, resp)

        return gated

    def _health(self, request: Request, resp: Responder) -> None:
        resp.send(503 if self.dead else 200, b"")

    def _server_info(self, request: Request, resp: Responder) -> None:
        c = self.cfg
        info = {k: v for k, v in vars(c).items() if isinstance(v, (int, float, str, bool, list, tuple, type(None)))}
        resp.json(200, {"vllm_config": json.dumps(info, default=str)})

    def _reset_prefix_cache(self, request: Request, resp: Responder) -> None:
        for engine in self.engines.engines:
            engine.scheduler.pool.reset_cache()
        resp.send(200, b"")

    # ---------------------------------------------------------------------------- metrics
    def _metrics(self, request: Request, resp: Responder) -> None:
        resp.send(200, self.render_metrics().encode(), CONTENT_TYPE)

    def render_metrics(self) -> str:
        """The ``vllm:`` families (none at all with ``--disable-log-stats``, as in vLLM)."""
        c, st = self.cfg, self.stats
        m = Exposition({"model_name": c.served_names[0], "engine": "0"}, st.created)
        if c.log_stats:
            engines = self.engines.engines
            running = sum(len(e.scheduler.running) for e in engines)
            waiting = sum(len(e.scheduler.waiting) for e in engines)
            usage = sum(e.scheduler.pool.usage() for e in engines) / len(engines)
            m.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", running)
            m.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
            m.gauges(
                "vllm:num_requests_waiting_by_reason",
                "Number of requests waiting, by reason.",
                {"capacity": waiting, "deferred": 0},
                "reason",
            )
            m.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
            m.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", st.preemptions)
            m.counter(
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                st.prefix_queries,
            )
            m.counter(
                "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", st.prefix_hits
            )
            m.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens)
            m.counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens.", st.prompt_tokens_cached)
            m.counter("vllm:generation_tokens", "Number of generation tokens processed.", st.generation_tokens)
            m.counters(
                "vllm:request_success",
                "Count of successfully processed requests.",
                {**st.finished, "repetition": 0},
                "finished_reason",
            )
            m.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", st.request_prompt_tokens)
            m.histogram(
                "vllm:request_generation_tokens", "Number of generation tokens processed.", st.request_generation_tokens
            )
            m.histogram(
                "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", st.iteration_tokens
            )
            m.histogram("vllm:request_num_preemptions", "Number of preemptions per request.", st.request_preemptions)
            m.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", st.ttft)
            m.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", st.itl)
            m.histogram(
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                st.tpot,
            )
            m.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", st.e2e)
            m.histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase.", st.queue)
            m.histogram(
                "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase.", st.prefill_time
            )
            m.histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase.", st.decode_time)
            m.histogram(
                "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase.", st.inference_time
            )
            blocks = engines[0].scheduler.pool.num_blocks + 1
            m.gauge(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                1.0,
                {
                    "block_size": str(c.block_size),
                    "cache_dtype": c.kv_dtype,
                    "enable_prefix_caching": str(c.prefix_caching),
                    "gpu_memory_utilization": str(c.utilization),
                    "num_gpu_blocks": str(blocks),
                    "kv_cache_size_tokens": str(blocks * c.block_size),
                    "kv_cache_max_concurrency": f"{blocks * c.block_size / max(1, self.stats.max_model_len):.2f}",
                },
            )
        m.gauge(
            "autotune_sim_speedup",
            "Modelled seconds per wall-clock second (autotune simulator).",
            self.settings.speedup,
        )
        m.counter(
            "autotune_sim_wall_lag_seconds",
            "Wall time the simulator fell behind its model (host-bound).",
            st.wall_lag_s,
        )
        return m.text()

    # ------------------------------------------------------------------------- observer
    def on_step(self, batch: Batch, now: float) -> None:
        """The periodic ``Engine 000:`` line (never a preemption line: vLLM logs none), and with
        ``--cudagraph-metrics`` the table of the interval's steps by token count and graph mode."""
        if self.cfg.cudagraph_metrics and self.cfg.log_stats:
            stat = graph_stat(batch.shape.tokens, batch.shape.graph, self._sizes)
            self._graph_stats[stat] = self._graph_stats.get(stat, 0) + 1
        if not self.cfg.log_stats or now < self._next_log:
            return
        interval = float(self.settings.engine_env.get("VLLM_LOG_STATS_INTERVAL", "10") or 10)
        if self._next_log == 0.0:
            self._next_log = now + interval
            return
        st = self.stats
        prompt, gen, queries, hits = (
            st.prefill_tokens_computed,
            st.generation_tokens,
            st.prefix_queries,
            st.prefix_hits,
        )
        p0, g0, q0, h0 = self._log_base
        self._log_base = (prompt, gen, queries, hits)
        self._next_log = now + interval
        engines = self.engines.engines
        running = sum(len(e.scheduler.running) for e in engines)
        waiting = sum(len(e.scheduler.waiting) for e in engines)
        usage = 100 * sum(e.scheduler.pool.usage() for e in engines) / len(engines)
        hit_rate = 100 * (hits - h0) / (queries - q0) if queries > q0 else 0.0
        self.api(
            f"Engine 000: Avg prompt throughput: {(prompt - p0) / interval:.1f} tokens/s, Avg generation "
            f"throughput: {(gen - g0) / interval:.1f} tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, "
            f"GPU KV cache usage: {usage:.1f}%, Prefix cache hit rate: {hit_rate:.1f}%",
            "loggers.py:236",
            flush=False,
        )
        if self._graph_stats:
            self.api(graph_table(self.cfg.cudagraph_mode, self.cfg.capture_sizes, self._graph_stats), "loggers.py:344")
            self._graph_stats = {}

    def on_lag(self, lag_s: float) -> None:
        self.api(
            f"autotune simulator: {lag_s:.2f} s of wall time behind the model so far (host CPU-bound); "
            "client-side rates are lower than modelled. Lower AUTOTUNE_SIM_SPEEDUP.",
            "autotune_sim.py:2",
            level="WARNING",
        )

    def on_fatal(self, fatal: Fatal) -> None:
        """EngineCore dies: error lines, /health 503, error chunks, exit 0 after ~5 s."""
        for engine in self.engines.engines:
            engine.die(fatal)
        if self.dead:
            return
        self.dead = True
        gpu = self.settings.gpu
        if fatal.kind == "oom":
            cause = torch_oom(fatal.need - fatal.free + 0.1 * GIB, fatal.free, gpu.torch_total_gib)
        elif fatal.kind == "worker":
            cause = self._worker_died()
        else:
            cause = [
                "RuntimeError: CUDA error: an illegal memory access was encountered",
                "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                "below might be incorrect.",
            ]
        trace = [
            "EngineCore encountered a fatal error.",
            "Traceback (most recent call last):",
            f'  File "{CORE_FILE}", line 1001, in run_engine_core',
            "    engine_core.run_busy_loop()",
            f'  File "{CORE_FILE}", line 1030, in run_busy_loop',
            "    self._process_engine_step()",
            '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 2990, '
            "in execute_model",
            *cause,
        ]
        self.core("\n".join(trace), "core.py:1010", level="ERROR")
        self.api(
            "AsyncLLM output_handler failed.\nvllm.v1.engine.exceptions.EngineDeadError: " + DEAD_MESSAGE,
            "async_llm.py:525",
            level="ERROR",
        )
        for engine in self.engines.engines:
            for req in engine.in_flight():
                req.done = True
                if req.sink is not None:
                    req.sink.fail(req, DEAD_MESSAGE)
        if self.settings.engine_env.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH") != "1":
            self.rt.later(
                EXIT_AFTER_DEATH_S,
                lambda: self._shutdown("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."),
            )

    def _worker_died(self) -> list[str]:
        """vLLM 0.32's lines when the worker process is killed mid-step (SIGILL: exit code -4): the
        executor's notice, the input dump of the step, and a trace that ends in "cancelled"."""
        self.core(
            "Worker proc VllmWorker-0 died unexpectedly (exit code: -4), shutting down executor.",
            "multiproc_executor.py:315",
            level="ERROR",
        )
        held = [r for engine in self.engines.engines for r in engine.in_flight()]
        new = ",".join(f"NewRequestData(req_id=cmpl-{r.rid},prompt_token_ids_len={len(r.prompt)})" for r in held)
        self.core(f"Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs=[{new}])",
                  "dump_input.py:79", level="ERROR")  # fmt: skip
        self.core(f"Dumping scheduler stats: SchedulerStats(num_running_reqs={len(held)}, num_waiting_reqs=0)",
                  "dump_input.py:81", level="ERROR")  # fmt: skip
        return ['  File "/usr/local/lib/python3.12/concurrent/futures/_base.py", line 401, in __get_result',
                "    raise self._exception", "RuntimeError: cancelled"]  # fmt: skip

    def _shutdown(self, reason: str | None = None) -> None:
        if reason:
            self.api(reason, "core_client.py:564", level="ERROR")
        self.api("Shutting down FastAPI HTTP server.", "launcher.py:110")
        for msg in (
            "Shutting down",
            "Waiting for application shutdown.",
            "Application shutdown complete.",
            f"Finished server process [{self.pid}]",
        ):
            self.uvicorn(msg)
        self.rt.exit(0)

    def _on_signal(self, signum: int) -> None:
        if self.rt.server is None:
            self.rt.exit(0)
        self._shutdown()


def _extensible(plan: VllmMemoryPlan, m: VllmMemory) -> VllmMemoryPlan:
    """vLLM 0.34's extensible KV cache: sized after capture from what is then physically left."""
    fp = m.fp
    reserve = plan.headroom - plan.runtime_free
    # The cache grows into what warm-up left, keeping a served full step's needs free.
    keep_free = plan.peak * (1 + FRAGMENTATION) + reserve
    kv = min(plan.requested - plan.consumed, plan.free_after_load) - plan.graph_actual - keep_free
    block = m.block_size * fp.kv_bytes_per_token
    blocks = max(0, int(kv // block))
    headroom = plan.free_after_load - blocks * block - plan.graph_actual
    return replace(
        plan,
        kv_bytes=kv,
        num_blocks=blocks,
        kv_tokens=blocks * m.block_size,
        headroom=headroom,
        runtime_free=headroom - reserve,
        failure=None if blocks > 1 else "no_kv",
    )


# ------------------------------------------------------------------------------ --cudagraph-metrics
def graph_stat(tokens: int, graph: GraphMode, sizes: list[int]) -> tuple[int, int, int, str]:
    """One step as vLLM's ``CUDAGraphStat``: unpadded and padded tokens, paddings, runtime mode.
    A graphed step is padded up to the smallest captured size that holds it (``sizes`` sorted)."""
    if graph is GraphMode.EAGER:
        return tokens, tokens, 0, "NONE"
    at = bisect.bisect_left(sizes, tokens)
    padded = sizes[at] if at < len(sizes) else tokens
    return tokens, padded, padded - tokens, graph.name


def graph_table(mode: str, sizes: list[int], stats: dict[tuple[int, int, int, str], int]) -> str:
    """``CUDAGraphLogging.generate_metric_table`` (vLLM 0.32–0.34): rows by descending count."""
    headers = ["Unpadded Tokens", "Padded Tokens", "Num Paddings", "Runtime Mode", "Count"]
    rows = [[*map(str, stat), str(count)] for stat, count in sorted(stats.items(), key=lambda kv: kv[1], reverse=True)]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return (
        f"**CUDAGraph Config Settings:**\n\n- Mode: {mode}\n- Capture sizes: {sorted(sizes)}\n\n"
        + "**CUDAGraph Stats:**\n\n"
        + line(headers)
        + "\n|"
        + "|".join("-" * (w + 2) for w in widths)
        + "|\n"
        + "\n".join(line(row) for row in rows)
        + "\n"
    )
