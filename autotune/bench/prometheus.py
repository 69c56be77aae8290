"""Read an engine's ``/metrics`` into a flat ``{series key: value}`` dict, and difference two reads.

A series key is the sample name followed by its labels, sorted by label name, in the exposition
format's own spelling: ``vllm:num_preemptions_total{engine="0",model_name="tiny"}``; a sample
without labels is just its name. Counters keep their ``_total`` sample names, histograms their
``_bucket``/``_sum``/``_count`` samples, and info-style gauges such as ``vllm:cache_config_info``
keep every label in the key, so their labels can be read back with :func:`split_key`.
``_created`` timestamps of counters and histograms are dropped: they are not measurements and
would only pollute differences.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

from autotune.errors import BenchmarkError

__all__ = ["delta", "parse", "scrape", "scrape_async", "select", "series_key", "split_key"]

_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_TIMESTAMPED = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _unescape(value: str) -> str:
    return re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], value)


def series_key(name: str, labels: Mapping[str, str]) -> str:
    """The flat key of one sample: ``name{a="1",b="2"}`` (labels sorted), or ``name``."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def split_key(key: str) -> tuple[str, dict[str, str]]:
    """Inverse of :func:`series_key`: ``(name, labels)``.

    Example:
        ``split_key('vllm:cache_config_info{block_size="128"}')`` gives
        ``("vllm:cache_config_info", {"block_size": "128"})``.
    """
    name, brace, rest = key.partition("{")
    if not brace:
        return key, {}
    return name, {k: _unescape(v) for k, v in _LABEL.findall(rest)}


def parse(text: str) -> dict[str, float]:
    """Flatten a Prometheus text exposition into ``{series key: value}``."""
    families = list(text_string_to_metric_families(text))
    created = {f"{f.name}_created" for f in families if f.type in _TIMESTAMPED}
    samples: dict[str, float] = {}
    for family in families:
        for s in family.samples:
            if s.name in created or family.name in created:
                continue
            samples[series_key(s.name, s.labels)] = float(s.value)
    return samples


def _check(resp: httpx.Response, url: str) -> str:
    if resp.status_code != 200:
        raise BenchmarkError(f"{url} answered {resp.status_code}; is the engine's metrics endpoint enabled?")
    return resp.text


def _parse_or_fail(text: str, url: str) -> dict[str, float]:
    try:
        return parse(text)
    except ValueError as err:
        raise BenchmarkError(f"{url} is not Prometheus text: {err}") from None


def scrape(base_url: str, client: httpx.Client | None = None, timeout: float = 10.0) -> dict[str, float]:
    """GET ``<base_url>/metrics`` and flatten it (see :func:`parse`).

    Args:
        base_url: Server root, e.g. ``http://127.0.0.1:8000``.
        client: A sync client to reuse; by default a short-lived one is made.
        timeout: Seconds for the request.

    Raises:
        BenchmarkError: Unreachable, non-200, or not Prometheus text.
    """
    url = base_url.rstrip("/") + "/metrics"
    try:
        if client is None:
            with httpx.Client(timeout=timeout) as own:
                resp = own.get(url)
        else:
            resp = client.get(url, timeout=timeout)
    except httpx.HTTPError as err:
        raise BenchmarkError(f"cannot scrape {url}: {type(err).__name__}: {err}") from None
    return _parse_or_fail(_check(resp, url), url)


async def scrape_async(
    base_url: str, client: httpx.AsyncClient | None = None, timeout: float = 10.0
) -> dict[str, float]:
    """Async :func:`scrape`, for use inside a running benchmark's event loop."""
    url = base_url.rstrip("/") + "/metrics"
    try:
        if client is None:
            async with httpx.AsyncClient(timeout=timeout) as own:
                resp = await own.get(url)
        else:
            resp = await client.get(url, timeout=timeout)
    except httpx.HTTPError as err:
        raise BenchmarkError(f"cannot scrape {url}: {type(err).__name__}: {err}") from None
    return _parse_or_fail(_check(resp, url), url)


def _matches(key: str, name: str, labels: Mapping[str, str] | None) -> bool:
    sample, sample_labels = split_key(key)
    if sample not in (name, f"{name}_total"):
        return False
    return not labels or all(sample_labels.get(k) == v for k, v in labels.items())


def select(samples: Mapping[str, float], name: str, labels: Mapping[str, str] | None = None) -> dict[str, float]:
    """The series of metric ``name`` (``name`` or ``name_total``) whose labels include ``labels``."""
    return {k: v for k, v in samples.items() if _matches(k, name, labels)}


def delta(
    before: Mapping[str, float],
    after: Mapping[str, float],
    prefix: str,
    labels: Mapping[str, str] | None = None,
) -> float:
    """Increase of a counter between two scrapes, summed over its label sets.

    Args:
        before: Earlier :func:`scrape`.
        after: Later :func:`scrape`.
        prefix: Metric name, with or without ``_total`` (``vllm:num_preemptions``).
        labels: Only series whose labels include these.

    Returns:
        The summed increase; 0.0 when the metric is absent. A series that went down was reset
        (the engine restarted), so its increase is its new value, as Prometheus' ``increase``.
    """
    total = 0.0
    for key, end in select(after, prefix, labels).items():
        start = before.get(key, 0.0)
        total += end - start if end >= start else end
    return total
