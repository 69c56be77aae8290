"""vLLM 0.34's weight cache on the engine side: ``--load-format ipc_cache``.

As ``model_executor/model_loader/weight_cache/ipc_loader.py`` does, the engine reads
``--model-loader-extra-config`` (``mode`` zero_copy|copy, ``fallback``, ``socket_dir`` /
``socket_path``, ``connect_timeout_s``, ``state_timeout_s``), asks the daemon on this GPU's socket
how many bytes it holds (zero_copy: they are charged against the utilization budget), then asks for
the weights under its ``WeightCacheKey``. A mismatch, an absent daemon or released weights fall
back to a disk load when ``fallback`` is true (the default) and fail the engine otherwise. Copy mode
clones the weights and asks the daemon to release its own copy.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from autotune_sim.dialects.base import Runtime
from autotune_sim.dialects.vllm_args import VllmConfig
from autotune_sim.weight_cache import DaemonAbsent, DaemonRefused, ask, device_uuid, md5_hex, watch

__all__ = ["IpcFailure", "IpcResult", "negotiate", "socket_dir", "socket_path", "weight_key"]

PROTOCOL = "vllm.model_executor.model_loader.weight_cache.protocol"
RETRY_S = 0.5  # ipc_loader.py _STARTUP_RETRY_INTERVAL_S
MAP_S = 1.0  # mapping the daemon's IPC handles instead of reading the checkpoint


class IpcFailure(Exception):
    """The loader raises: ``lines`` end the EngineCore traceback."""

    def __init__(self, *lines: str) -> None:
        super().__init__(lines[-1])
        self.lines = list(lines)


@dataclass
class IpcResult:
    """What the engine learnt from the daemon, and what it does with the weights."""

    mode: str
    socket_path: str
    daemon_bytes: float = 0.0  # weights the daemon holds on this GPU at the engine's start
    external_bytes: float = 0.0  # zero_copy's charge against the budget, as first queried
    mapped: bool = False  # the weights come from the daemon (else a disk load)
    tensors: int = 0
    watch: asyncio.StreamReader | None = None  # zero_copy: ends when the daemon exits
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (where, message)
    infos: list[tuple[str, str]] = field(default_factory=list)


def socket_dir(extra: dict[str, Any]) -> str:
    """``get_socket_dir``: the configured directory, else a per-user one under the temp dir."""
    configured = extra.get("socket_dir")
    return str(configured) if configured else os.path.join(tempfile.gettempdir(), f"vllm_weight_cache_{os.getuid()}")


def socket_path(directory: str, rank: int = 0) -> str:
    """``get_socket_path``: ``vllm_weight_cache_<md5(gpu uuid)>.sock`` in the socket directory."""
    return os.path.join(directory, f"vllm_weight_cache_{md5_hex(device_uuid(rank))}.sock")


def torch_dtype(dtype: str) -> str:
    """``str(model_config.dtype)``: the presets' checkpoints are bfloat16."""
    return {"half": "torch.float16", "float16": "torch.float16", "float": "torch.float32"}.get(
        dtype, "torch.float32" if dtype == "float32" else "torch.bfloat16"
    )


def weight_key(cfg: VllmConfig, rank: int = 0) -> dict[str, Any]:
    """``WeightCacheKey.from_model_config``'s fields the simulator can tell apart, in its order.

    Not in it, as in vLLM: ``max_num_seqs``, batched tokens, ``gpu_memory_utilization``, graph
    sizes. A non-MoE model's DP ranks are independent replicas keyed ``(1, 0)``.
    """
    dp_size, dp_rank = (cfg.dp, 0) if cfg.model.is_moe else (1, 0)
    return {
        "checkpoint": cfg.model_name,
        "model_arch": cfg.model.architecture,
        "tp_size": cfg.tp,
        "tp_rank": rank % cfg.tp,
        "dtype": torch_dtype(cfg.dtype),
        "quantization": cfg.quantization,
        "kv_cache_dtype": cfg.kv_dtype,
        "revision": cfg.compile_factors.get("revision"),
        "vllm_version": cfg.version,
        "pp_size": cfg.pp,
        "pp_rank": rank // cfg.tp,
        "is_draft": False,
        "dp_size": dp_size,
        "dp_rank": dp_rank,
        "enable_expert_parallel": cfg.enable_expert_parallel,
    }


@dataclass(frozen=True)
class LoaderConfig:
    mode: str
    fallback: bool
    path: str
    connect_timeout_s: float
    state_timeout_s: float


def loader_config(extra: dict[str, Any]) -> LoaderConfig:
    """``IpcModelLoader.__init__``'s reading of the extra config, with its errors."""
    extra = dict(extra)
    path = extra.pop("socket_path", None) or socket_path(socket_dir(extra))
    extra.pop("socket_dir", None)
    mode = extra.pop("mode", "zero_copy")
    fallback = bool(extra.pop("fallback", True))
    connect = float(extra.pop("connect_timeout_s", 5.0))
    state = float(extra.pop("state_timeout_s", 300.0))
    if mode not in ("zero_copy", "copy"):
        raise IpcFailure(f"ValueError: Invalid weight cache mode {mode!r}, expected 'zero_copy' or 'copy'")
    if extra:
        raise IpcFailure(f"ValueError: Unexpected extra config keys for load format ipc_cache: {sorted(extra)}")
    return LoaderConfig(mode, fallback, path, connect, state)


