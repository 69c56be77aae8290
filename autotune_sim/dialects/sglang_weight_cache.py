"""SGLang 0.5.23's weight cache: the standalone daemon and the engine's IPC loader.

``python -m autotune_sim sglang-weight-cache [daemon flags] [server flags]`` is
``python -m sglang.srt.weight_cache.daemon``: its own flags (``--gpu-id``, ``--tp-rank``,
``--pp-rank``, ``--dist-init-method``, ``--timeout``, ``--force``) are read first and the rest are
SGLang's server flags. Each local rank loads its shard from disk, binds the socket at
``SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE`` (default ``/tmp/sglang_weight_cache_{device_uuid}.sock``)
and writes the ``.ready`` file beside it (``SGLANG_WEIGHT_CACHE_READY_TEMPLATE``). SIGINT / SIGTERM
remove both.

The engine (``srt/weight_cache/ipc_loader.py``) maps the daemon's weights in ``client`` mode, and
in ``daemon`` mode after spawning its own daemon, which lives and dies with the engine. A missing
socket file falls back to a disk load in client mode; a socket that refuses, a config mismatch,
or (daemon mode) any unavailability is a hard error. The weights are always mapped, never copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune_sim.dialects.base import LogWriter, Runtime, expand_config, modelled_banner, rank_footprint, ts_sglang
from autotune_sim.dialects.sglang_args import RELEASES, SglangConfig, StartupError, build_parser, resolve
from autotune_sim.presets import find_model
from autotune_sim.settings import SimSettings
from autotune_sim.weight_cache import (
    DaemonAbsent,
    DaemonRefused,
    DaemonServer,
    WeightStore,
    ask,
    device_uuid,
    tensor_count,
)

__all__ = ["WeightCacheFetch", "fetch_weights", "run_daemon", "socket_path", "start_engine_daemons", "watch_daemon"]

SOCKET_TEMPLATE = "/tmp/sglang_weight_cache_{device_uuid}.sock"
READY_TEMPLATE = "/tmp/sglang_weight_cache_{device_uuid}.ready"
DAEMON_IMPORT_S = 6.0
MAP_S = 1.0  # mapping the daemon's IPC handles instead of reading the checkpoint
LIVENESS_POLL_S = 5.0  # ipc_loader.py _DAEMON_LIVENESS_POLL_INTERVAL
LOADER = "[IpcModelLoader]"


def _path(env: dict[str, str], name: str, default: str, rank: int) -> str:
    template = env.get(name) or default
    if "{device_uuid}" not in template:
        raise ValueError(f"{name}={template!r} must contain '{{device_uuid}}'")
    return template.format(device_uuid=device_uuid(rank))


def socket_path(env: dict[str, str], rank: int = 0) -> str:
    """``get_socket_path``: the socket template filled with this GPU's UUID."""
    return _path(env, "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE", SOCKET_TEMPLATE, rank)


def ready_path(env: dict[str, str], rank: int = 0) -> str:
    return _path(env, "SGLANG_WEIGHT_CACHE_READY_TEMPLATE", READY_TEMPLATE, rank)


def cache_config(cfg: SglangConfig, rank: int = 0) -> dict[str, Any]:
    """The ``CacheConfig`` fields the simulator can tell apart (``protocol.py``), in its order.

    No ``kv_cache_dtype``, ``mem_fraction_static`` or batch limits: one daemon serves them all.
    """
    dtype = {"half": "torch.float16", "float16": "torch.float16", "float": "torch.float32"}.get(
        cfg.dtype, "torch.float32" if cfg.dtype == "float32" else "torch.bfloat16"
    )
    return {
        "model_path": cfg.model_path,
        "model_arch": cfg.model.architecture,
        "tp_size": cfg.tp,
        "tp_rank": rank % cfg.tp,
        "pp_size": cfg.pp,
        "pp_rank": rank // cfg.tp,
        "dp_size": cfg.dp,
        "quant_method": cfg.quantization or "",
        "dtype": dtype,
        "revision": "",
    }


