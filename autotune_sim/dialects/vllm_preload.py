"""``python -m autotune_sim vllm preload ...``: vLLM 0.34's weight-cache daemon (``vllm preload``).

As ``entrypoints/cli/preload.py`` and ``model_executor/model_loader/weight_cache/daemon.py`` do:
the engine's own flags plus ``--weight-cache-socket-dir`` / ``--weight-cache-health-port`` /
``--weight-cache-health-host``; one daemon per local rank loads its shard from disk (the disk load
time, once), binds ``vllm_weight_cache_<md5(gpu uuid)>.sock`` in the socket directory, and the
launcher logs ``===== Weight cache daemon READY: ... =====`` once every rank serves. ``/health``
on the health port answers 503 until then and 200 after. SIGTERM / SIGINT remove the sockets and
exit with 128 + the signal number, as the launcher's ``sys.exit(exit_code)`` does.

Before 0.34 there is no ``preload`` subcommand: the CLI rejects it as an invalid choice (exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from autotune_sim.dialects.base import LogWriter, Router, Runtime, gib, modelled_banner, rank_footprint, ts_vllm
from autotune_sim.dialects.vllm_args import ConfigFailure, build_parser, preprocess, resolve
from autotune_sim.dialects.vllm_ipc import PROTOCOL, socket_dir, socket_path, weight_key
from autotune_sim.http import Request, Responder
from autotune_sim.settings import SimSettings
from autotune_sim.weight_cache import DaemonServer, WeightStore, ask, tensor_count

__all__ = ["run_preload"]

IMPORT_S = 8.0
SUBCOMMANDS = "'chat', 'complete', 'serve', 'launch', 'bench', 'collect-env', 'run-batch'"
STARTUP_FREED_GIB = 0.5  # communicators and BLAS workspaces the daemon gives back after loading


def run_preload(settings: SimSettings, log: LogWriter, argv: list[str]) -> int:
    """Run ``vllm preload`` for ``argv`` (the flags after ``preload``); return the exit code."""
    if settings.vllm_version < "0.34":
        log.write("usage: vllm [-h] [-v] {chat,complete,serve,launch,bench,collect-env,run-batch} ...", stderr=True)
        log.write(
            f"vllm: error: argument subparser: invalid choice: 'preload' (choose from {SUBCOMMANDS})", stderr=True
        )
        return 2
    parser = _parser(settings.vllm_version)
    try:
        ns = parser.parse_args(preprocess(argv))
        if ns.model_tag is not None:  # preload takes the engine's flags only, no positional model
            parser.error(f"unrecognized arguments: {ns.model_tag}")
    except SystemExit as exc:
        return int(exc.code or 0)
    return asyncio.run(Preload(settings, log).run(ns))


def _parser(version: str) -> argparse.ArgumentParser:
    parser = build_parser(version)
    parser.prog, parser.usage = "vllm preload", "vllm preload --model <model> [options]"
    extra = parser.add_argument_group("Preload")
    extra.add_argument(
        "--weight-cache-socket-dir",
        type=str,
        default=None,
        help="Directory for the daemon Unix sockets (default: tempdir).",
    )
    extra.add_argument(
        "--weight-cache-master-port", type=int, default=None, help="Rendezvous port for the daemon's own TP group."
    )
    extra.add_argument(
        "--weight-cache-draft-master-port",
        type=int,
        default=None,
        help="Rendezvous port for the MTP draft daemon group.",
    )
    extra.add_argument(
        "--weight-cache-health-port",
        type=int,
        default=None,
        help="Port for the parent /health endpoint; disabled by default.",
    )
    extra.add_argument(
        "--weight-cache-health-host",
        type=str,
        default="0.0.0.0",
        help="Host for the parent /health endpoint (default: 0.0.0.0).",
    )
    return parser


class Preload:
    """The launcher and its per-rank daemons, in one process."""

    def __init__(self, settings: SimSettings, log: LogWriter) -> None:
        self.settings, self.log = settings, log
        self.rt = Runtime(settings, log)
        self.ready = False
        self.servers: list[DaemonServer] = []

    def line(self, where: str, msg: str, level: str = "INFO") -> None:
        self.log.write(f"{level} {ts_vllm()} [{where}] {msg}")

    async def run(self, ns: Any) -> int:
        await self.rt.pause(IMPORT_S)
        self.line("autotune_sim.py:1", modelled_banner(self.settings), "WARNING")
        try:
            cfg = resolve(ns, self.settings, dict(self.settings.engine_env))
            if cfg.load_format == "ipc_cache":
                raise ConfigFailure(
                    ["ValueError: The weight cache daemon itself must load from disk; use the default --load-format"]
                )
        except ConfigFailure as failure:
            self.log.write("\n".join(["Traceback (most recent call last):", *failure.lines]), stderr=True)
            return 1
        if ns.weight_cache_health_port is not None and not await self._health(ns):
            return 1
        self.rt.on_signals(self._stop)
        fp = rank_footprint(cfg, self.settings.gpu)
        ranks = cfg.tp * cfg.pp
        await self.rt.pause(self.settings.weight_read_s(fp.weight_bytes * ranks))
        directory = socket_dir({"socket_dir": ns.weight_cache_socket_dir})
        try:
            for rank in range(ranks):
                await self._serve_rank(rank, directory, weight_key(cfg, rank), fp.weight_bytes, tensor_count(cfg.model))
        except DaemonTaken as taken:
            # The rank's process dies of it; the launcher sees an early exit and stops the others.
            self.log.write(f"{PROTOCOL}.WeightCacheUnavailableError: {taken}", stderr=True)
            self.line(
                "preload.py:415",
                "Weight cache daemon rank(s) exited during startup (exitcodes=[1]); shutting down.",
                "ERROR",
            )
            self._stop_servers()
            return 1
        self.ready = True
        shown = ns.weight_cache_socket_dir or "the default socket dir"
        self.line(
            "preload.py:438",
            f"===== Weight cache daemon READY: node 0/1 serving {ranks} local rank(s) x 1 role(s) in {shown} =====",
        )
        await asyncio.Event().wait()
        return 0

    async def _serve_rank(self, rank: int, directory: str, key: dict[str, Any], weights: float, tensors: int) -> None:
        allocated = gib(weights)
        self.line(
            "daemon.py:317",
            f"Weight cache target daemon rank {rank} loaded model ({allocated:.2f} GiB allocated, "
            f"{allocated + STARTUP_FREED_GIB:.2f} GiB reserved)",
        )
        self.line(
            "daemon.py:351",
            f"Weight cache target daemon rank {rank} released startup resources ({STARTUP_FREED_GIB:.2f} GiB freed)",
        )
        store = WeightStore(key, weights, tensors, on_event=lambda kind, detail: self._event(rank, kind, detail))
        server = DaemonServer(socket_path(directory, rank), store)
        if await _serving(server.path):
            raise DaemonTaken(f"Another weight cache daemon already owns {server.path}")
        await server.start()
        self.servers.append(server)
        self.line("daemon.py:411", f"Weight cache target daemon rank {rank} serving on {server.path}")

    def _event(self, rank: int, kind: str, detail: Any) -> None:
        if kind == "mismatch":
            self.line("daemon.py:504", f"WeightCacheKey mismatch on fields: {detail[0]}", "WARNING")
        elif kind == "sent":
            self.line(
                "daemon.py:522", f"Weight cache target daemon rank {rank} sent {detail} tensors (+0 aliases) to engine"
            )
        elif kind == "release":
            self.line("daemon.py:557", f"Weight cache target daemon rank {rank} released cached weights")

    async def _health(self, ns: Any) -> bool:
        """The launcher's ``/health``: 503 while loading, 200 once every rank serves."""
        router = Router()
        router.add("GET", "/health", self._health_status)
        try:
            sock = self.rt.bind(ns.weight_cache_health_host, ns.weight_cache_health_port)
        except OSError as exc:
            self.log.write(f"OSError: [Errno {exc.errno}] {exc.strerror}", stderr=True)
            return False
        await self.rt.listen(sock, router)
        return True

    def _health_status(self, request: Request, resp: Responder) -> None:
        resp.send(200 if self.ready else 503, b"")

    def _stop_servers(self) -> None:
        for server in self.servers:
            server.close()
        self.servers = []

    def _stop(self, signum: int) -> None:
        self._stop_servers()
        self.rt.exit(128 + signum)


class DaemonTaken(Exception):
    """A live daemon already serves this GPU's socket (``WeightCacheDaemon._acquire_gpu_lock``)."""


async def _serving(path: str) -> bool:
    """Whether a live daemon answers on ``path`` (a stale socket file from a dead one does not)."""
    try:
        await ask(path, {"cmd": "get_memory"})
    except OSError:
        return False
    return True
