"""`autotune bench` against the simulator, run as a user runs it: a run most of whose requests
fail is said to have failed (never "SLOs met"), and a SIGTERM ends it with one line."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from simserver import running_simulator

AUTOTUNE = str(Path(sys.executable).parent / "autotune")
pytestmark = [pytest.mark.sim, pytest.mark.timeout(300)]
# Prompts of 250–750 tokens against a 512-token context: the engine answers about half of them
# with HTTP 400 (vLLM's "maximum context length"), and the workload allows no error at all.
OVERLONG = """name: overlong
dataset: {input_len: 500, output_len: 8, range_ratio: 0.5}
num_prompts: 40
warmup_requests: 0
arrival: {concurrency: 4}
slos: {p95_ttft_ms: 60000}
max_error_rate: 0.0
"""
# Long enough to be interrupted mid-run (minutes of requests at the simulator's speed).
LONG = """name: long
dataset: {input_len: 64, output_len: 400}
num_prompts: 3000
warmup_requests: 0
arrival: {concurrency: 2}
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    """A simulated vLLM with a 512-token context on a free port."""
    with running_simulator("--max-model-len", "512", speedup=50) as url:
        yield url


def test_a_run_with_failed_requests_says_so(sim: str, tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text(OVERLONG)
    proc = subprocess.run(
        [AUTOTUNE, "bench", "--url", sim, "--workload", str(tmp_path / "w.yaml")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "Traceback" not in out + proc.stderr
    slo_row = next(line for line in out.splitlines() if "│ SLOs" in line)
    assert "met" not in slo_row.replace("missed", "") and "error rate" in slo_row
    closing = out.strip().splitlines()[-1]
    assert closing.startswith("workload NOT met: "), closing
    assert " failed" in closing and "error rate" in closing and "HTTP 400" in closing


def test_sigterm_during_bench_ends_with_one_line(sim: str, tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text(LONG)
    proc = subprocess.Popen(
        [AUTOTUNE, "bench", "--url", sim, "--workload", str(tmp_path / "w.yaml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Wait until the run is under way: the engine reports requests running.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            metrics = httpx.get(sim + "/metrics", timeout=5).text
            running = [line for line in metrics.splitlines() if line.startswith("vllm:num_requests_running")]
            if any(float(line.rsplit(" ", 1)[1]) > 0 for line in running):
                break
            assert proc.poll() is None
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert "Traceback" not in out + err
    assert [line for line in err.splitlines() if line.strip()] == [
        "interrupted: the benchmark was stopped; no result written"
    ]