# ------------------------------------------------------------------------------------ daemon
class Daemons:
    """The daemons of one launcher (or of one engine in ``daemon`` mode), logging as SGLang does."""

    def __init__(self, settings: SimSettings, log: LogWriter, cfg: SglangConfig) -> None:
        self.settings, self.log, self.cfg = settings, log, cfg
        self.env = dict(settings.engine_env)
        self.servers: list[DaemonServer] = []
        self.ready_files: list[str] = []

    def line(self, msg: str) -> None:
        self.log.write(f"[{ts_sglang(False)}] {msg}", stderr=True)

    async def load_and_serve(self, ranks: list[int], rt: Runtime) -> None:
        """Load every rank's shard from disk (one disk read in all), then bind and mark ready."""
        c = self.cfg
        fp = rank_footprint(c, self.settings.gpu)
        for rank in ranks:
            self.line(f"[WeightCacheDaemon gpu={rank} tp_rank={rank % c.tp}] Loading model from disk: {c.model_path}")
        load_s = self.settings.weight_read_s(fp.weight_bytes * c.tp * c.pp)
        await rt.pause(load_s)
        for rank in ranks:
            await self._serve(rank, fp.weight_bytes, load_s)

    async def _serve(self, rank: int, weights: float, load_s: float) -> None:
        c, tensors = self.cfg, tensor_count(self.cfg.model)
        who = f"[WeightCacheDaemon gpu={rank} tp_rank={rank % c.tp}]"
        self.line(f"{who} Model loaded from disk in {load_s:.2f}s")
        self.line(f"{who} Exported {tensors} tensors as IPC handles.")
        key = cache_config(c, rank)
        store = WeightStore(key, weights, tensors, on_event=lambda kind, detail: self._event(rank, kind, detail))
        server = DaemonServer(socket_path(self.env, rank), store)
        await server.start(replace_stale=False)
        self.servers.append(server)
        ready = ready_path(self.env, rank)
        with open(ready, "w") as fh:
            fh.write(f"pid={os.getpid()}\nconfig={key}\n")
        self.ready_files.append(ready)
        self.line(f"[WeightCacheDaemon gpu={rank}] Listening on {server.path}")

    def _event(self, rank: int, kind: str, detail: Any) -> None:
        if kind == "mismatch":
            fields, engine = detail
            daemon = self.servers[0].store.key if self.servers else {}
            diff = {name: (daemon.get(name), engine.get(name)) for name in fields}
            self.line(f"[WeightCacheDaemon gpu={rank}] Config mismatch: {diff}")
        elif kind == "sent":
            self.line(f"[WeightCacheDaemon gpu={rank}] Serving {detail} tensors via torch_ipc transport")

    def shut_down(self, signum: int | None = None) -> None:
        """Remove every socket and ready file, as each daemon's ``serve`` does on its way out."""
        for rank, server in enumerate(self.servers):
            if signum is not None:
                self.line(f"[WeightCacheDaemon gpu={rank}] Received signal {signum}, shutting down")
            server.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.ready_files[rank])
            self.line(f"[WeightCacheDaemon gpu={rank}] Shutdown complete")
        self.servers = []


def _stale_check(env: dict[str, str], rank: int, force: bool) -> None:
    """``cleanup_stale_daemon_files``: refuse a live daemon's files, remove a dead one's."""
    ready, sock = ready_path(env, rank), socket_path(env, rank)
    pid = _ready_pid(ready)
    if pid is not None and _alive(pid) and not force:
        raise RuntimeError(
            f"Weight cache daemon for GPU {device_uuid(rank)} is already running (pid={pid}, ready={ready}). Stop "
            "the existing daemon before launching a new one, or pass force=True (--force) to kill it and take over."
        )
    if pid is not None and _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for path in (ready, sock):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _ready_pid(path: str) -> int | None:
    with contextlib.suppress(OSError, ValueError), open(path) as fh:
        for line in fh:
            if line.startswith("pid="):
                return int(line.strip().split("=", 1)[1])
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _daemon_parser() -> Any:
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--gpu-id", type=int, default=None)
    parser.add_argument("--tp-rank", type=int, default=None)
    parser.add_argument("--pp-rank", type=int, default=0)
    parser.add_argument("--dist-init-method", default=None)
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--force", action="store_true")
    return parser


