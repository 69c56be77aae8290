"""The SGLang dialect: ``python -m autotune_sim sglang --model-path M [SGLang flags]``.

It behaves as ``python -m sglang.launch_server`` does (facts in ``reference/sglang.md``):

* Log lines ``[YYYY-MM-DD HH:MM:SS] msg`` (`` TP0`` after the time when TP > 1) on stderr, in
  start-up order: ``server_args=…``, weight loading, ``KV Cache is allocated. … #tokens: N``,
  prefill/decode graph capture, ``max_total_num_tokens=…, available_gpu_mem=… GB``, uvicorn,
  a warm-up ``Prefill batch`` and ``The server is fired up and ready to roll!``. While serving:
  ``Prefill batch, …`` per prefill batch, ``Decode batch, … cuda graph: …, #queue-req: …`` every
  ``--decode-log-interval`` decode batches, and ``KV cache pool is full. Retract requests. …``.
* The port refuses connections until the graphs are captured; ``/health`` and ``/ready`` (served
  from 0.5.20 only) are 503 until the warm-up request has finished; ``/v1/models`` answers before.
* The release (``AUTOTUNE_SIM_SGLANG_VERSION``, see ``sglang_args.RELEASES``) decides the flag
  set, the routes, where the decode graph sizes are logged and whether a lowered
  ``--max-running-requests`` is said.
* A failure inside the scheduler (memory too low/high at start-up, an OOM or crash at run time)
  logs ``Scheduler hit an exception`` and the launcher SIGKILLs its own tree: exit code −9.
  Usage errors exit 2; errors in the main process (bad context length, model not found) exit 1.
* ``/metrics`` exists only with ``--enable-metrics``.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from autotune_sim.dialects.base import (
    Dialect,
    Router,
    expand_config,
    gib,
    modelled_banner,
    new_pool,
    rank_footprint,
    torch_oom,
    ts_sglang,
)
from autotune_sim.dialects.sglang_args import SUPPORTED_VERSIONS, StartupError, build_parser, resolve
from autotune_sim.dialects.sglang_weight_cache import (
    MAP_S,
    WeightCacheFetch,
    fetch_weights,
    start_engine_daemons,
    watch_daemon,
)
from autotune_sim.engine import Engine, Fatal
from autotune_sim.http import Request, Responder
from autotune_sim.memory import CUDA_CONTEXT_GIB, GIB, SglangMemory, SglangMemoryPlan, plan_sglang
from autotune_sim.metrics import CONTENT_TYPE, Exposition
from autotune_sim.openai import EngineGroup, OpenAIServer, ServingConfig
from autotune_sim.perf import GraphMode, PerfModel
from autotune_sim.presets import MODELS, find_model
from autotune_sim.scheduler import Batch, SglangScheduler, SimRequest
from autotune_sim.stats import EngineStats
from autotune_sim.tokenizer import Tokenizer

__all__ = ["SglangDialect"]

MAIN_IMPORT_S = 6.0
SCHEDULER_START_S = 4.0
CAPTURE_S_PER_DECODE_BS = 0.12
CAPTURE_S_PER_PREFILL_SIZE = 0.08
HEALTH_TIMEOUT_S = 20.0
PAGE = 16  # the radix cache is modelled in 16-token pages
SCHED_FILE = "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py"
CAPTURE_HINT = (
    "Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n2. set "
    "--cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n3. disable decode CUDA graph by "
    "--cuda-graph-backend-decode=disabled\nOpen an issue on GitHub https://github.com/sgl-project/"
    "sglang/issues/new/choose"
)


class SglangDialect(Dialect):
    """SGLang's process story."""

    name = "sglang"

    # ------------------------------------------------------------------------------ entry
    def main(self, argv: list[str]) -> int:
        version = self.settings.sglang_version
        if version not in SUPPORTED_VERSIONS:
            self.log.write(
                f"autotune simulator: AUTOTUNE_SIM_SGLANG_VERSION={version} is not one of "
                f"{', '.join(SUPPORTED_VERSIONS)}",
                stderr=True,
            )
            return 2
        try:
            ns = build_parser(version).parse_args(expand_config(list(argv), negate=False))
        except SystemExit as exc:
            return int(exc.code or 0)
        return asyncio.run(self._run(ns))

    # ---------------------------------------------------------------------------- logging
    def main_log(self, msg: str, flush: bool = True) -> None:
        self.log.write(f"[{ts_sglang(self._ms)}] {msg}", stderr=True, flush=flush)

    def sched_log(self, msg: str, flush: bool = True) -> None:
        self.log.write(f"[{ts_sglang(self._ms)}{self._prefix}] {msg}", stderr=True, flush=flush)

    def uvicorn(self, msg: str, level: str = "INFO") -> None:
        self.main_log(f"{level}:     {msg}")

    # ------------------------------------------------------------------------------ story
    async def _run(self, ns: Any) -> int:
        s = self.settings
        self.pid = os.getpid()
        self._ms = s.engine_env.get("SGLANG_LOG_MS") == "1"
        self._prefix = ""
        self.status = "Starting"
        self.dead = False
        await self.rt.pause(MAIN_IMPORT_S)
        model = find_model(ns.model_path)
        if model is None:
            known = ", ".join(m.hub_id for m in MODELS)
            self._main_failed(
                [
                    f"OSError: {ns.model_path} is not a local folder and is not a valid model identifier "
                    "listed on 'https://huggingface.co/models'",
                    f"(autotune simulator presets: {known})",
                ]
            )
            return 1
        try:
            self.cfg = cfg = resolve(ns, s.sglang_version, s.gpu, model, dict(s.engine_env), s.num_gpus)
        except StartupError as err:
            if err.where == "main":
                self._main_failed(err.lines)
                return 1
            await self.rt.pause(SCHEDULER_START_S)
            self._scheduler_failed(err.lines)
            return -9
        self._prefix = (" DP0" if cfg.dp > 1 else "") + (" TP0" if cfg.tp > 1 else "")
        self._log_args()
        self.main_log(modelled_banner(s))
        for warning in cfg.warnings:
            self.main_log(warning)
        if ns.attention_backend is None and cfg.release.per_phase_graphs:
            self.main_log(f"Attention backend not specified. Use {cfg.attention_backend} backend by default.")
        if s.faults.hang_startup:
            await self.rt.hang()
        self.wc: WeightCacheFetch | None = None
        if cfg.weight_cache_mode != "off" and not await self._weight_cache():
            return 1
        plan = self._plan()
        if not await self._start_scheduler(plan):
            return -9
        await self._serve(plan)
        await asyncio.Event().wait()
        return 0

    def _log_args(self) -> None:
        c = self.cfg
        if not c.release.per_phase_graphs:
            inner = ", ".join(f"{k}={v!r}" for k, v in c.args.items())
            self.main_log(f"server_args=ServerArgs({inner})")
        else:
            self.main_log(f"server_args={c.args}")

    async def _weight_cache(self) -> bool:
        """``--weight-cache-mode daemon|client``: start the engine's own daemons (daemon mode), then
        ask the daemon on this GPU for the weights before memory is planned."""
        c, s = self.cfg, self.settings
        try:
            if c.weight_cache_mode == "daemon":
                await start_engine_daemons(s, self.log, c, self.rt)
            self.wc = await fetch_weights(c, dict(s.engine_env))
        except (RuntimeError, ValueError) as exc:
            self._main_failed([f"{type(exc).__name__}: {exc}"])
            return False
        return True

    def _plan(self) -> SglangMemoryPlan:
        c, s = self.cfg, self.settings
        self.fp = rank_footprint(c, s.gpu)
        wc = self.wc
        held = wc.daemon_bytes if wc is not None else 0.0
        return plan_sglang(
            SglangMemory(
                gpu=s.gpu,
                fp=self.fp,
                mem_fraction_static=c.mem_fraction_static,
                max_total_tokens=c.max_total_tokens,
                page_size=c.page_size,
                decode_sizes=c.decode_sizes,
                prefill_sizes=c.prefill_sizes,
                other_process_gib=held / GIB,
                preloaded_weights_bytes=held if wc is not None and wc.mapped else 0.0,
            )
        )

    async def _start_scheduler(self, plan: SglangMemoryPlan) -> bool:
        """Weights → KV pool → prefill graphs → decode graphs, stopping at the planned failure."""
        c, s = self.cfg, self.settings
        await self.rt.pause(SCHEDULER_START_S + s.faults.slow_startup_s)
        self.sched_log(f"Memory baseline taken. mem usage={CUDA_CONTEXT_GIB:.2f} GB")
        self.sched_log(f"Load weight begin. avail mem={gib(plan.pre):.2f} GB")
        wc = self.wc
        for line in wc.lines if wc is not None else []:
            self.sched_log(line)
        if wc is not None and wc.error:
            return self._scheduler_failed(wc.error)
        mapped = wc is not None and wc.mapped
        if wc is not None and wc.daemon_pid and wc.daemon_pid != self.pid:  # its own daemon dies with it
            self._watchdog = asyncio.create_task(watch_daemon(self.rt, wc.daemon_pid, self.sched_log))
        load_s = MAP_S if mapped else s.weight_read_s(self.fp.weight_bytes * c.tp * c.pp)
        await self.rt.pause(load_s)
        used = gib(plan.pre - plan.after_weights)
        if not c.release.per_phase_graphs:
            self.sched_log(
                f"Load weight end. type={c.model.architecture}, dtype=torch.bfloat16, "
                f"avail mem={gib(plan.after_weights):.2f} GB, mem usage={used:.2f} GB."
            )
        else:
            self.sched_log(
                f"Load weight end. elapsed={load_s:.2f} s, type={c.model.architecture}, "
                f"avail mem={gib(plan.after_weights):.2f} GB, mem usage={used:.2f} GB."
            )
        if plan.failure == "weights_no_room":
            return self._scheduler_failed(
                [
                    f"ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static="
                    f"{c.mem_fraction_static}. Raise --mem-fraction-static above {plan.min_fraction + 0.01:.2f} "
                    f"(minimum viable = 1 - available/pre = {plan.min_fraction:.2f}). "
                    "If using speculative decoding, draft weights are now counted."
                ]
            )
        if plan.failure == "not_enough_memory":
            return self._scheduler_failed(
                [
                    "RuntimeError: Not enough memory. Please try to increase "
                    f"--mem-fraction-static. Current value: mem_fraction_static="
                    f"{c.mem_fraction_static}"
                ]
            )
        if plan.failure == "pool_oom":
            return self._scheduler_failed(torch_oom(plan.kv_bytes, plan.after_weights, s.gpu.torch_total_gib))
        if c.max_total_tokens and c.max_total_tokens > plan.profiled_tokens:
            self.sched_log(
                f"max_total_tokens={c.max_total_tokens} is larger than the profiled value "
                f"{plan.profiled_tokens}. Use the profiled value instead."
            )
        half = gib(plan.kv_bytes) / 2
        dtype = (
            ""
            if not c.release.per_phase_graphs
            else "dtype: torch.bfloat16, "
            if c.kv_dtype == "auto"
            else f"dtype: {c.kv_dtype}, "
        )
        self.sched_log(
            f"KV Cache is allocated. {dtype}#tokens: {plan.kv_tokens}, K size: {half:.2f} GB, V size: {half:.2f} GB"
        )
        self.sched_log(f"Memory pool end. avail mem={gib(plan.after_weights - plan.kv_bytes):.2f} GB")
        if not await self._capture(plan):
            return False
        self.max_running = self._max_running(plan.kv_tokens)
        self.sched_log(
            f"max_total_num_tokens={plan.kv_tokens}, chunked_prefill_size={c.chunked_prefill_size}, "
            f"max_prefill_tokens={c.max_prefill_tokens}, max_running_requests={self.max_running}, "
            f"context_len={c.context_length}, available_gpu_mem={gib(plan.available):.2f} GB"
        )
        if plan.kv_tokens < c.context_length:
            self.sched_log(
                f"KV pool holds {plan.kv_tokens} tokens, fewer than --context-length {c.context_length}. "
                "Requests longer than the pool will be rejected."
            )
        return True

    async def _capture(self, plan: SglangMemoryPlan) -> bool:
        c, gpu = self.cfg, self.settings.gpu
        if c.prefill_sizes:
            self.sched_log(
                f"Capture target prefill CUDA graph begin. backend={c.prefill_backend}, "
                f"num_tokens={c.prefill_sizes}, avail mem={gib(plan.after_pool):.2f} GB"
            )
            elapsed = CAPTURE_S_PER_PREFILL_SIZE * len(c.prefill_sizes)
            await self.rt.pause(elapsed)
            if plan.failure == "capture_oom_prefill":
                return self._scheduler_failed(
                    [
                        *torch_oom(plan.prefill_graph, plan.after_pool, gpu.torch_total_gib),
                        f"Fail when using backend: {c.prefill_backend} for prefill runner. Possible solutions: 1. set "
                        "--cuda-graph-backend-prefill=disabled 2. set --mem-fraction-static to a smaller value 3. set "
                        "--cuda-graph-max-bs-prefill to a smaller value",
                    ]
                )
            self.sched_log(
                f"Capture target prefill CUDA graph end. elapsed={elapsed:.2f} s, mem usage="
                f"{gib(plan.prefill_graph):.2f} GB, avail mem={gib(plan.after_prefill_capture):.2f} GB."
            )
        if not c.decode_sizes:
            return True
        old, sizes_on = not c.release.per_phase_graphs, c.release.sizes_on
        avail = gib(plan.after_prefill_capture)
        if sizes_on == "bs_line":
            self.sched_log(f"Capture cuda graph bs {c.decode_sizes}")
        begin_sizes = f"bs={c.decode_sizes}, " if sizes_on == "begin" else ""
        self.sched_log(
            f"Capture cuda graph begin. This can take up to several minutes. avail mem={avail:.2f} GB"
            if old
            else f"Capture target decode CUDA graph begin. backend={c.decode_backend}, "
            f"num_tokens_per_req=1, {begin_sizes}avail mem={avail:.2f} GB"
        )
        elapsed = CAPTURE_S_PER_DECODE_BS * len(c.decode_sizes)
        await self.rt.pause(elapsed)
        if plan.failure == "capture_oom_decode":
            oom = torch_oom(plan.decode_graph, plan.after_prefill_capture, gpu.torch_total_gib)[0]
            hint = CAPTURE_HINT.replace("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs") if old else CAPTURE_HINT
            return self._scheduler_failed(
                [f"Exception: Capture cuda graph failed: {oom.split(': ', 1)[1]}", *hint.split("\n")]
            )
        usage, left = gib(plan.decode_graph), gib(plan.available)
        end_sizes = f"bs={c.decode_sizes}, " if sizes_on == "end" else ""
        self.sched_log(
            f"Capture cuda graph end. Time elapsed: {elapsed:.2f} s. mem usage={usage:.2f} GB. avail mem={left:.2f} GB."
            if old
            else f"Capture target decode CUDA graph end. {end_sizes}elapsed={elapsed:.2f} s, "
            f"mem usage={usage:.2f} GB, avail mem={left:.2f} GB."
        )
        return True

    def _max_running(self, tokens: int) -> int:
        """``min(clamp(tokens / context × 512, 2048, 4096), tokens // 2)``, or the user's cap."""
        c = self.cfg
        if c.max_running_user is not None:
            used = max(1, min(c.max_running_user, tokens // 2))
            if used < c.max_running_user and c.release.logs_reduced_cap:
                self.sched_log(
                    f"max_running_requests was reduced from the requested {c.max_running_user} to {used} "
                    "(per dp worker) due to the available KV cache capacity."
                )
            return used
        auto = min(max(int(tokens / c.context_length * 512), 2048), 4096)
        return max(1, min(auto, tokens // 2))

    def _main_failed(self, lines: list[str]) -> None:
        head = [
            "Traceback (most recent call last):",
            '  File "<frozen runpy>", line 198, in _run_module_as_main',
            '  File "/usr/local/lib/python3.12/dist-packages/sglang/launch_server.py", line 29, in <module>',
            "    run_server(server_args)",
        ]
        self.log.write("\n".join(head + lines), stderr=True)

    def _scheduler_failed(self, lines: list[str], *, running: bool = False) -> bool:
        """Scheduler exception → SIGQUIT to the launcher → the launcher SIGKILLs its own tree."""
        trace = [
            f'  File "{SCHED_FILE}", line 3012, in run_scheduler_process',
            "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)"
            if not running
            else "    scheduler.event_loop_overlap()",
            *lines,
        ]
        self.sched_log("Scheduler hit an exception: Traceback (most recent call last):\n" + "\n".join(trace))
        if running:
            self.main_log("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        else:
            self.main_log("Received sigquit from a child process. It usually means the child failed.")
        self.rt.kill_self()
        return False

    # ---------------------------------------------------------------------------- serving
    async def _serve(self, plan: SglangMemoryPlan) -> None:
        c, s = self.cfg, self.settings
        self.stats = EngineStats(max_model_len=c.context_length)
        self.tokenizer = Tokenizer(c.model.vocab, c.model.bos)
        fp8 = bool(c.quantization and "fp8" in c.quantization)
        perf = PerfModel(c.model, s.gpu, self.fp, tp=c.tp, pp=c.pp, fp8_compute=fp8)
        engines: list[Engine] = []
        for rank in range(c.dp):
            pool = new_pool(plan.kv_tokens // PAGE, PAGE, c.radix_cache)
            sched = SglangScheduler(
                pool,
                self.stats,
                self.tokenizer.output_token,
                max_running=self.max_running,
                chunked_prefill_size=c.chunked_prefill_size,
                max_prefill_tokens=c.max_prefill_tokens,
                conservativeness=c.conservativeness,
                policy=c.policy,
                mixed_chunk=c.mixed_chunk,
                decode_graph_max_bs=c.decode_max_bs,
                prefill_graph_max_tokens=c.prefill_max_tokens,
                seed=s.seed,
            )
            engines.append(self.rt.build_engine(sched, perf, self.stats, self.fp, plan.runtime_free, self, rank))
        self.engines = EngineGroup(engines)
        self.kv_tokens = plan.kv_tokens
        self.plan = plan
        max_input = min(c.context_length - 1, plan.kv_tokens - 1)
        serving = ServingConfig(
            dialect="sglang",
            served_names=(c.served_name,),
            model_path=c.model_path,
            max_model_len=c.context_length,
            max_input_len=max_input,
            stream_interval=c.stream_interval,
            force_include_usage=c.include_usage,
            api_key=c.api_key,
            seed=s.seed,
            drop_connections=s.faults.drop_connections,
        )
        self.openai = OpenAIServer(serving, self.tokenizer, self.engines, self._dead_message)
        self._decode_steps = 0
        self._last_decode_log = (0.0, 0)
        self._last_prefill_t = 0.0
        self._gauges: dict[str, float] = {}
        self.started = time.time()
        try:
            sock = self.rt.bind(c.host, c.port)
        except OSError as exc:
            self.uvicorn(
                f"[Errno {exc.errno}] error while attempting to bind on address ('{c.host}', {c.port}): "
                f"{(exc.strerror or '').lower()}",
                level="ERROR",
            )
            self.rt.exit(1)
        self.uvicorn(f"Started server process [{self.pid}]")
        self.uvicorn("Waiting for application startup.")
        await self.rt.listen(sock, self._routes())
        self.uvicorn("Application startup complete.")
        self.uvicorn(f"Uvicorn running on http://{c.host}:{c.port} (Press CTRL+C to quit)")
        self._tasks = [asyncio.create_task(engine.run()) for engine in engines]
        if c.skip_warmup:
            self._ready()
        else:
            self._warmup()

    def _warmup(self) -> None:
        """One real 8-token generation, as ``_wait_and_warmup`` sends to ``/generate``."""
        prompt = self.tokenizer.encode("The capital city of France is")
        dialect = self

        class Sink:
            def emit(self, req: SimRequest, finished: bool) -> None:
                if finished:
                    dialect._ready()

            def fail(self, req: SimRequest, message: str) -> None:
                return None

        self.engines.engines[0].submit(SimRequest(0, prompt, 8, "length", 8, 0, sink=Sink()), internal=True)

    def _ready(self) -> None:
        self.status = "Up"
        self.main_log("The server is fired up and ready to roll!")
        self.rt.on_signals(self._on_signal)
        crash_s = self.settings.faults.crash_after_s
        if crash_s is not None:
            self.rt.later(crash_s, lambda: self.engines.engines[0].die(Fatal("crash")))

    def _dead_message(self) -> str | None:
        return "The server is not healthy." if self.dead else None

    def _routes(self) -> Router:
        api, r = self.openai, Router()
        r.add("GET", "/health", self._health)
        r.add("GET", "/health_generate", self._health)
        if self.cfg.release.ready_route:
            r.add("GET", "/ready", lambda q, p: p.send(200 if self.status == "Up" else 503, b""))
        r.add("GET", "/model_info", self._model_info)
        r.add("GET", "/get_model_info", self._model_info)
        r.add("GET", "/server_info", self._server_info)
        r.add("GET", "/get_server_info", self._server_info)
        r.add(("GET", "POST"), "/flush_cache", self._flush_cache)
        r.add("GET", "/v1/models", api.guard(api.models))
        r.add("POST", "/tokenize", api.guard(api.tokenize))
        r.add("POST", "/detokenize", api.guard(api.detokenize))
        r.add("POST", "/v1/completions", api.guard(api.completions))
        r.add("POST", "/v1/chat/completions", api.guard(api.chat))
        if self.cfg.enable_metrics:
            r.add("GET", "/metrics", self._metrics)
        return r

    def _health(self, request: Request, resp: Responder) -> None:
        if self.status != "Up" or self.dead:
            resp.send(503, b"")
        elif any(e.hung for e in self.engines.engines):
            # The health generation never returns; SGLang gives up after SGLANG_HEALTH_CHECK_TIMEOUT.
            self.rt.later(HEALTH_TIMEOUT_S, lambda: resp.send(503, b""))
        else:
            resp.send(200, b"")

    def _model_info(self, request: Request, resp: Responder) -> None:
        c = self.cfg
        resp.json(
            200,
            {
                "model_path": c.model_path,
                "tokenizer_path": c.model_path,
                "is_generation": True,
                "served_model_name": c.served_name,
                "weight_version": "default",
                "load_format": "auto",
                "model_type": c.model.architecture.lower().replace("forcausallm", ""),
                "architectures": [c.model.architecture],
            },
        )

    def _server_info(self, request: Request, resp: Responder) -> None:
        c, plan = self.cfg, self.plan
        gen = self._gauges.get("gen_throughput", 0.0)
        state = {
            "effective_max_running_requests_per_dp": self.max_running,
            "last_gen_throughput": gen,
            "memory_usage": {
                "weight": round(gib(self.fp.weight_bytes), 2),
                "kvcache": round(gib(plan.kv_bytes), 2),
                "token_capacity": plan.kv_tokens,
                "graph": round(gib(plan.prefill_graph + plan.decode_graph), 2),
            },
        }
        info = {
            **c.args,
            "max_total_num_tokens": plan.kv_tokens,
            "max_req_input_len": min(c.context_length - 1, plan.kv_tokens - 1),
            "startup_time": self.started,
            "version": c.version,
            "internal_states": [state] * c.dp,
            "launch_command": "python -m sglang.launch_server",
            "kv_events": None,
        }
        resp.json(200, info)

    def _flush_cache(self, request: Request, resp: Responder) -> None:
        for engine in self.engines.engines:
            engine.scheduler.pool.reset_cache()
        resp.send(200, b"Cache is flushed.", "text/plain")

    # ---------------------------------------------------------------------------- metrics
    def _metrics(self, request: Request, resp: Responder) -> None:
        resp.send(200, self.render_metrics().encode(), CONTENT_TYPE)

    def render_metrics(self) -> str:
        """The ``sglang:`` families; gauges are the values of the last prefill/decode log."""
        c, st = self.cfg, self.stats
        labels = {"model_name": c.served_name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
        m = Exposition(labels, st.created)
        g = self._gauges
        m.gauge("sglang:num_running_reqs", "The number of running requests.", g.get("running", 0))
        m.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", g.get("queue", 0))
        m.gauge("sglang:token_usage", "The token usage.", g.get("token_usage", 0))
        m.gauge("sglang:num_used_tokens", "The number of used tokens.", g.get("used_tokens", 0))
        m.gauge("sglang:kv_available_tokens", "Free KV tokens.", g.get("available_tokens", self.kv_tokens))
        m.gauge("sglang:kv_evictable_tokens", "Evictable cached KV tokens.", g.get("evictable_tokens", 0))
        m.gauge("sglang:gen_throughput", "The generation throughput (token/s).", g.get("gen_throughput", 0))
        m.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", st.prefix_hits / max(1, st.prefix_queries))
        m.gauge("sglang:num_retracted_reqs", "Retracted requests since the last report.", g.get("retracted", 0))
        m.gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV pool.", self.kv_tokens)
        m.gauge("sglang:kv_cache_memory_usage_gb", "KV cache memory (GB).", gib(self.plan.kv_bytes))
        m.gauge(
            "sglang:graph_memory_usage_gb",
            "CUDA graph memory (GB).",
            gib(self.plan.prefill_graph + self.plan.decode_graph),
        )
        m.gauge("sglang:new_token_ratio", "The new token ratio.", g.get("new_token_ratio", 0))
        m.gauge("sglang:is_cuda_graph", "Whether the last batch ran a CUDA graph.", g.get("cuda_graph", 0))
        m.counter("sglang:num_retracted_requests", "Retracted requests.", st.retracted_requests)
        m.counter("sglang:num_retracted_input_tokens", "Input tokens of retracted requests.", st.retracted_input_tokens)
        m.counter(
            "sglang:num_retracted_output_tokens", "Output tokens of retracted requests.", st.retracted_output_tokens
        )
        m.counter("sglang:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens)
        m.counter("sglang:generation_tokens", "Number of generation tokens processed.", st.generation_tokens)
        m.counter("sglang:cached_tokens", "Number of cached prompt tokens.", st.prompt_tokens_cached)
        m.counter("sglang:num_requests", "Number of requests processed.", sum(st.finished.values()))
        m.counter("sglang:num_aborted_requests", "Number of requests aborted.", st.finished.get("abort", 0))
        m.counters(
            "sglang:cuda_graph_passes",
            "Total number of forward passes categorized by CUDA graph.",
            dict(st.graph_passes),
            "mode",
        )
        m.counter(
            "sglang:realtime_tokens",
            "Tokens processed (prefill + generation).",
            st.prefill_tokens_computed + st.generation_tokens,
        )
        m.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", st.ttft)
        m.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", st.itl)
        m.histogram("sglang:request_time_per_output_token_seconds", "Histogram of time per output token.", st.tpot)
        m.histogram("sglang:e2e_request_latency_seconds", "Histogram of E2E request latency in seconds.", st.e2e)
        m.histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", st.queue)
        m.histogram("sglang:prompt_tokens_histogram", "Histogram of prompt token length.", st.request_prompt_tokens)
        m.histogram(
            "sglang:generation_tokens_histogram", "Histogram of generation token length.", st.request_generation_tokens
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
        if batch.retraction is not None:
            r = batch.retraction
            self.sched_log(
                f"KV cache pool is full. Retract requests. #retracted_reqs: {r.requests}, "
                f"#new_tokens_gained: {r.tokens_gained}, #new_token_ratio: {r.ratio_before:.4f} -> "
                f"{r.ratio_after:.4f}",
                flush=False,
            )
            self._gauges["retracted"] = r.requests
        for req in batch.aborted:
            self.sched_log(f"retract_decode: aborted last request {req.rid} due to OOM", flush=False)
        if not batch.items:
            return
        if batch.kind == "decode":
            self._decode_steps += 1
            if self._decode_steps % self.cfg.decode_log_interval == 0:
                self._decode_line(batch, now)
        else:
            self._prefill_line(batch, now)

    def _pool_state(self) -> tuple[int, int, float, int, int]:
        """(used tokens, evictable tokens, usage, running, queued) over the data-parallel ranks."""
        engines = self.engines.engines
        pools = [e.scheduler.pool for e in engines]
        # SGLang counts tokens, the model pages: leave out the unfilled tail of each last page.
        tails = sum(len(r.blocks) * PAGE - r.computed for e in engines for r in e.scheduler.held() if r.blocks)
        used = sum(p.used_blocks for p in pools) * PAGE - tails
        evictable = sum(p.evictable_blocks for p in pools) * PAGE
        usage = used / max(1, sum(p.num_blocks for p in pools) * PAGE)
        running = sum(len(e.scheduler.running) for e in engines)
        queue = sum(len(e.scheduler.waiting) for e in engines)
        return used, evictable, usage, running, queue

    def _update_gauges(self, graph: bool) -> None:
        used, evictable, usage, running, queue = self._pool_state()
        sched = self.engines.engines[0].scheduler
        assert isinstance(sched, SglangScheduler)
        self._gauges.update(
            running=running,
            queue=queue,
            token_usage=usage,
            used_tokens=used,
            evictable_tokens=evictable,
            available_tokens=self.kv_tokens - used - evictable,
            new_token_ratio=sched.ratio,
            cuda_graph=float(graph),
        )

    def _prefill_line(self, batch: Batch, now: float) -> None:
        new_tokens = batch.shape.tokens - batch.shape.decode_seqs
        _, _, usage, running, queue = self._pool_state()
        pending = sum(len(r.prompt) for e in self.engines.engines for r in e.scheduler.waiting)
        dt = now - self._last_prefill_t
        self._last_prefill_t = now
        graph = batch.shape.graph is not GraphMode.EAGER
        self.sched_log(
            f"Prefill batch, #new-seq: {batch.new_seqs}, #new-token: {new_tokens}, #cached-token: "
            f"{batch.cached_tokens}, token usage: {usage:.2f}, #running-req: {max(0, running - batch.new_seqs)}, "
            f"#queue-req: {queue}, "
            f"#pending-token: {pending}, cuda graph: {graph}, input throughput (token/s): "
            f"{new_tokens / dt if dt > 0 else 0.0:.2f}",
            flush=False,
        )
        self._update_gauges(graph)

    def _decode_line(self, batch: Batch, now: float) -> None:
        t0, g0 = self._last_decode_log
        gen = self.stats.generation_tokens
        self._last_decode_log = (now, gen)
        rate = (gen - g0) / (now - t0) if now > t0 and t0 > 0 else 0.0
        used, _, usage, running, queue = self._pool_state()
        graph = batch.shape.graph is not GraphMode.EAGER
        self.sched_log(
            f"Decode batch, #running-req: {running}, #token: {used}, token usage: {usage:.2f}, "
            f"cuda graph: {graph}, gen throughput (token/s): {rate:.2f}, #queue-req: {queue}",
            flush=False,
        )
        self._update_gauges(graph)
        self._gauges["gen_throughput"] = rate

    def on_lag(self, lag_s: float) -> None:
        self.main_log(
            f"autotune simulator: {lag_s:.2f} s of wall time behind the model so far (host CPU-bound); "
            "client-side rates are lower than modelled. Lower AUTOTUNE_SIM_SPEEDUP."
        )

    def on_fatal(self, fatal: Fatal) -> None:
        """The scheduler crashes (uncaught CUDA OOM or injected crash): the whole tree is SIGKILLed."""
        self.dead = True
        gpu = self.settings.gpu
        cause = (
            torch_oom(fatal.need - fatal.free + 0.1 * GIB, fatal.free, gpu.torch_total_gib)
            if fatal.kind == "oom"
            else ["RuntimeError: CUDA error: an illegal memory access was encountered"]
        )
        self._scheduler_failed(cause, running=True)

    def _on_signal(self, signum: int) -> None:
        """SIGTERM after warm-up: health turns 503, in-flight requests drain, then exit."""
        self.status = "Shutting down"
        force = self.settings.engine_env.get("SGL_FORCE_SHUTDOWN") == "1"

        async def drain() -> None:
            while not force:
                left = sum(len(e.in_flight()) for e in self.engines.engines)
                if not left:
                    break
                self.main_log(f"Gracefully exiting... Remaining number of requests {left}")
                await self.rt.pause(5.0)
            self.rt.exit(0)

        asyncio.get_running_loop().create_task(drain())
