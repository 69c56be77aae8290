"""Weight-cache daemons as real processes: vLLM 0.34's ``vllm preload`` + ``--load-format
ipc_cache``, SGLang 0.5.23's ``sglang.srt.weight_cache.daemon`` + ``--weight-cache-mode``."""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.sim, pytest.mark.slow]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
V34 = {"AUTOTUNE_SIM_VLLM_VERSION": "0.34.0"}
DISK_LOAD_S = 7.44  # 1 s + 16.1 GB of Llama-3.1-8B weights at 2.5 GB/s
WEIGHTS_GIB = 14.99


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def short_dir() -> Iterator[str]:
    """A socket directory short enough for AF_UNIX's 108-byte path limit."""
    path = tempfile.mkdtemp(prefix="wc", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def number(sim: Any, pattern: str, timeout_s: float = 30.0) -> float:
    """The first number a line matching ``pattern`` logs (waiting for it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(sim.lines):
            match = re.search(pattern, line)
            if match:
                return float(match.group(1).replace(",", ""))
        time.sleep(0.05)
    pytest.fail(f"no line matches {pattern!r}: {sim.lines[-8:]}")


def kv_tokens(sim: Any) -> float:
    return number(sim, r"GPU KV cache size: ([\d,]+) tokens")


def load_seconds(sim: Any) -> float:
    return number(sim, r"Model loading took [\d.]+ GiB memory and ([\d.]+) seconds")


# ------------------------------------------------------------------------------- vLLM 0.34
def preload(sims: Any, env: dict[str, str], *flags: str) -> Any:
    daemon = sims.start("vllm", "preload", "--model", MODEL, *flags, env=env)
    daemon.wait_line("===== Weight cache daemon READY")
    return daemon


def ipc_engine(sims: Any, env: dict[str, str], socket_dir: str, *flags: str, **extra: Any) -> Any:
    loader = {"socket_dir": socket_dir, **extra}
    return sims.start(
        "vllm",
        "--model",
        MODEL,
        "--load-format",
        "ipc_cache",
        "--model-loader-extra-config",
        json_text(loader),
        *flags,
        env=env,
    )


def json_text(value: dict[str, Any]) -> str:
    import json

    return json.dumps(value)


def vllm_env(tmp_path: Any) -> dict[str, str]:
    return {**V34, "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}


def test_preload_binds_its_socket_serves_health_and_removes_the_socket_on_sigterm(
    sims: Any, short_dir: str, tmp_path: Any
) -> None:
    health = free_port()
    daemon = sims.start(
        "vllm",
        "preload",
        "--model",
        MODEL,
        "--weight-cache-socket-dir",
        short_dir,
        "--weight-cache-health-port",
        str(health),
        "--weight-cache-health-host",
        "127.0.0.1",
        env=vllm_env(tmp_path),
    )
    ready = daemon.wait_line("Weight cache daemon READY")
    assert ready.endswith(
        f"===== Weight cache daemon READY: node 0/1 serving 1 local rank(s) x 1 role(s) in {short_dir} ====="
    )
    assert "Weight cache target daemon rank 0 loaded model (14.99 GiB allocated" in daemon.text()
    sockets = glob.glob(os.path.join(short_dir, "vllm_weight_cache_*.sock"))
    assert len(sockets) == 1
    assert f"Weight cache target daemon rank 0 serving on {sockets[0]}" in daemon.text()
    assert httpx.get(f"http://127.0.0.1:{health}/health", trust_env=False).status_code == 200
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.wait_exit(30) == 128 + signal.SIGTERM
    assert not glob.glob(os.path.join(short_dir, "*.sock"))


def test_a_second_preload_cannot_take_over_a_live_daemons_socket(sims: Any, short_dir: str, tmp_path: Any) -> None:
    env = vllm_env(tmp_path)
    first = preload(sims, env, "--weight-cache-socket-dir", short_dir)
    second = sims.start("vllm", "preload", "--model", MODEL, "--weight-cache-socket-dir", short_dir, env=env)
    assert second.wait_exit(30) == 1
    assert "WeightCacheUnavailableError: Another weight cache daemon already owns" in second.text()
    assert first.proc.poll() is None
    assert len(glob.glob(os.path.join(short_dir, "*.sock"))) == 1
    assert ipc_engine(sims, env, short_dir).wait_line("Mapped 291 tensors")


def test_zero_copy_maps_in_about_a_second_and_sizes_the_same_kv_cache_as_a_cold_start(
    sims: Any, short_dir: str, tmp_path: Any
) -> None:
    env = vllm_env(tmp_path)
    cold = sims.start("vllm", "--model", MODEL, env=env)
    preload(sims, env, "--weight-cache-socket-dir", short_dir)
    warm = ipc_engine(sims, env, short_dir)
    assert load_seconds(cold) == pytest.approx(DISK_LOAD_S, abs=0.01)
    assert load_seconds(warm) == pytest.approx(1.0)
    assert "Mapped 291 tensors from the weight cache daemon (zero_copy mode)" in warm.text()
    assert "14.99 GiB is externally held" in warm.wait_line("Weights are held outside this process")
    assert kv_tokens(warm) == kv_tokens(cold)


def test_a_zero_copy_engine_keeps_serving_when_its_daemon_exits(sims: Any, short_dir: str, tmp_path: Any) -> None:
    env = vllm_env(tmp_path)
    daemon = preload(sims, env, "--weight-cache-socket-dir", short_dir)
    engine = ipc_engine(sims, env, short_dir)
    engine.wait_ready()
    daemon.proc.send_signal(signal.SIGTERM)
    daemon.wait_exit(30)
    warning = engine.wait_line("exited. This engine keeps serving")
    assert "WARNING" in warning and "[ipc_loader.py:590]" in warning
    assert httpx.get(engine.url + "/health", trust_env=False).status_code == 200


def test_zero_copy_budget_excludes_the_daemons_weights_so_a_high_fraction_still_starts(
    sims: Any, short_dir: str, tmp_path: Any
) -> None:
    env = vllm_env(tmp_path)
    fixed = ("--disable-extensible-kv-cache", "--gpu-memory-utilization", "0.95")
    cold = sims.start("vllm", "--model", MODEL, *fixed, env=env)
    preload(sims, env, "--weight-cache-socket-dir", short_dir)
    warm = ipc_engine(sims, env, short_dir, *fixed)
    assert kv_tokens(warm) == kv_tokens(cold)
    free = number(warm, r"Free memory on device \(([\d.]+)/")
    assert free == pytest.approx(number(cold, r"Free memory on device \(([\d.]+)/") - WEIGHTS_GIB, abs=0.02)


def test_copy_mode_starts_with_less_free_memory_and_releases_the_daemons_copy(
    sims: Any, short_dir: str, tmp_path: Any
) -> None:
    env = vllm_env(tmp_path)
    fixed = ("--disable-extensible-kv-cache", "--gpu-memory-utilization", "0.7")
    cold = sims.start("vllm", "--model", MODEL, *fixed, env=env)
    daemon = preload(sims, env, "--weight-cache-socket-dir", short_dir)
    copy = ipc_engine(sims, env, short_dir, *fixed, mode="copy")
    assert "Mapped 291 tensors from the weight cache daemon (copy mode)" in copy.wait_line("Mapped")
    cold_free = number(cold, r"Free memory on device \(([\d.]+)/")
    assert number(copy, r"Free memory on device \(([\d.]+)/") == pytest.approx(cold_free - WEIGHTS_GIB, abs=0.02)
    # The profile measures device-wide free memory: the daemon's release offsets the clone, so
    # vLLM's KV budget grows by the weights while the memory physically left shrinks by them.
    cold_kv = number(cold, r"Available KV cache memory: ([\d.]+) GiB")
    assert number(copy, r"Available KV cache memory: ([\d.]+) GiB") == pytest.approx(cold_kv + WEIGHTS_GIB, abs=0.05)
    daemon.wait_line("Weight cache target daemon rank 0 released cached weights")
    after = ipc_engine(sims, env, short_dir, *fixed)
    assert "Weight cache daemon error: Weights were released); falling back to disk loading" in after.wait_line(
        "Weight cache unusable"
    )


def test_copy_mode_is_refused_where_the_daemons_weights_leave_too_little_free_memory(
    sims: Any, short_dir: str, tmp_path: Any
) -> None:
    env = vllm_env(tmp_path)
    preload(sims, env, "--weight-cache-socket-dir", short_dir)
    fixed = ("--disable-extensible-kv-cache", "--gpu-memory-utilization", "0.95")
    zero_copy = ipc_engine(sims, env, short_dir, *fixed)
    zero_copy.wait_line("GPU KV cache size:")
    copy = ipc_engine(sims, env, short_dir, *fixed, mode="copy")
    assert copy.wait_exit(30) == 1
    assert (
        "ValueError: Free memory on device cuda:0 (63.70/79.19 GiB) on startup is less than desired GPU memory "
        "utilization (0.95, 75.23 GiB)" in copy.text()
    )


def test_key_mismatch_warns_and_loads_from_disk_or_fails_without_fallback(
    sims: Any, short_dir: str, tmp_path: Any
) -> None:
    env = vllm_env(tmp_path)
    daemon = preload(sims, env, "--weight-cache-socket-dir", short_dir)
    fallback = ipc_engine(sims, env, short_dir, "--kv-cache-dtype", "fp8")
    warning = fallback.wait_line("Weight cache unusable")
    assert "WARNING" in warning
    assert "(WeightCacheKey mismatch on fields: ['kv_cache_dtype']); falling back to disk loading" in warning
    assert load_seconds(fallback) == pytest.approx(DISK_LOAD_S, abs=0.01)
    assert "WeightCacheKey mismatch on fields: ['kv_cache_dtype']" in daemon.wait_line("WeightCacheKey mismatch")
    strict = ipc_engine(sims, env, short_dir, "--kv-cache-dtype", "fp8", fallback=False)
    assert strict.wait_exit(30) == 1
    assert (
        "vllm.model_executor.model_loader.weight_cache.protocol.CacheConfigMismatchError: WeightCacheKey mismatch "
        "on fields: ['kv_cache_dtype']" in strict.text()
    )
    assert "EngineCore failed to start." in strict.text()


def test_no_daemon_loads_from_disk_or_fails_after_the_state_timeout(sims: Any, short_dir: str, tmp_path: Any) -> None:
    env = vllm_env(tmp_path)
    fallback = ipc_engine(sims, env, short_dir)
    assert "falling back to disk loading" in fallback.wait_line("Weight cache unusable")
    assert load_seconds(fallback) == pytest.approx(DISK_LOAD_S, abs=0.01)
    strict = ipc_engine(sims, env, short_dir, fallback=False, state_timeout_s=3)
    assert strict.wait_exit(30) == 1
    assert "WeightCacheUnavailableError: Weight cache daemon did not become ready within 3.0s" in strict.text()


def test_the_disk_read_follows_the_configured_weight_read_rate(sims: Any, tmp_path: Any) -> None:
    """``AUTOTUNE_SIM_LOAD_GBPS`` stands for the box's storage: a quarter of the rate, 4× the read."""
    slow = sims.start("vllm", "--model", MODEL, env={**vllm_env(tmp_path), "AUTOTUNE_SIM_LOAD_GBPS": "0.625"})
    assert load_seconds(slow) == pytest.approx(1.0 + 4 * (DISK_LOAD_S - 1.0), abs=0.05)


def test_releases_before_0_34_reject_ipc_cache_and_preload(sims: Any, short_dir: str, tmp_path: Any) -> None:
    env = {**vllm_env(tmp_path), "AUTOTUNE_SIM_VLLM_VERSION": "0.33.0"}
    engine = ipc_engine(sims, env, short_dir)
    assert engine.wait_exit(30) == 1
    assert "ValueError: Load format `ipc_cache` is not supported" in engine.text()
    daemon = sims.start("vllm", "preload", "--model", MODEL, env=env)
    assert daemon.wait_exit(30) == 2
    assert "invalid choice: 'preload'" in daemon.text()


# ---------------------------------------------------------------------------- SGLang 0.5.23
def sglang_env(directory: str) -> dict[str, str]:
    return {
        "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE": os.path.join(directory, "{device_uuid}.sock"),
        "SGLANG_WEIGHT_CACHE_READY_TEMPLATE": os.path.join(directory, "{device_uuid}.ready"),
    }


def sglang_tokens(sim: Any) -> float:
    return number(sim, r"KV Cache is allocated\. dtype: \S+, #tokens: (\d+)")


def test_sglang_daemon_is_ready_with_its_socket_and_client_mode_sizes_a_cold_pool(sims: Any, short_dir: str) -> None:
    env = sglang_env(short_dir)
    daemon = sims.start("sglang-weight-cache", "--model-path", MODEL, env=env)
    daemon.wait_line("All 1 weight cache daemons on node 0 are ready")
    assert "[WeightCacheDaemon gpu=0 tp_rank=0] Model loaded from disk in 7.44s" in daemon.text()
    assert len(glob.glob(os.path.join(short_dir, "*.sock"))) == 1
    assert len(glob.glob(os.path.join(short_dir, "*.ready"))) == 1
    cold = sims.start("sglang", "--model-path", MODEL, env=env)
    client = sims.start("sglang", "--model-path", MODEL, "--weight-cache-mode", "client", env=env)
    client.wait_line("[IpcModelLoader] Loaded model via IPC (mode=client), total=1.00s")
    assert "elapsed=1.00 s" in client.wait_line("Load weight end.")
    assert "elapsed=7.44 s" in cold.wait_line("Load weight end.")
    assert sglang_tokens(client) == sglang_tokens(cold)
    begin = number(client, r"Load weight begin\. avail mem=([\d.]+) GB")
    assert begin == pytest.approx(number(cold, r"Load weight begin\. avail mem=([\d.]+) GB") - WEIGHTS_GIB, abs=0.02)
    daemon.proc.send_signal(signal.SIGINT)
    assert daemon.wait_exit(30) == 0
    assert not glob.glob(os.path.join(short_dir, "*"))


def test_sglang_client_mode_fails_on_a_mismatch_and_falls_back_without_a_daemon(sims: Any, short_dir: str) -> None:
    env = sglang_env(short_dir)
    alone = sims.start("sglang", "--model-path", MODEL, "--weight-cache-mode", "client", env=env)
    alone.wait_line("[IpcModelLoader] Weight cache not available or config mismatch, falling back to disk load")
    assert "elapsed=7.44 s" in alone.wait_line("Load weight end.")
    daemon = sims.start("sglang-weight-cache", "--model-path", MODEL, env=env)
    daemon.wait_line("weight cache daemons on node 0 are ready")
    other = sims.start("sglang", "--model-path", MODEL, "--dtype", "float16", "--weight-cache-mode", "client", env=env)
    assert other.wait_exit(30) == -signal.SIGKILL
    assert "RuntimeError: [IpcModelLoader] Daemon config mismatch!" in other.text()
    assert "Config mismatch: {'dtype': ('torch.bfloat16', 'torch.float16')}" in daemon.wait_line("Config mismatch")


def test_sglang_client_engine_kills_itself_when_its_daemon_dies(sims: Any, short_dir: str) -> None:
    env = sglang_env(short_dir)
    daemon = sims.start("sglang-weight-cache", "--model-path", MODEL, env=env)
    daemon.wait_line("weight cache daemons on node 0 are ready")
    client = sims.ready("sglang", "--model-path", MODEL, "--weight-cache-mode", "client", env=env)
    assert f"Started daemon-liveness watchdog for pid={daemon.proc.pid}" in client.text()
    daemon.proc.send_signal(signal.SIGINT)
    daemon.wait_exit(30)
    assert client.wait_exit(30) == -signal.SIGKILL
    assert "died while this engine holds its weights via CUDA IPC" in client.text()


def test_sglang_daemon_mode_daemon_ends_with_its_engine(sims: Any, short_dir: str) -> None:
    env = sglang_env(short_dir)
    engine = sims.ready("sglang", "--model-path", MODEL, "--weight-cache-mode", "daemon", env=env)
    assert "Launching 1 weight cache daemon(s) on node 0" in engine.text()
    assert "[IpcModelLoader] Loaded model via IPC (mode=daemon)" in engine.text()
    assert glob.glob(os.path.join(short_dir, "*.sock"))
    engine.proc.send_signal(signal.SIGTERM)
    assert engine.wait_exit(30) == 0
    assert not glob.glob(os.path.join(short_dir, "*"))


def test_sglang_releases_before_0_5_23_have_no_weight_cache(sims: Any, short_dir: str) -> None:
    env = {**sglang_env(short_dir), "AUTOTUNE_SIM_SGLANG_VERSION": "0.5.20"}
    engine = sims.start("sglang", "--model-path", MODEL, "--weight-cache-mode", "client", env=env)
    assert engine.wait_exit(30) == 2
    assert "unrecognized arguments: --weight-cache-mode client" in engine.text()
    daemon = sims.start("sglang-weight-cache", "--model-path", MODEL, env=env)
    assert daemon.wait_exit(30) == 1
    assert "No module named 'sglang.srt.weight_cache'" in daemon.text()