def _unavailable(exc: OSError, path: str) -> str:
    if isinstance(exc, DaemonAbsent):
        return f"Weight cache socket {path} is unavailable: [Errno 2] No such file or directory: '{path}'"
    return f"Cannot connect to weight cache daemon at {path}: [Errno {exc.errno}] {exc.strerror}"


async def _with_startup_wait(rt: Runtime, lc: LoaderConfig, request: dict[str, Any], result: IpcResult) -> Any:
    """``_with_startup_wait``: retry every 0.5 s until the daemon answers or the state timeout ends."""
    waited = 0.0
    while True:
        try:
            return await ask(lc.path, request, lc.connect_timeout_s)
        except (DaemonAbsent, DaemonRefused) as exc:
            if waited >= lc.state_timeout_s:
                raise IpcFailure(
                    f"{PROTOCOL}.WeightCacheUnavailableError: Weight cache daemon did not become ready within "
                    f"{lc.state_timeout_s:.1f}s: {_unavailable(exc, lc.path)}"
                ) from None
            if waited == 0.0 and not result.infos:
                result.infos.append(
                    (
                        "ipc_loader.py:450",
                        f"Waiting up to {lc.state_timeout_s:.1f}s for the weight cache daemon to start",
                    )
                )
            await rt.pause(RETRY_S)
            waited += RETRY_S


async def _device_bytes(lc: LoaderConfig) -> float:
    """What the daemon holds on the device now, whatever the engine asks it (no log line)."""
    try:
        reply = await ask(lc.path, {"cmd": "get_memory"}, lc.connect_timeout_s)
    except (DaemonAbsent, DaemonRefused):
        return 0.0
    return float(reply.get("memory_bytes", 0))


async def _charge_external(rt: Runtime, lc: LoaderConfig, result: IpcResult) -> None:
    """``get_external_weight_memory``: zero_copy charges the daemon's bytes to the budget; copy
    mode clones the weights into the engine and charges nothing."""
    if lc.mode != "zero_copy":
        return
    if not lc.fallback:
        reply = await _with_startup_wait(rt, lc, {"cmd": "get_memory"}, result)
        result.external_bytes = float(reply.get("memory_bytes", 0))
        return
    try:
        reply = await ask(lc.path, {"cmd": "get_memory"}, lc.connect_timeout_s)
    except (DaemonAbsent, DaemonRefused) as exc:
        result.warnings.append(
            (
                "ipc_loader.py:168",
                f"Cannot query weight cache daemon memory ({_unavailable(exc, lc.path)}); "
                "assuming the weights are not externally held",
            )
        )
        return
    result.external_bytes = float(reply.get("memory_bytes", 0))


async def _request_state(rt: Runtime, lc: LoaderConfig, key: dict[str, Any], result: IpcResult) -> dict[str, Any]:
    request = {"cmd": "get_state", "key": key}
    if lc.fallback:
        try:
            reply = await ask(lc.path, request, lc.state_timeout_s)
        except (DaemonAbsent, DaemonRefused) as exc:
            raise IpcFailure(f"{PROTOCOL}.WeightCacheUnavailableError: {_unavailable(exc, lc.path)}") from None
    else:
        reply = await _with_startup_wait(rt, lc, request, result)
    status = reply.get("status")
    if status == "mismatch":
        raise IpcFailure(f"{PROTOCOL}.CacheConfigMismatchError: WeightCacheKey mismatch on fields: {reply['fields']}")
    if status != "ok":
        raise IpcFailure(f"{PROTOCOL}.WeightCacheUnavailableError: Weight cache daemon error: {reply.get('message')}")
    return reply


async def negotiate(rt: Runtime, cfg: VllmConfig) -> IpcResult:
    """The daemon conversation of one engine start, up to deciding between map and disk load.

    Raises :class:`IpcFailure` where vLLM's loader raises (bad extra config, or no fallback).
    """
    lc = loader_config(cfg.loader_extra)
    result = IpcResult(lc.mode, lc.path)
    await _charge_external(rt, lc, result)
    result.daemon_bytes = await _device_bytes(lc)
    try:
        reply = await _request_state(rt, lc, weight_key(cfg), result)
    except IpcFailure as failure:
        if not lc.fallback:
            raise
        reason = failure.lines[-1].split(": ", 1)[1]
        result.warnings.append(("ipc_loader.py:258", f"Weight cache unusable ({reason}); falling back to disk loading"))
        return result
    result.mapped = True
    result.tensors = int(reply.get("tensors", 0))
    if lc.mode == "copy":
        await _release(lc, result)
    else:
        await _watch(lc, result)
    return result


async def _watch(lc: LoaderConfig, result: IpcResult) -> None:
    """``_watch_daemon``: zero_copy engines learn when the daemon serving their weights exits."""
    try:
        result.watch = await watch(lc.path, lc.connect_timeout_s)
    except (TimeoutError, OSError) as exc:
        result.warnings.append(("ipc_loader.py:551", f"Cannot watch the weight cache daemon: {exc}"))


async def _release(lc: LoaderConfig, result: IpcResult) -> None:
    """Copy mode: the engine owns its clone now; the daemon frees its copy."""
    try:
        await ask(lc.path, {"cmd": "release"}, lc.connect_timeout_s)
    except (DaemonAbsent, DaemonRefused):
        result.warnings.append(("ipc_loader.py:538", "Failed to ask the weight cache daemon to release"))
