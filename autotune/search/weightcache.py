"""The study's weight-cache daemon: weights loaded once, mapped by every engine that shares them.

On an engine that has one (vLLM ≥ 0.34's ``vllm preload``, SGLang ≥ 0.5.23's standalone
``sglang.srt.weight_cache.daemon``), a trial's start-up is mostly loading
the same weights again. A daemon started by the tuner holds them for the whole study: engines
whose cache key (checkpoint, parallelism, dtypes, quantization) matches map them in about a
second instead of reading them from disk. The daemon is supervised like an engine: its own
process group, the same parent-death watchdog, stopped on every path, and its process group is
stored with the study so a resumed study reaps one a killed tuner left behind.

One daemon serves one key: the first trial whose engine can use one starts it, trials with
another key (a TP change in the space) load from disk as before. The engine's version is read
from the first trial's log, never assumed, so the study's first trial always loads cold.
"""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path
from typing import Any, Literal

import optuna

from autotune.engines.base import EngineAdapter, WeightDaemon
from autotune.errors import AutotuneError
from autotune.runtime.ports import free_port
from autotune.runtime.process import EngineProcess
from autotune.search.progress import Progress
from autotune.search.record import set_weight_daemon

__all__ = ["WeightCache", "WeightCacheMode"]

WeightCacheMode = Literal["off", "auto", "on"]


class WeightCache:
    """Starts the study's daemon on first use and says which flags a trial's engine adds.

    Args:
        mode: ``off`` never starts one; ``auto`` where the engine version has one and trials
            run one at a time; ``on`` the same, and says so when it cannot.
        why_not: Why the study's shape rules a daemon out (several slots at once), or None.
    """

    def __init__(
        self,
        mode: WeightCacheMode,
        adapter: EngineAdapter,
        study: optuna.Study,
        study_dir: Path,
        progress: Progress,
        *,
        why_not: str | None = None,
    ):
        self.mode, self.adapter, self.study, self.progress = mode, adapter, study, progress
        self.log_path = study_dir / "weight-cache" / "daemon.log"
        self._why_not = why_not
        self._said: set[str] = set()
        self._daemon: WeightDaemon | None = None
        self._proc: EngineProcess | None = None
        self._socket_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.alive

    def client(self, flags: dict[str, Any], version: str | None) -> tuple[dict[str, Any], dict[str, str]]:
        """The flags and environment that map this trial's weights from the daemon (started
        here on first use), or two empty ones when the trial loads them itself."""
        if self.mode == "off" or (version is None and self._why_not is None):
            return {}, {}  # the version is read from the first trial: that one loads its weights itself
        why_not = self._why_not or self.adapter.weight_cache_unsupported(version)
        if why_not:
            self._say(f"weight cache {self.mode}: off — {why_not}")
            return {}, {}
        if conflict := self.adapter.weight_cache_conflict(flags):
            self._say(f"trials that load their weights themselves: {conflict}")
            return {}, {}
        if self._daemon is None:
            self._start(flags)
            return self.client(flags, version)
        if not self.running:
            self._say(f"weight-cache daemon gone ({self._exit_text()}); trials load their weights from disk")
            return {}, {}
        if self._key(flags) != self._daemon.key:
            self._say("trials whose parallelism, dtype or quantization differ from the daemon's load from disk")
            return {}, {}
        return dict(self._daemon.client_flags), dict(self._daemon.client_env)

    def close(self) -> None:
        """Stop the daemon (its memory stays held until it is gone) and forget its group."""
        proc, self._proc = self._proc, None
        try:
            if proc is not None:
                proc.stop()
                set_weight_daemon(self.study, None)
        finally:
            if self._socket_dir is not None:
                self._socket_dir.cleanup()
                self._socket_dir = None

    def __enter__(self) -> WeightCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------ internals
    def _key(self, flags: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        return self.adapter.weight_daemon(flags, Path("."), 0).key

    def _start(self, flags: dict[str, Any]) -> None:
        # Unix socket paths are short (108 bytes): a fresh private folder under the temp dir.
        self._socket_dir = tempfile.TemporaryDirectory(prefix="autotune-wc-")
        socket_dir = Path(self._socket_dir.name)
        socket_dir.chmod(0o700)  # vLLM refuses a socket folder others can write to
        daemon = self.adapter.weight_daemon(flags, socket_dir, free_port(self.adapter.settings.host))
        self._daemon = daemon
        self.progress.phase("starting the weight-cache daemon")
        proc = EngineProcess(
            daemon.argv,
            daemon.env,
            self.log_path,
            ready_url=daemon.ready_url,
            ready_check=daemon.ready_check,
            startup_timeout_s=self.adapter.settings.startup_timeout_s,
        )
        proc.start()
        self._proc = proc
        if proc.pgid is not None:
            set_weight_daemon(self.study, {"pgid": proc.pgid, "host": socket.gethostname(), "argv": daemon.argv})
        try:
            seconds = proc.wait_ready()
        except AutotuneError as err:
            self._proc = None
            proc.stop()
            set_weight_daemon(self.study, None)
            self._why_not = f"its daemon failed to start ({err})"
            return
        self._say(
            f"weight-cache daemon ready in {seconds:.0f}s ({daemon.mode}; log {self.log_path}): "
            "engines with the same weights map them instead of loading"
        )

    def _exit_text(self) -> str:
        code = self._proc.returncode if self._proc is not None else None
        return f"exit {code}" if code is not None else "stopped"

    def _say(self, text: str) -> None:
        if text not in self._said:
            self._said.add(text)
            self.progress.message(text)
