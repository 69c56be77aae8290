"""GaugeSampler: peaks and means of /metrics gauges read during a run, the tightest pool per
sample, and failed reads counted rather than raised."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from autotune.bench.gauges import GaugeSampler

pytestmark = pytest.mark.sim

# Each read serves the next of these (full pool, SWA pool, queue); the last repeats.
READS = [(0.10, 0.30, 0), (0.50, 0.20, 4), (0.40, 0.90, 2)]


@pytest.fixture
def metrics_url() -> Iterator[str]:
    served = itertools.chain(READS, itertools.repeat(READS[-1]))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                full, swa, queue = next(served)
            body = (
                "# TYPE sglang:full_token_usage gauge\n"
                f'sglang:full_token_usage{{tp_rank="0"}} {full}\n'
                f'sglang:full_token_usage{{tp_rank="1"}} {full / 2}\n'
                "# TYPE sglang:swa_token_usage gauge\n"
                f"sglang:swa_token_usage {swa}\n"
                "# TYPE sglang:num_queue_reqs gauge\n"
                f"sglang:num_queue_reqs {queue}\n"
            ).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_peaks_and_means_take_the_tightest_pool_of_each_read(metrics_url: str) -> None:
    gauges = {"token_usage": ("sglang:full_token_usage", "sglang:swa_token_usage"), "queue": ("sglang:num_queue_reqs",)}
    sampler = GaugeSampler(metrics_url, gauges, interval_s=0.01)
    with sampler:
        while len(sampler.values["queue"]) < len(READS):
            threading.Event().wait(0.01)
    first = {k: v[: len(READS)] for k, v in sampler.values.items()}
    assert first["token_usage"] == [0.30, 0.50, 0.90]  # per read: the fuller pool, the busiest rank
    assert first["queue"] == [0, 4, 2]
    summary = sampler.summary()
    assert summary["token_usage"]["peak"] == 0.90 and summary["queue"]["peak"] == 4
    assert summary["token_usage"]["samples"] >= len(READS)


def test_an_engine_without_metrics_gives_no_facts_and_no_error() -> None:
    sampler = GaugeSampler("http://127.0.0.1:1", {"queue": ("sglang:num_queue_reqs",)}, interval_s=0.01)
    with sampler:
        while sampler.failed_reads < 2:
            threading.Event().wait(0.01)
    assert sampler.summary() == {}
