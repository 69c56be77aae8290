"""What every simulated engine process shares: its clock, log writer, socket, routes and exit.

A dialect module (``vllm.py``, ``sglang.py``) tells the story of one engine — its flags, its
start-up lines in order, its failure paths, its endpoints and metric names — using these parts.

Contract of a dialect: :meth:`Dialect.main` parses argv exactly as the real engine would (exit 2
on usage errors, ``--help`` in argparse's format), then runs the process to its end and returns
the exit code the real engine would give (``os._exit`` or a self-SIGKILL where the real one dies
that way). Every modelled duration goes through :meth:`Runtime.pause`, which divides it by
``AUTOTUNE_SIM_SPEEDUP``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TextIO

from autotune_sim.clock import ModelClock
from autotune_sim.engine import Engine, EngineObserver
from autotune_sim.http import Handler, Request, Responder, serve
from autotune_sim.kvcache import BlockPool
from autotune_sim.memory import Footprint, footprint
from autotune_sim.perf import PerfModel
from autotune_sim.presets import GpuPreset, ModelPreset
from autotune_sim.scheduler import Scheduler
from autotune_sim.settings import SimSettings
from autotune_sim.stats import EngineStats

__all__ = ["Dialect", "LogWriter", "Router", "Runtime", "expand_config", "human_readable_int", "modelled_banner"]


def modelled_banner(settings: SimSettings) -> str:
    """The line every simulated engine prints: its numbers are a model, not a measurement."""
    return (
        f"autotune simulator: this is not a real engine; every number it reports is modelled by autotune's "
        f"simulator (GPU {settings.gpu.name} x{settings.num_gpus}, speedup {settings.speedup:g}x: wall-clock "
        f"times are modelled times / {settings.speedup:g}), not measured on hardware."
    )


def human_readable_int(value: str) -> int:
    """``32k`` = 32000, ``32K`` = 32768 (also m/M, g/G); plain integers pass through."""
    text = value.strip()
    decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    if text and text[-1] in decimal:
        return int(float(text[:-1]) * decimal[text[-1]])
    if text and text[-1] in binary:
        return int(float(text[:-1]) * binary[text[-1]])
    if text.endswith("i") and len(text) > 1 and text[-2] in binary:  # SGLang's 1Ki
        return int(float(text[:-2]) * binary[text[-2]])
    return int(text)


def expand_config(argv: list[str], *, negate: bool) -> list[str]:
    """``--config f.yaml``: the file's keys become flags placed before the command line's own.

    ``negate``: a false boolean becomes ``--no-<key>`` (vLLM) instead of being left out (SGLang).
    """
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            path, used = arg.split("=", 1)[1], 1
        elif arg == "--config" and i + 1 < len(argv):
            path, used = argv[i + 1], 2
        else:
            continue
        import yaml  # only when a config file is given: keeps start-up fast

        with open(path) as fh:
            data = yaml.safe_load(fh) or {}
        extra: list[str] = []
        for key, value in data.items():
            flag = "--" + str(key).replace("_", "-")
            if value is True:
                extra.append(flag)
            elif value is False:
                extra += ["--no-" + flag[2:]] if negate else []
            elif isinstance(value, list):
                extra += [flag, *map(str, value)]
            elif isinstance(value, dict):
                extra += [flag, json.dumps(value)]
            else:
                extra += [flag, str(value)]
        return extra + argv[:i] + argv[i + used :]
    return argv


class EngineShape(Protocol):
    """What a resolved engine configuration says about the model each rank holds."""

    model: ModelPreset
    tp: int
    pp: int
    dtype: str
    kv_dtype: str
    quantization: str | None


def rank_footprint(c: EngineShape, gpu: GpuPreset) -> Footprint:
    """What one rank of the engine ``c`` describes holds on ``gpu`` (its links decide the
    communication buffers)."""
    return footprint(
        c.model, tp=c.tp, pp=c.pp, dtype=c.dtype, kv_dtype=c.kv_dtype, quantization=c.quantization, p2p=gpu.p2p
    )


class LogWriter:
    """Buffered log output: startup and error lines flush at once, chatty lines periodically."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err

    def write(self, text: str, *, stderr: bool = False, flush: bool = True) -> None:
        stream = self.err if stderr else self.out
        stream.write(text if text.endswith("\n") else text + "\n")
        if flush:
            stream.flush()

    def flush(self) -> None:
        for stream in (self.out, self.err):
            with contextlib.suppress(BrokenPipeError, ValueError):  # a closed pipe must not kill the server
                stream.flush()


class Router:
    """Method + path → handler, with FastAPI's 404/405 bodies."""

    def __init__(self) -> None:
        self._routes: dict[str, dict[str, Handler]] = {}

    def add(self, methods: str | Iterable[str], path: str, handler: Handler) -> None:
        for method in [methods] if isinstance(methods, str) else methods:
            self._routes.setdefault(path, {})[method] = handler

    def paths(self) -> list[tuple[str, list[str]]]:
        return [(p, sorted(m)) for p, m in self._routes.items()]

    def __call__(self, request: Request, resp: Responder) -> None:
        methods = self._routes.get(request.path)
        if methods is None:
            resp.json(404, {"detail": "Not Found"})
        elif request.method not in methods:
            resp.json(405, {"detail": "Method Not Allowed"})
        else:
            methods[request.method](request, resp)