def run_daemon(settings: SimSettings, log: LogWriter, argv: list[str]) -> int:
    """``python -m sglang.srt.weight_cache.daemon``; returns the exit code."""
    release = RELEASES.get(settings.sglang_version)
    if release is None or not release.weight_cache:
        log.write(
            "python3: Error while finding module specification for 'sglang.srt.weight_cache.daemon' "
            "(ModuleNotFoundError: No module named 'sglang.srt.weight_cache')",
            stderr=True,
        )
        return 1
    own, server_argv = _daemon_parser().parse_known_args(argv)
    try:
        ns = build_parser(settings.sglang_version).parse_args(expand_config(server_argv, negate=False))
    except SystemExit as exc:
        return int(exc.code or 0)
    model = find_model(ns.model_path)
    try:
        if model is None:
            missing = f"OSError: {ns.model_path} is not a local folder and is not a valid model identifier"
            raise StartupError("main", [missing])
        cfg = resolve(ns, settings.sglang_version, settings.gpu, model, dict(settings.engine_env), settings.num_gpus)
    except StartupError as err:
        log.write("\n".join(["Traceback (most recent call last):", *err.lines]), stderr=True)
        return 1
    return asyncio.run(_launch(settings, log, cfg, own))


async def _launch(settings: SimSettings, log: LogWriter, cfg: SglangConfig, own: Any) -> int:
    rt = Runtime(settings, log)
    await rt.pause(DAEMON_IMPORT_S)
    daemons = Daemons(settings, log, cfg)
    daemons.line(modelled_banner(settings))
    single = own.gpu_id is not None or own.tp_rank is not None
    ranks = [own.gpu_id if own.gpu_id is not None else own.tp_rank] if single else list(range(cfg.tp * cfg.pp))
    try:
        for rank in ranks:
            _stale_check(daemons.env, rank, own.force)
    except RuntimeError as exc:
        log.write(f"Traceback (most recent call last):\nRuntimeError: {exc}", stderr=True)
        return 1
    rt.on_signals(lambda signum: _stop(rt, daemons, signum))
    init = own.dist_init_method or "tcp://127.0.0.1:29500"
    if not single:
        for rank in ranks:
            where = f"gpu={rank} pp_rank={rank // cfg.tp} tp_rank={rank % cfg.tp}"
            daemons.line(f"Launched weight cache daemon {where} pid={os.getpid()}")
    await daemons.load_and_serve(ranks, rt)
    if not single:
        for rank in ranks:
            daemons.line(f"Weight cache daemon pp_rank={rank // cfg.tp} tp_rank={rank % cfg.tp} is ready")
        daemons.line(
            f"All {len(ranks)} weight cache daemons on node 0 are ready (pp_ranks=0..{cfg.pp - 1}, "
            f"tp_ranks=0..{cfg.tp - 1}, dist_init_method={init})"
        )
    await asyncio.Event().wait()
    return 0


def _stop(rt: Runtime, daemons: Daemons, signum: int) -> None:
    """Each daemon removes its files; the launcher reports and ends (SIGTERM ends it by the signal)."""
    daemons.shut_down(signum)
    daemons.line("All weight cache daemons have been terminated")
    daemons.log.flush()
    if signum == signal.SIGTERM:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    rt.exit(0)


# ------------------------------------------------------------------------------------ engine
async def start_engine_daemons(settings: SimSettings, log: LogWriter, cfg: SglangConfig, rt: Runtime) -> Daemons:
    """``--weight-cache-mode daemon``: the engine's own daemons, gone when the engine exits."""
    daemons = Daemons(settings, log, cfg)
    ranks = list(range(cfg.tp * cfg.pp))
    daemons.line(
        f"Launching {len(ranks)} weight cache daemon(s) on node 0 for model={cfg.model_path}, "
        f"pp_ranks=0..{cfg.pp - 1}, tp_ranks=0..{cfg.tp - 1}, dist_init_method=tcp://127.0.0.1:29500"
    )
    for rank in ranks:
        _stale_check(daemons.env, rank, force=False)
    rt.at_exit(daemons.shut_down)
    await daemons.load_and_serve(ranks, rt)
    return daemons


