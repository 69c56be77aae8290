"""Parallel trials on one box: group sizes from the flags, slots from GPUs or cores, and studies
on the simulator over pretend GPUs (AUTOTUNE_FAKE_GPUS) that run trials at once on disjoint
GPU groups, keep the sequential stages sequential, meet quotas exactly and stop cleanly."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState
from simstudy import SMALL_WORKLOAD, sim_engine, sim_job

from autotune.engines import get_adapter
from autotune.errors import ConfigError
from autotune.runtime import gpu
from autotune.runtime.gpu import FAKE_GPUS_ENV
from autotune.search.parallel import plan_slots, size_bounds
from autotune.search.record import WITHDRAWN
from autotune.search.storage import load_study
from autotune.search.tune import TuneJob, run_study

TP_SPACE = {
    "params": {
        "tensor_parallel": {"type": "categorical", "choices": [1, 2]},
        "max_running": {"type": "int", "low": 8, "high": 256, "log": True},
    }
}


def _job(tmp_path: Path, space: dict[str, Any], **study: Any) -> TuneJob:
    engine = sim_engine(fixed_flags=study.pop("fixed_flags", {}))
    return sim_job(tmp_path, space, engine=engine, name="p", **study)


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Pretend GPUs for this test only (a box name of its own keeps other sessions' engines out)."""

    def use(spec: str) -> str:
        text = f"{spec};box={uuid.uuid4().hex[:8]}"
        monkeypatch.setenv(FAKE_GPUS_ENV, text)
        monkeypatch.setattr(gpu, "_FAKES", {})
        return text

    return use


# ------------------------------------------------------------------------------ sizing
def test_a_trial_needs_tp_times_pp_times_dp_gpus(tmp_path: Path) -> None:
    adapter = get_adapter(_job(tmp_path, TP_SPACE).engine)
    assert adapter.gpu_count({}) == 1
    assert adapter.gpu_count({"--tensor-parallel-size": 2, "--max-num-seqs": 64}) == 2
    flags = {"--tensor-parallel-size": 2, "--pipeline-parallel-size": 2, "--data-parallel-size": 2}
    assert adapter.gpu_count(flags) == 8
    assert size_bounds(_job(tmp_path, TP_SPACE), adapter) == (1, 2)
    fixed = _job(tmp_path, {"params": {}}, fixed_flags={"tensor_parallel": 4})
    assert size_bounds(fixed, adapter) == (4, 4)


def test_without_gpus_slots_are_bounded_by_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAKE_GPUS_ENV, raising=False)
    monkeypatch.setattr(gpu, "_DEFAULT", [None])  # NVML absent
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    job = _job(tmp_path, TP_SPACE, parallel=16)
    slots = plan_slots(job, get_adapter(job.engine))
    assert slots.count == 4 and slots.allocator is None
    assert "no GPU: 4 trial(s) at once, bounded by 8 CPU core(s)" in slots.note
    with pytest.raises(ConfigError, match="--gpus was given but NVML finds no GPU"):
        plan_slots(_job(tmp_path, TP_SPACE, gpus=[0]), get_adapter(job.engine))


def test_gpu_slots_follow_group_sizes_and_the_pool(tmp_path: Path, fake_gpus: Any) -> None:
    fake_gpus("8xH100-80GB;busy=7")
    job = _job(tmp_path, {"params": {}}, fixed_flags={"tensor_parallel": 2}, parallel="auto")
    adapter = get_adapter(job.engine)
    slots = plan_slots(job, adapter)
    assert slots.count == 3  # 7 free GPUs hold three TP-2 groups
    assert "skipped GPU 7 (held by PID" in slots.note
    subset = plan_slots(_job(tmp_path, {"params": {}}, parallel=8, gpus=[0, 1, 4, 5]), adapter)
    assert subset.count == 4 and "capped: only 4 group(s) fit" in subset.note
    with pytest.raises(ConfigError, match="trials need up to 8 GPUs"):
        plan_slots(_job(tmp_path, {"params": {}}, fixed_flags={"tensor_parallel": 8}, parallel=2), adapter)


