"""Flattening /metrics and differencing counters."""

from __future__ import annotations

import httpx
import pytest

from autotune.bench import prometheus as prom
from autotune.errors import BenchmarkError

VLLM_METRICS = """\
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 3.0
vllm:num_preemptions_created{engine="0",model_name="tiny"} 1.7e+09
vllm:num_preemptions_total{engine="1",model_name="tiny"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{num_gpu_blocks="16384",block_size="128",enable_prefix_caching="True"} 1.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="tiny"} 1.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="tiny"} 2.0
vllm:e2e_request_latency_seconds_count{model_name="tiny"} 2.0
vllm:e2e_request_latency_seconds_sum{model_name="tiny"} 0.5
vllm:e2e_request_latency_seconds_created{model_name="tiny"} 1.7e+09
# TYPE process_open_fds gauge
process_open_fds 42.0
"""


def test_parse_flattens_with_sorted_labels_and_sample_names() -> None:
    s = prom.parse(VLLM_METRICS)
    assert s['vllm:num_preemptions_total{engine="0",model_name="tiny"}'] == 3.0
    assert s['vllm:kv_cache_usage_perc{engine="0",model_name="tiny"}'] == 0.25
    key = 'vllm:cache_config_info{block_size="128",enable_prefix_caching="True",num_gpu_blocks="16384"}'
    assert s[key] == 1.0
    assert s['vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="tiny"}'] == 2.0
    assert s['vllm:e2e_request_latency_seconds_count{model_name="tiny"}'] == 2.0
    assert s['vllm:e2e_request_latency_seconds_sum{model_name="tiny"}'] == 0.5
    assert s["process_open_fds"] == 42.0
    assert not any("_created" in k for k in s)


def test_split_key_round_trips_including_escapes() -> None:
    labels = {"b": 'say "hi"', "a": "back\\slash", "c": "two\nlines"}
    key = prom.series_key("m:x", labels)
    assert key.startswith('m:x{a="back\\\\slash",b="say \\"hi\\""')
    assert prom.split_key(key) == ("m:x", labels)
    assert prom.split_key("process_open_fds") == ("process_open_fds", {})


def test_info_gauge_labels_are_readable() -> None:
    s = prom.parse(VLLM_METRICS)
    [(key, _)] = prom.select(s, "vllm:cache_config_info").items()
    assert prom.split_key(key)[1]["num_gpu_blocks"] == "16384"


def test_delta_sums_over_label_sets_and_accepts_either_name() -> None:
    before = prom.parse(VLLM_METRICS)
    after = dict(before)
    after['vllm:num_preemptions_total{engine="0",model_name="tiny"}'] = 10.0
    after['vllm:num_preemptions_total{engine="1",model_name="tiny"}'] = 4.0
    after['vllm:num_preemptions_total{engine="2",model_name="tiny"}'] = 1.0  # new series
    assert prom.delta(before, after, "vllm:num_preemptions") == 7 + 2 + 1
    assert prom.delta(before, after, "vllm:num_preemptions_total") == 10
    assert prom.delta(before, after, "vllm:num_preemptions", {"engine": "1"}) == 2
    assert prom.delta(before, after, "vllm:absent") == 0.0


def test_delta_treats_a_decrease_as_a_counter_reset() -> None:
    before = {"c_total": 50.0}
    assert prom.delta(before, {"c_total": 5.0}, "c") == 5.0


@pytest.mark.sim
def test_scrape_uses_the_metrics_route_and_errors_are_one_line() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        return httpx.Response(200, text=VLLM_METRICS)

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        assert prom.scrape("http://e:8000/", client=client)["process_open_fds"] == 42.0

    missing = httpx.MockTransport(lambda r: httpx.Response(404))
    with (
        httpx.Client(transport=missing) as client,
        pytest.raises(BenchmarkError, match=r"http://e:8000/metrics answered 404"),
    ):
        prom.scrape("http://e:8000", client=client)

    with pytest.raises(BenchmarkError, match=r"^cannot scrape http://127\.0\.0\.1:9/metrics: ConnectError"):
        prom.scrape("http://127.0.0.1:9", timeout=2)