@dataclass
class WeightCacheFetch:
    """One engine's conversation with the daemon on its GPU."""

    path: str
    daemon_bytes: float = 0.0  # what the daemon holds on the device at the engine's start
    mapped: bool = False
    tensors: int = 0
    daemon_pid: int | None = None  # the client's liveness watchdog polls it
    lines: list[str] = field(default_factory=list)  # the loader's log lines, in order
    error: list[str] = field(default_factory=list)  # the loader raised: the scheduler dies


async def fetch_weights(cfg: SglangConfig, env: dict[str, str]) -> WeightCacheFetch:
    """``IpcModelLoader._fetch_from_cache`` and its fallback-vs-raise contract."""
    path = cfg.weight_cache_socket or socket_path(env)
    result = WeightCacheFetch(path)
    with contextlib.suppress(DaemonAbsent, DaemonRefused):
        result.daemon_bytes = float((await ask(path, {"cmd": "get_memory"})).get("memory_bytes", 0))
    key = cache_config(cfg)
    try:
        reply = await ask(path, {"cmd": "get_state", "key": key})
    except DaemonAbsent:
        return _absent(cfg, result)
    except DaemonRefused:
        result.error = [
            f"RuntimeError: {LOADER} Daemon socket exists at {path} but refused the connection. The daemon may "
            "have crashed after creating the socket. Check daemon logs."
        ]
        return result
    result.lines.append(
        f"{LOADER} Requesting weights from daemon at {path} with config: model={key['model_path']}, "
        f"arch={key['model_arch']}, tp={key['tp_size']}/{key['tp_rank']}, quant={key['quant_method']}, "
        f"dtype={key['dtype']}"
    )
    if reply.get("status") != "ok":
        result.error = [
            f"RuntimeError: {LOADER} Daemon config mismatch!",
            f"  Engine config: {key}",
            f"  Daemon config: {reply.get('daemon_key', {})}",
        ]
        return result
    result.mapped, result.tensors, result.daemon_pid = True, int(reply.get("tensors", 0)), reply.get("pid")
    result.lines += [
        f"{LOADER} Fetched {result.tensors} tensors from daemon (transport=torch_ipc) in 0.05s",
        f"{LOADER} Zero-copy: mapped {result.tensors} tensors (0 new post-quant), time={MAP_S - 0.1:.3f}s",
        f"{LOADER} Started daemon-liveness watchdog for pid={result.daemon_pid}",
        f"{LOADER} Loaded model via IPC (mode={cfg.weight_cache_mode}), total={MAP_S:.2f}s",
    ]
    return result


async def watch_daemon(rt: Runtime, pid: int, log: Callable[[str], None]) -> None:
    """``_start_daemon_liveness_watchdog``: the mapped weights dangle once the daemon is gone, so
    the engine kills itself (polled every 5 s)."""
    while _alive(pid):
        await rt.pause(LIVENESS_POLL_S)
    log(
        f"{LOADER} Weight cache daemon (pid={pid}) died while this engine holds its weights via CUDA IPC. The "
        "mapped weight pointers are now dangling; continuing would read freed GPU memory. Terminating this process."
    )
    rt.kill_self()


def _absent(cfg: SglangConfig, result: WeightCacheFetch) -> WeightCacheFetch:
    result.lines.append(f"{LOADER} Daemon socket not found at {result.path}.")
    if cfg.weight_cache_mode == "daemon":
        result.error = [
            f"RuntimeError: {LOADER} Weight cache daemon not available at {result.path}. In daemon mode, fallback "
            "to disk loading is disabled because the daemon process already holds weights on the same GPU — "
            "loading from disk would cause OOM. Please ensure the weight cache daemon is running and the config "
            "matches."
        ]
    else:
        result.lines.append(f"{LOADER} Weight cache not available or config mismatch, falling back to disk load")
    return result