# ------------------------------------------------------------------------------ studies
# The engine command of the overlap tests. A trial's engine of the paired stage holds its
# start-up until another trial of that stage has an engine running too, so "two trials ran at
# once" is made true by the order of events whenever the scheduler really runs trials side by
# side — not by how fast this machine happens to start them. Once one pair has met, later
# engines start at once. The stage and the running engines are read from the study's own
# SQLite file (the runner records each trial's ``stage`` and ``engine_pgid`` as it launches).
PAIRING_ENGINE = """
import os, sqlite3, sys, time
args = sys.argv[1:]
sim = [sys.executable, "-m", "autotune_sim", "vllm", *args]
db, stage, met = os.environ["PAIR_DB"], os.environ["PAIR_STAGE"], os.environ["PAIR_DIR"] + "/met"

def running():
    con = sqlite3.connect(db, timeout=10)
    try:
        rows = con.execute(
            "SELECT a.value_json, b.value_json FROM trials t"
            " JOIN trial_user_attributes a ON a.trial_id = t.trial_id AND a.key = 'engine_pgid'"
            " JOIN trial_user_attributes b ON b.trial_id = t.trial_id AND b.key = 'stage'"
            " WHERE t.state = 'RUNNING'"
        ).fetchall()
    finally:
        con.close()
    return {int(pgid): stage.strip('"') for pgid, stage in rows}

if "--port" in args:  # a launch (flag discovery runs --help and passes straight through)
    deadline = time.monotonic() + 30  # a scheduler that never pairs fails the test's assertion
    while not os.path.exists(met) and time.monotonic() < deadline:
        try:
            engines = running()
        except sqlite3.Error:
            engines = {}
        mine = engines.get(os.getpgrp())
        if mine is not None and mine != stage:
            break  # another stage: no pairing asked
        if mine == stage and any(s == stage and pgid != os.getpgrp() for pgid, s in engines.items()):
            open(met, "w").close()
            break
        time.sleep(0.05)
os.execv(sys.executable, sim)
"""


def _pairing(job: TuneJob, tmp_path: Path, stage: str) -> TuneJob:
    """The job with the pairing engine for ``stage`` (see PAIRING_ENGINE)."""
    script = tmp_path / "pairing_engine.py"
    script.write_text(PAIRING_ENGINE)
    env = {
        **job.engine.env,
        "PAIR_DB": job.storage_url.removeprefix("sqlite:///"),
        "PAIR_STAGE": stage,
        "PAIR_DIR": str(tmp_path),
    }
    engine = job.engine.model_copy(update={"command": [sys.executable, str(script)], "env": env})
    return dataclasses.replace(job, engine=engine)


def _interval(t: FrozenTrial) -> tuple[float, float]:
    """When the trial held its GPU group: argv.json is written once the group is held and the
    engine is about to start; outcome.json after the engine is gone."""
    folder = Path(t.user_attrs["trial_dir"])
    return (folder / "argv.json").stat().st_mtime, (folder / "outcome.json").stat().st_mtime


