"""Prometheus text exposition (format 0.0.4), written the way ``prometheus_client`` writes it.

Counters get ``_total`` and ``_created`` samples, histograms cumulative ``_bucket`` samples with
an ``le`` label plus ``_count``, ``_sum`` and ``_created``. No registry: the dialects render
their metric families from :class:`~autotune_sim.stats.EngineStats` on every scrape.
"""

from __future__ import annotations

from collections.abc import Mapping

from autotune_sim.stats import Histogram

__all__ = ["CONTENT_TYPE", "Exposition", "go_float"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def go_float(value: float) -> str:
    """A float as prometheus_client prints it (``3.0``, ``1.7e+09``, ``+Inf``)."""
    value = float(value)
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    if value != value:
        return "NaN"
    s = repr(value)
    dot = s.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class Exposition:
    """Collects metric families for one scrape.

    Args:
        labels: Labels every sample carries (in this order).
        created: Unix time the counters were created.
    """

    def __init__(self, labels: Mapping[str, str], created: float) -> None:
        self._labels = dict(labels)
        self._created = go_float(created)
        self._lines: list[str] = []

    def _head(self, name: str, help_text: str, kind: str) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")

    def gauge(self, name: str, help_text: str, value: float, extra: Mapping[str, str] | None = None) -> None:
        self._head(name, help_text, "gauge")
        self._lines.append(f"{name}{_labels({**self._labels, **(extra or {})})} {go_float(value)}")

    def gauges(self, name: str, help_text: str, samples: Mapping[str, float], label: str) -> None:
        """One gauge family with one sample per value of ``label``."""
        self._head(name, help_text, "gauge")
        for key, value in samples.items():
            self._lines.append(f"{name}{_labels({**self._labels, label: key})} {go_float(value)}")

    def counter(self, name: str, help_text: str, value: float) -> None:
        self.counters(name, help_text, {"": value}, "")

    def counters(self, name: str, help_text: str, samples: Mapping[str, float], label: str) -> None:
        """One counter family; with ``label`` set, one series per key of ``samples``."""
        self._head(name, help_text, "counter")
        for key, value in samples.items():
            labels = _labels({**self._labels, label: key} if label else self._labels)
            self._lines.append(f"{name}_total{labels} {go_float(value)}")
        for key in samples:
            labels = _labels({**self._labels, label: key} if label else self._labels)
            self._lines.append(f"{name}_created{labels} {self._created}")

    def histogram(self, name: str, help_text: str, hist: Histogram) -> None:
        self._head(name, help_text, "histogram")
        base = self._labels
        for le, count in hist.cumulative():
            self._lines.append(f"{name}_bucket{_labels({**base, 'le': le})} {go_float(count)}")
        self._lines.append(f"{name}_count{_labels(base)} {go_float(hist.count)}")
        self._lines.append(f"{name}_sum{_labels(base)} {go_float(hist.sum)}")
        self._lines.append(f"{name}_created{_labels(base)} {self._created}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"
