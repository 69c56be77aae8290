"""`status`, `export` and the closing lines on studies built the way the tuner stores them: every
line says what happened (reasons on SLO misses, named Pareto values with units), a study is
found by name or suggested, and the container exports of a CPU-engine study run as written."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial
from typer.testing import CliRunner

from autotune.bench.capacity import CapacityResult, CapacityRun
from autotune.cli import app
from autotune.config import Workload
from autotune.report.bench import bench_verdict, capacity_line
from autotune.report.export import LaunchRecord, render
from autotune.report.status import memory_edge_line, point_text
from autotune.search.record import StageState
from autotune.search.storage import default_storage_url

# A pipe with no width given, where each row stays whole (xdist's workers export COLUMNS=80).
runner = CliRunner(env={"COLUMNS": None})
DATA = Path(__file__).parent / "engines" / "data"
CPU_LOG = DATA / "vllm-0.32.0-cpu-startup.log"
SLOS = {"p95_ttft_ms": 1000.0}
METRICS = {"output_throughput": 4767.4, "p95_ttft_ms": 45.9, "p95_tpot_ms": 20.0, "error_rate": 0.0}


def _study(results: Path, name: str, directions: list[str], objective: dict[str, Any], **engine: Any) -> optuna.Study:
    (results / name).mkdir(parents=True, exist_ok=True)
    st = optuna.create_study(study_name=name, storage=default_storage_url(results, name), directions=directions)
    st.set_user_attr(
        "config",
        {
            "engine": {"kind": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", **engine},
            "workload": {"name": "chat", "slos": SLOS, "objective": objective},
            "study": {"finalists": 0},
        },
    )
    return st


def _add(st: optuna.Study, number: int, values: list[float] | None, **attrs: Any) -> None:
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--host", "127.0.0.1"]
    argv += ["--port", str(40000 + number), "--max-num-seqs", "64"]
    params = attrs.pop("params", {"memory_fraction": 0.88, "batched_tokens": 2048})
    user_attrs = {
        "stage": "search",
        "params": params,
        "flags": {"--max-num-seqs": 64},
        "argv": argv,
        "engine_args": argv[3:],
        "env": {},
        "constraints": {"p95_ttft_ms": -0.5, "error_rate": 0.0},
        "metrics": METRICS,
        **attrs,
    }
    dists = {
        "memory_fraction": FloatDistribution(0.80, 0.96, step=0.02),
        "batched_tokens": CategoricalDistribution([2048, 4096]),
    }
    st.add_trial(
        create_trial(
            state=TrialState.COMPLETE if values is not None else TrialState.FAIL,
            values=values,
            params=params,
            distributions={k: dists[k] for k in params},
            user_attrs=user_attrs,
        )
    )


def _one_line_error(output: str) -> str:
    lines = [x for x in output.strip().splitlines() if x.strip()]
    assert "Traceback" not in output
    assert len(lines) == 1 and lines[0].startswith("error:"), output
    return lines[0]


# --------------------------------------------------------------------------------------- status
def test_status_gives_the_reason_of_an_slo_miss(tmp_path: Path) -> None:
    st = _study(tmp_path, "s", ["maximize"], {"metric": "output_throughput"})
    _add(st, 0, [1000.0], outcome="ok")
    _add(st, 1, [900.0], outcome="slo_violation", violations={"p95_ttft_ms": 0.35}, constraints={"p95_ttft_ms": 0.35})
    result = runner.invoke(app, ["status", "s", "--results", str(tmp_path)])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "slo_violation" in line and "search" in line)
    assert "p95_ttft_ms +35% over its bound" in row
    assert "memory_fraction=0.88" in row and "batched_tokens=2048" in row  # as set, not 0.9 / 2,048.0


def test_status_shows_the_studys_noise_and_where_it_was_measured(tmp_path: Path) -> None:
    st = _study(tmp_path, "s", ["maximize"], {"metric": "output_throughput"})
    _add(st, 0, [1000.0], outcome="ok", stage="baseline", params={}, metrics={**METRICS, "output_throughput": 4000.0})
    result = runner.invoke(app, ["status", "s", "--results", str(tmp_path)])
    assert "run-to-run noise not measured yet (no configuration measured twice yet)" in result.output
    _add(st, 1, [1000.0], outcome="ok", stage="noise", params={}, metrics={**METRICS, "output_throughput": 3800.0})
    result = runner.invoke(app, ["status", "s", "--results", str(tmp_path)])
    assert "run-to-run noise ±5.1% (widest of 1 measured: trials 0, 1: 4,000.0 and 3,800.0)" in result.output


def test_pareto_front_names_its_values_with_units(tmp_path: Path) -> None:
    objective = {"metric": "output_throughput", "also": [{"metric": "p95_ttft_ms", "direction": "minimize"}]}
    st = _study(tmp_path, "mo", ["maximize", "minimize"], objective)
    _add(st, 0, [4767.4, 45.9], outcome="ok")
    result = runner.invoke(app, ["status", "mo", "--results", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "#0: output_throughput 4,767.4 tok/s, p95_ttft_ms 45.9 ms" in result.output
    assert (
        point_text(["request_goodput", "p99_e2el_ms"], [2.5, 900.0])
        == "request_goodput 2.5 req/s, p99_e2el_ms 900.0 ms"
    )


def test_status_without_a_name_reads_the_only_study(tmp_path: Path) -> None:
    st = _study(tmp_path, "demo-vllm-cpu", ["maximize"], {"metric": "output_throughput"})
    _add(st, 0, [1000.0], outcome="ok")
    result = runner.invoke(app, ["status", "--results", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("study demo-vllm-cpu: 1 trials")


def test_a_misspelt_study_is_suggested(tmp_path: Path) -> None:
    _study(tmp_path, "demo-vllm-cpu", ["maximize"], {"metric": "output_throughput"})
    result = runner.invoke(app, ["status", "demo-vllm-cp", "--results", str(tmp_path)])
    assert result.exit_code == 2
    assert "did you mean demo-vllm-cpu?" in _one_line_error(result.output)
    result = runner.invoke(app, ["status", "demo", "--results", str(tmp_path)])
    assert "demo-vllm-cpu" in _one_line_error(result.output)


def test_several_studies_and_no_name_asks_which(tmp_path: Path) -> None:
    _study(tmp_path, "a", ["maximize"], {"metric": "output_throughput"})
    _study(tmp_path, "b", ["maximize"], {"metric": "output_throughput"})
    for command in ("status", "trials", "export", "report"):
        result = runner.invoke(app, [command, "--results", str(tmp_path)])
        assert result.exit_code == 2
        line = _one_line_error(result.output)
        assert "several studies (a, b)" in line, line


def test_status_of_a_study_where_nothing_served_counts_the_launches(tmp_path: Path) -> None:
    st = _study(tmp_path, "s", ["maximize"], {"metric": "output_throughput"})
    for n in range(4):
        _add(st, n, [0.0], outcome="oom_startup", reason="CUDA out of memory", metrics={}, constraints={"x": 1e6})
    result = runner.invoke(app, ["status", "s", "--results", str(tmp_path)])
    assert "best: none — no trial served the workload: 4 launches, all `oom_startup`" in result.output
    assert "met the SLOs" not in result.output


# ------------------------------------------------------------------------------ memory probes
def test_memory_edge_is_claimed_only_below_a_failure() -> None:
    passed = {"results": {"0.82": "ok", "0.84": "ok", "0.86": "ok"}, "edge": 0.86, "note": "n"}
    assert memory_edge_line(StageState(**passed)).startswith("memory edge: not reached — every probe up to 0.86 passed")
    found = {"results": {"0.86": "ok", "0.88": "ok", "0.9": "too_high"}, "edge": 0.86, "note": "n"}
    line = memory_edge_line(StageState(**found))
    assert line.startswith("memory edge: 0.86 (highest passing fraction 0.88, less one safety step; 0.9 failed")
    cpu = {**passed, "ceiling": 0.86, "kv_cache_memory_bytes": 2297807503}  # the host's RAM capped the probes
    assert memory_edge_line(StageState(**cpu)).startswith(
        "memory edge: 0.86, KV pool kv_cache_memory_bytes=2297807503 — the most this host can give now"
    )
    none = memory_edge_line(StageState(results={}), {"client_limited": 3})
    assert none == "memory edge: not found — no probe gave a memory verdict (3 launches, all `client_limited`)"


# ------------------------------------------------------------------------------------- bench
def test_failed_requests_never_read_as_slos_met() -> None:
    workload = Workload.model_validate({"slos": {"p95_ttft_ms": 1000}, "max_error_rate": 0.0})
    metrics = {"completed": 168, "failed": 232, "error_rate": 0.58, "p95_ttft_ms": 120.0}
    row, closing = bench_verdict(metrics, workload, {"HTTP 400: This model's maximum context length": 232})
    assert row.startswith("missed: error rate 58.0% > max_error_rate 0.0%")
    assert closing.startswith("workload NOT met: 168 of 400 requests succeeded, 232 failed")
    assert "HTTP 400" in closing
    clean = bench_verdict({"completed": 10, "failed": 0, "error_rate": 0.0, "p95_ttft_ms": 1.0}, workload, {})
    assert clean[0] == "met" and clean[1].startswith("workload met: 10 of 10 requests succeeded")


def _capacity(stop: str, value: float, upper: float | None, runs: int = 4) -> CapacityResult:
    run = CapacityRun(level=value, passed=True, violations={}, metrics={}, client_limited=False)
    return CapacityResult("request_rate", value, False, upper, [run] * runs, stop)


def test_capacity_says_when_its_answer_is_a_lower_bound() -> None:
    line = capacity_line(_capacity("max_runs", 640.0, None, runs=10))
    assert line.startswith("highest load meeting the SLOs: 640.00 req/s (max_runs) — a lower bound")
    assert "10-run limit (capacity.max_runs)" in line
    high = capacity_line(_capacity("at_high", 10000.0, None))
    assert high.startswith("highest load meeting the SLOs: 10,000.00 req/s (at_high) — a lower bound")
    assert capacity_line(_capacity("converged", 12.5, 13.5)) == (
        "highest load meeting the SLOs: 12.50 req/s (converged); 13.50 req/s failed"
    )


# ----------------------------------------------------------------------------------- exports
ENGINE_ARGS = ["--model", "/models/tiny", "--host", "127.0.0.1", "--port", "41234", "--max-num-seqs", "64"]


def _cpu_record(model_dir: Path) -> LaunchRecord:
    args = [a.replace("/models/tiny", str(model_dir)) for a in ENGINE_ARGS]
    return LaunchRecord(
        study="cpu",
        trial=1,
        argv=["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", *args],
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": "${HF_TOKEN}"},
        flags={"--max-num-seqs": 64},
        engine="vllm",
        engine_version="0.32.0+cpu",
        engine_args=args,
        device="cpu",
        model=str(model_dir),
    )


@pytest.mark.sim
def test_docker_export_of_a_cpu_study_uses_the_cpu_image_and_mounts_the_model(tmp_path: Path) -> None:
    model_dir = tmp_path / "tiny-llama"
    model_dir.mkdir()
    _, text = render(_cpu_record(model_dir), "docker")
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    words = shlex.split(text.split("exec ", 1)[1].replace("\\\n", " "))
    assert "--gpus" not in words
    image = next(w for w in words if "vllm-cpu-release-repo" in w)
    assert image.endswith(":v0.32.0")  # no "+cpu": that is no image tag
    assert f"{model_dir}:{model_dir}:ro" in words
    args = words[words.index(image) + 1 :]
    assert args[args.index("--model") + 1] == str(model_dir)
    assert "HF_TOKEN=${HF_TOKEN}" not in text  # a secret is passed through, never written
    assert "CPU" in text.split("exec ", 1)[0]


def test_k8s_export_of_a_cpu_study_requests_no_gpu_and_mounts_the_model(tmp_path: Path) -> None:
    model_dir = tmp_path / "tiny-llama"
    model_dir.mkdir()
    doc = yaml.safe_load(render(_cpu_record(model_dir), "k8s")[1])
    pod = doc["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert "vllm-cpu-release-repo" in container["image"]
    assert {"name": "model", "hostPath": {"path": str(model_dir), "type": "Directory"}} in pod["volumes"]
    assert any(m["mountPath"] == str(model_dir) for m in container["volumeMounts"])
    assert "cpu" in doc["metadata"]["annotations"]["autotune/device"]


def test_bash_export_never_writes_a_secret_reference_as_its_value() -> None:
    _, text = render(_cpu_record(Path("/models/tiny")), "bash")
    assert "export HF_TOKEN=" not in text and "HF_TOKEN: read from your environment" in text


def test_export_finds_a_cpu_study_from_its_engine_log(tmp_path: Path) -> None:
    st = _study(tmp_path, "cpu", ["maximize"], {"metric": "output_throughput"}, model="/models/tiny")
    _add(st, 0, [100.0], outcome="ok", log_path=str(CPU_LOG), facts={"engine_version": "0.32.0"})
    out = tmp_path / "run.docker.sh"
    result = runner.invoke(app, ["export", "cpu", "--results", str(tmp_path), "--format", "docker", "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "--gpus" not in text and "vllm-cpu-release-repo:v0.32.0" in text
    assert os.access(out, os.X_OK)


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_machine_readable_exports_keep_no_trial_port(tmp_path: Path, fmt: str) -> None:
    st = _study(tmp_path, "p", ["maximize"], {"metric": "output_throughput"})
    _add(st, 0, [100.0], outcome="ok")
    result = runner.invoke(app, ["export", "p", "--results", str(tmp_path), "--format", fmt])
    assert result.exit_code == 0, result.output
    text = Path(result.output.strip()).read_text()
    assert "40000" not in text and "$PORT" in text
    assert Path(result.output.strip()).parent == tmp_path / "p"


def _sim_record() -> LaunchRecord:
    prefix = ["/usr/bin/python3", "-m", "autotune_sim", "vllm"]
    return LaunchRecord(
        study="sim",
        trial=2,
        argv=[*prefix, *ENGINE_ARGS],
        env={
            "AUTOTUNE_SIM_GPU": "H100-80GB",
            "AUTOTUNE_SIM_SPEEDUP": "20",
            "VLLM_CACHE_ROOT": str(Path.home() / ".cache" / "autotune" / "sim-vllm"),
            "VLLM_LOGGING_LEVEL": "INFO",
        },
        flags={"--max-num-seqs": 64},
        simulated=True,
        engine="vllm",
        engine_version="0.34.0",
        engine_args=ENGINE_ARGS,
        verdict="gain over the engine's defaults +8.0% (range +5.0% … +11.0% over 3 paired runs)",
    )


@pytest.mark.sim  # the bash form quotes the simulator's error bands (python -m autotune_sim error-bands)
@pytest.mark.parametrize("fmt", ["bash", "json", "yaml", "docker", "k8s"])
def test_an_export_of_a_simulated_study_says_so_and_carries_no_simulator_setting(fmt: str) -> None:
    _, text = render(_sim_record(), fmt)
    if fmt in ("json", "yaml", "k8s"):  # read as the tools that load it do (no escapes, no folding)
        text = json.dumps(yaml.safe_load(text), ensure_ascii=False)
    assert "simulated engine" in text and "modelled, not measured" in text
    assert "AUTOTUNE_SIM" not in text and "sim-vllm" not in text and "autotune_sim" not in text
    assert "VLLM_LOGGING_LEVEL" in text  # the engine's own settings stay
    assert "+8.0% (range +5.0% … +11.0% over 3 paired runs)" in text  # the verdict, in every format
    if fmt == "bash":  # the real engine's module with the tuned flags, not the simulator
        words = shlex.split(text.split("exec ", 1)[1].replace("\\\n", " "))
        assert words[:5] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny"]


def test_a_trial_that_did_not_serve_is_exported_only_when_forced(tmp_path: Path) -> None:
    st = _study(tmp_path, "f", ["maximize"], {"metric": "output_throughput"})
    _add(st, 0, [100.0], outcome="ok")
    _add(
        st, 1, None, outcome="oom_runtime", reason="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"
    )
    refused = runner.invoke(app, ["export", "f", "--results", str(tmp_path), "--trial", "1"])
    line = _one_line_error(refused.output)
    assert refused.exit_code == 2 and not list((tmp_path / "f").glob("launch-trial1*"))
    assert "trial 1 did not serve the workload (oom_runtime: torch.OutOfMemoryError: CUDA out of memory." in line
    assert line.endswith("or pass --force to write its launch anyway")
    forced = runner.invoke(app, ["export", "f", "--results", str(tmp_path), "--trial", "1", "--force"])
    assert forced.exit_code == 0 and Path(forced.output.strip()).name == "launch-trial1.sh"
    # An outcome that is not an engine's (a trial the tuner's stop interrupted) is refused alike.
    _add(st, 2, None, outcome="interrupted")
    interrupted = runner.invoke(app, ["export", "f", "--results", str(tmp_path), "--trial", "2"])
    assert "trial 2 did not serve the workload (interrupted)" in _one_line_error(interrupted.output)


def test_pareto_export_refuses_a_format_it_does_not_write(tmp_path: Path) -> None:
    st = _study(
        tmp_path,
        "mo",
        ["maximize", "minimize"],
        {"metric": "output_throughput", "also": [{"metric": "p95_ttft_ms", "direction": "minimize"}]},
    )
    _add(st, 0, [100.0, 50.0], outcome="ok")
    refused = runner.invoke(app, ["export", "mo", "--results", str(tmp_path), "--pareto", "--format", "bash"])
    assert refused.exit_code == 2
    assert _one_line_error(refused.output).endswith(
        "--pareto writes JSON only; drop --format bash (or export one point with --trial N)"
    )
    assert not (tmp_path / "mo" / "pareto.json").exists()
    written = runner.invoke(app, ["export", "mo", "--results", str(tmp_path), "--pareto"])
    assert written.exit_code == 0 and json.loads(Path(written.output.strip()).read_text())["front"]