def _devices(t: FrozenTrial) -> set[str]:
    return set(t.user_attrs["placement"]["CUDA_VISIBLE_DEVICES"].split(","))


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.sim
@pytest.mark.slow
def test_parallel_search_runs_trials_at_once_on_disjoint_gpu_groups(tmp_path: Path, fake_gpus: Any) -> None:
    fake_gpus("4xH100-80GB")
    job = _job(tmp_path, TP_SPACE, method="search", trials=6, finalists=1, validation_runs=2, parallel="auto")
    job = _pairing(job, tmp_path, "search")
    assert run_study(job) is not None
    study = load_study("p", job.storage_url)
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    stages = [t.user_attrs["stage"] for t in trials]
    # The defaults launched twice (the noise), 2 re-runs of the finalist and 2 of the engine's
    # defaults beside them (the paired gain).
    counts = [stages.count(s) for s in ("baseline", "noise", "search", "validation")]
    assert counts == [1, 1, 6, 4]
    # The shared quota is exact: no slot overshoots it. A proposal of a measured configuration is
    # withdrawn before launch (autotune.search.novelty) and takes no place.
    withdrawn = [t for t in study.trials if t.user_attrs.get("outcome") == WITHDRAWN]
    assert len(study.trials) - len(withdrawn) == 12
    assert all("engine_pgid" not in t.user_attrs for t in withdrawn)
    for t in trials:
        tp = int(t.user_attrs["flags"].get("--tensor-parallel-size", 1))
        assert len(_devices(t)) == tp
        launched = json.loads((Path(t.user_attrs["trial_dir"]) / "argv.json").read_text())["env"]
        assert launched["CUDA_VISIBLE_DEVICES"] == t.user_attrs["placement"]["CUDA_VISIBLE_DEVICES"]
        assert launched["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert "CUDA_VISIBLE_DEVICES" not in t.user_attrs["env"]  # exported scripts stay portable
    overlapping = [
        (a, b) for a in trials for b in trials if a.number < b.number and _overlap(_interval(a), _interval(b))
    ]
    assert overlapping, "no two trials ran at the same time"  # the pairing engine waited 30 s in vain
    for a, b in overlapping:
        assert not _devices(a) & _devices(b), f"trials {a.number} and {b.number} shared a GPU"


@pytest.mark.sim
@pytest.mark.slow
def test_staged_study_keeps_sequential_stages_sequential(tmp_path: Path, fake_gpus: Any) -> None:
    fake_gpus("4xH100-80GB")
    space = {
        "params": {
            "memory_fraction": {"type": "float", "low": 0.86, "high": 0.94, "step": 0.02},
            "max_running": {"type": "int", "low": 8, "high": 256, "log": True},
        }
    }
    job = _job(tmp_path, space, method="staged", trials=6, finalists=1, validation_runs=1, parallel=3)
    run_study(_pairing(job, tmp_path, "scenario"))
    study = load_study("p", job.storage_url)
    by_stage: dict[str, list[FrozenTrial]] = {}
    for t in study.trials:
        by_stage.setdefault(t.user_attrs["stage"], []).append(t)
    sequential = [t for s in ("baseline", "context", "memory_edge") for t in by_stage.get(s, [])]
    assert len(by_stage["memory_edge"]) >= 2
    for a in sequential:
        for b in sequential:
            assert a is b or not _overlap(_interval(a), _interval(b)), (a.number, b.number)
    assert study.user_attrs["stage.memory_edge"]["done"]
    scenario = by_stage["scenario"]
    assert len(scenario) == 3  # plan_budget(6): 3 memory probes, 3 scenario trials
    assert any(_overlap(_interval(a), _interval(b)) for a in scenario for b in scenario if a is not b)
    edge = study.user_attrs["stage.memory_edge"]["edge"]
    assert all(t.params["memory_fraction"] == edge for t in scenario)


@pytest.mark.sim
@pytest.mark.slow
def test_sigterm_stops_every_slot_and_resume_finishes(
    tmp_path: Path, fake_gpus: Any, find_engines: Callable[[str, str], list[int]]
) -> None:
    spec = fake_gpus("2xH100-80GB")
    (tmp_path / "space.json").write_text(
        json.dumps(TP_SPACE | {"params": {"max_running": TP_SPACE["params"]["max_running"]}})
    )
    (tmp_path / "wl.json").write_text(json.dumps({**SMALL_WORKLOAD, "num_prompts": 250}))
    cmd = [
        sys.executable, "-m", "autotune.cli", "tune", "--study", "s", "--engine", "sim", "--method", "search",
        "--space", str(tmp_path / "space.json"), "--workload", str(tmp_path / "wl.json"), "--trials", "2",
        "--finalists", "0", "--results", str(tmp_path), "--sim-speedup", "5", "--parallel", "2", "--seed", "0",
    ]  # fmt: skip
    env = {**os.environ, FAKE_GPUS_ENV: spec}
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    storage = f"sqlite:///{tmp_path / 's' / 'study.db'}"
    deadline, seen = time.monotonic() + 300, "nothing"
    while time.monotonic() < deadline and first.poll() is None:  # both slots busy with a search trial
        time.sleep(0.5)
        if not (tmp_path / "s" / "manifest.json").exists():
            continue  # the tuner writes it once the study exists: opening the database earlier races its creation
        try:
            trials = optuna.load_study(study_name="s", storage=storage).get_trials()
        except Exception:
            continue
        seen = ", ".join(f"{t.number} {t.user_attrs.get('stage')} {t.state.name}" for t in trials)
        running = [t for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get("stage") == "search"]
        if sum(1 for t in running if "engine_pgid" in t.user_attrs) == 2:
            break
    else:
        first.kill()
        _, err = first.communicate()
        pytest.fail(f"two search trials never ran at once (exit {first.returncode}; trials: {seen}): {err[-2000:]}")
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 130, err
    assert "interrupted" in err
    assert not find_engines(FAKE_GPUS_ENV, spec), "an engine outlived the interrupted tuner"
    study = load_study("s", storage)
    interrupted = [t for t in study.trials if t.user_attrs.get("outcome") == "interrupted"]
    assert len(interrupted) == 2 and all(t.state == TrialState.FAIL for t in interrupted)
    assert not study.get_trials(states=(TrialState.RUNNING,))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    study = load_study("s", storage)
    retried = {int(t.user_attrs["retry_of"]) for t in study.trials if "retry_of" in t.user_attrs}
    assert {t.number for t in interrupted} <= retried