class Runtime:
    """The process-level services a dialect uses while it tells its story."""

    def __init__(self, settings: SimSettings, log: LogWriter) -> None:
        self.settings = settings
        self.log = log
        self.server: asyncio.AbstractServer | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._exit_hooks: list[Callable[[], object]] = []
        self.model_clock: ModelClock | None = None  # one for every engine core of the process

    def at_exit(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` when the process leaves through :meth:`exit` or :meth:`kill_self`
        (e.g. a co-terminal weight-cache daemon removing its socket)."""
        self._exit_hooks.append(callback)

    def _run_exit_hooks(self) -> None:
        hooks, self._exit_hooks = self._exit_hooks, []
        for hook in hooks:
            with contextlib.suppress(Exception):  # leaving must not fail on a cleanup
                hook()

    async def pause(self, modelled_s: float) -> None:
        """Let ``modelled_s`` modelled seconds pass (÷ speed-up on the wall clock)."""
        if modelled_s > 0:
            await asyncio.sleep(modelled_s / self.settings.speedup)

    def later(self, modelled_s: float, callback: Callable[[], object]) -> None:
        """Run ``callback`` after ``modelled_s`` modelled seconds."""
        asyncio.get_running_loop().call_later(modelled_s / self.settings.speedup, callback)

    async def hang(self) -> None:
        """Block forever (a hung engine)."""
        self.log.flush()
        await asyncio.Event().wait()

    @staticmethod
    def bind(host: str | None, port: int) -> socket.socket:
        """Bind (not listen): the port is taken but refuses connections until :meth:`listen`."""
        family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host or "0.0.0.0", port))
        except OSError:
            sock.close()
            raise
        return sock

    async def listen(self, sock: socket.socket, handler: Handler) -> None:
        """Start answering HTTP on the bound socket."""
        self.server = await serve(sock, handler)
        self._flusher = asyncio.create_task(self._flush_forever())

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            self.log.flush()

    def on_signals(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(signum)`` on SIGTERM / SIGINT."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, callback, signum)

    def exit(self, code: int) -> None:
        """Leave now with ``code`` (no interpreter teardown, like a process that is done)."""
        self._run_exit_hooks()
        self.log.flush()
        os._exit(code)

    def kill_self(self) -> None:
        """Die by SIGKILL, as SGLang's launcher does to its own tree after a child failed."""
        self._run_exit_hooks()
        self.log.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def build_engine(
        self,
        scheduler: Scheduler,
        perf: PerfModel,
        stats: EngineStats,
        fp: Footprint,
        headroom: float,
        observer: EngineObserver,
        rank: int = 0,
    ) -> Engine:
        """An engine core on this process's clock, with the settings' noise, seed and faults."""
        s = self.settings
        loop = asyncio.get_running_loop()
        if self.model_clock is None:
            self.model_clock = ModelClock(s.speedup, loop.time)
        return Engine(
            scheduler,
            perf,
            stats,
            fp=fp,
            headroom=headroom,
            noise=s.noise,
            launch_factor=s.launch_factor,
            seed=s.seed + rank,
            faults=s.faults,
            observer=observer,
            clock=self.model_clock,
        )


def new_pool(blocks: int, block_size: int, caching: bool) -> BlockPool:
    """A KV block pool (at least one block so arithmetic stays defined)."""
    return BlockPool(max(1, blocks), block_size, caching)


def torch_oom(tried: float, free: float, total_gib: float) -> list[str]:
    """torch's CUDA out-of-memory message for an allocation of ``tried`` bytes with ``free`` left."""
    free_mib = max(free, 0.0) / 2**20
    in_use = total_gib - free_mib / 1024
    return [
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {max(tried, 2**21) / 2**30:.2f} GiB. GPU 0 "
        f"has a total capacity of {total_gib:.2f} GiB of which {free_mib:.2f} MiB is free. Including non-PyTorch "
        f"memory, this process has {in_use:.2f} GiB memory in use. Of the allocated memory {in_use * 0.97:.2f} GiB "
        f"is allocated by PyTorch, and {in_use * 0.01:.2f} GiB is reserved by PyTorch but unallocated. If reserved "
        "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    ]


def fmt_commas(n: int) -> str:
    return f"{n:,}"


def ts_vllm() -> str:
    return time.strftime("%m-%d %H:%M:%S")


def ts_sglang(ms: bool) -> str:
    now = time.time()
    base = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    return f"{base}.{int(now % 1 * 1000):03d}" if ms else base


def capture_sizes(max_size: int, steps: Sequence[tuple[int, int, int]]) -> list[int]:
    """Sizes from ``(start, stop, step)`` ranges up to ``max_size``, with ``max_size`` itself."""
    sizes = sorted({s for start, stop, step in steps for s in range(start, stop, step) if s <= max_size})
    if max_size > 0 and (not sizes or sizes[-1] != max_size):
        sizes.append(max_size)
    return sizes


def gib(n: float) -> float:
    return n / float(1 << 30)


class Dialect(ABC):
    """One engine's command line and process story."""

    name: str

    def __init__(self, settings: SimSettings, log: LogWriter | None = None) -> None:
        self.settings = settings
        self.log = log or LogWriter(sys.stdout, sys.stderr)
        self.rt = Runtime(settings, self.log)

    @abstractmethod
    def main(self, argv: list[str]) -> int:
        """Run the engine process for ``argv``; return its exit code."""
