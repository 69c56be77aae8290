"""The weight-cache daemon's socket, shared by both dialects' daemons and engines.

A real daemon keeps the weights in GPU memory and hands engines CUDA IPC handles over a Unix
socket (vLLM 0.34 ``model_executor/model_loader/weight_cache``, SGLang 0.5.23
``srt/weight_cache``). The simulated daemon binds a Unix socket at the same kind of path, so an
engine in another process finds it the way the real one does (the file exists, a connection is
accepted), and answers one JSON object per line:

* ``{"cmd": "get_memory"}`` → ``{"status": "ok", "memory_bytes": N}``
* ``{"cmd": "get_state", "key": {...}}`` → ``ok`` with ``memory_bytes`` and ``tensors``,
  ``{"status": "mismatch", "fields": [...], "daemon_key": {...}}``, or an ``error``
* ``{"cmd": "release"}`` → the daemon drops its weights (vLLM's copy mode asks for it)
* ``{"cmd": "watch"}`` → ``ok``, then the connection stays open until the daemon exits (vLLM's
  zero_copy engines learn so that their daemon is gone)

There is no GPU ledger shared between simulated processes: the bytes a daemon holds are the
weight bytes the simulator's memory model gives for the daemon's own flags (``memory.footprint``),
and an engine counts them against its device from the daemon's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune_sim.presets import ModelPreset

__all__ = [
    "DaemonAbsent",
    "DaemonRefused",
    "DaemonServer",
    "WeightStore",
    "ask",
    "device_uuid",
    "md5_hex",
    "tensor_count",
    "watch",
]

CONNECT_TIMEOUT_S = 5.0


class DaemonAbsent(OSError):
    """No socket file at the path: nobody is serving there."""


class DaemonRefused(OSError):
    """A socket file exists but nothing accepts on it (a daemon died after binding)."""


def device_uuid(rank: int) -> str:
    """The simulated physical GPU behind local rank ``rank`` (real ones come from NVML)."""
    return f"GPU-00000000-autotune-sim-{rank:04d}"


def md5_hex(text: str) -> str:
    """vLLM's ``safe_hash`` (md5, sha256 only under FIPS) as a hex digest."""
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def tensor_count(model: ModelPreset) -> int:
    """Tensors a daemon exports for a dense decoder: nine per layer plus embedding, norm, head."""
    return 9 * model.layers + 3


@dataclass
class WeightStore:
    """What one daemon serves: the key it loaded and the bytes it holds on its GPU."""

    key: dict[str, Any]
    weight_bytes: float
    tensors: int
    released: bool = False
    #: called with (kind, detail) on each served request, for the daemon's own log lines
    on_event: Callable[[str, Any], None] = field(default=lambda kind, detail: None)

    def handle(self, request: Mapping[str, Any]) -> dict[str, Any]:
        cmd = request.get("cmd")
        if cmd == "get_memory":
            return {"status": "ok", "memory_bytes": 0 if self.released else self.weight_bytes}
        if cmd == "get_state":
            return self._state(request.get("key") or {})
        if cmd == "release":
            self.released = True
            self.on_event("release", None)
            return {"status": "ok"}
        return {"status": "error", "message": f"Unknown command {cmd!r}"}

    def _state(self, client_key: Mapping[str, Any]) -> dict[str, Any]:
        mismatched = [name for name, value in self.key.items() if client_key.get(name) != value]
        if mismatched:
            self.on_event("mismatch", (mismatched, client_key))
            return {"status": "mismatch", "fields": mismatched, "daemon_key": self.key}
        if self.released:
            return {"status": "error", "message": "Weights were released"}
        self.on_event("sent", self.tensors)
        return {"status": "ok", "memory_bytes": self.weight_bytes, "tensors": self.tensors, "pid": os.getpid()}


class DaemonServer:
    """A Unix-socket server for one :class:`WeightStore`; it removes its socket when closed."""

    def __init__(self, path: str, store: WeightStore) -> None:
        self.path, self.store = path, store
        self._server: asyncio.AbstractServer | None = None
        self._watchers: list[asyncio.StreamWriter] = []

    async def start(self, *, replace_stale: bool = True) -> None:
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        if replace_stale and os.path.exists(self.path):
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        os.chmod(self.path, 0o600)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, ValueError):
            request = json.loads(await reader.readline() or b"{}")
            watch = request.get("cmd") == "watch"
            reply = {"status": "ok"} if watch else self.store.handle(request)
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
            if watch:  # held open for the daemon's lifetime
                self._watchers.append(writer)
                return
        writer.close()

    def close(self) -> None:
        """Stop serving and remove the socket file (a daemon's clean shutdown)."""
        if self._server is not None:
            self._server.close()
        for watcher in self._watchers:
            watcher.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


async def ask(path: str, request: Mapping[str, Any], timeout_s: float = CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """Send one request to the daemon at ``path`` and return its answer.

    Raises :class:`DaemonAbsent` when there is no socket file, :class:`DaemonRefused` when the
    file is there but not accepting (or is not a socket).
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise DaemonAbsent(2, "No such file or directory", path) from None
    if not stat.S_ISSOCK(mode):
        raise DaemonRefused(111, "Connection refused", path)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), timeout_s)
    except (TimeoutError, ConnectionRefusedError, FileNotFoundError) as exc:
        raise DaemonRefused(111, "Connection refused", path) from exc
    try:
        writer.write(json.dumps(request).encode() + b"\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout_s)
    finally:
        writer.close()
    if not line:
        raise DaemonRefused(104, "Connection reset by peer", path)
    reply: dict[str, Any] = json.loads(line)
    return reply


async def watch(path: str, timeout_s: float = CONNECT_TIMEOUT_S) -> asyncio.StreamReader:
    """Open a watch on the daemon at ``path``: the returned stream ends when the daemon exits."""
    reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), timeout_s)
    writer.write(json.dumps({"cmd": "watch"}).encode() + b"\n")
    await writer.drain()
    if not await asyncio.wait_for(reader.readline(), timeout_s):
        raise DaemonRefused(104, "Connection reset by peer", path)
    return reader
