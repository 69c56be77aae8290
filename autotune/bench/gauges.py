"""Sample an engine's ``/metrics`` gauges while a benchmark runs.

A gauge read before and after a run shows the drained engine: the KV pool's fullness and the
queue at their peak happen in between. The sampler reads the chosen gauges every
``interval_s`` in a background thread and keeps, per fact, the peak and the mean over samples.
A fact may name several gauges (a hybrid model's full, SWA and mamba pools): each sample takes
the largest, since the tightest pool is the one that runs out. A failed read is counted, never
raised: the benchmark's own result decides the trial.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

from autotune.bench.prometheus import parse, split_key

__all__ = ["GaugeSampler"]


class GaugeSampler:
    """``with GaugeSampler(url, {"token_usage": ("sglang:token_usage",)}) as s: ...; s.summary()``"""

    def __init__(self, base_url: str, gauges: Mapping[str, Sequence[str]], interval_s: float = 1.0):
        self.url = base_url.rstrip("/") + "/metrics"
        self.gauges = {fact: tuple(names) for fact, names in gauges.items()}
        self.interval_s = interval_s
        self.values: dict[str, list[float]] = {fact: [] for fact in self.gauges}
        self.failed_reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gauge-sampler", daemon=True)

    def __enter__(self) -> GaugeSampler:
        if self.gauges:
            self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while not self._stop.wait(self.interval_s):
                try:
                    resp = client.get(self.url)
                    samples = parse(resp.text) if resp.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    samples = None
                if samples is None:
                    self.failed_reads += 1
                    continue
                self._record(samples)

    def _record(self, samples: Mapping[str, float]) -> None:
        by_name: dict[str, float] = {}
        for key, value in samples.items():
            name = split_key(key)[0]
            by_name[name] = max(value, by_name.get(name, value))  # over TP/DP ranks: the fullest
        for fact, names in self.gauges.items():
            seen = [by_name[n] for n in names if n in by_name]
            if seen:
                self.values[fact].append(max(seen))

    def summary(self) -> dict[str, Any]:
        """``{fact: {"peak", "mean", "samples"}}`` for each fact with at least one sample."""
        out: dict[str, Any] = {}
        for fact, values in self.values.items():
            if values:
                out[fact] = {"peak": max(values), "mean": round(statistics.fmean(values), 4), "samples": len(values)}
        return out
