"""The fault matrix (docs/fault-matrix.md): each fault injected into the simulated engine ends in
the documented outcome, leaves no process behind, and leaves the study consistent.

Every row runs against both simulated dialects (vLLM and SGLang: ``python -m autotune_sim
vllm|sglang``, the CLI's ``--engine sim`` / ``--engine sim-sglang``), SGLang as 0.5.23 and as
0.5.15 (no ``/ready``, graph sizes on another line). Nothing here orders
events with sleeps: a test waits for the state it needs (a line in the log, tokens in the
engine's ``/metrics``), with a generous deadline that only bounds a broken run. The one wall-clock
bound is a requirement itself: a fatal start-up line is classified, and the engine's process
group gone, within 2 s.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from simstudy import MODEL, sim_engine, sim_job

from autotune.bench import prometheus
from autotune.config import EngineSettings
from autotune.engines import get_adapter
from autotune.engines.base import LogEvent
from autotune.engines.rootcause import root_cause
from autotune.errors import EngineStartupError
from autotune.outcomes import Outcome
from autotune.runtime.ports import free_port
from autotune.runtime.process import EngineProcess
from autotune.runtime.procfs import pids_in_group
from autotune.search.objective import is_feasible
from autotune.search.record import trial_record
from autotune.search.storage import load_study
from autotune.search.trial import PORT_TRIES
from autotune.search.tune import TuneJob, run_study

pytestmark = [pytest.mark.sim, pytest.mark.slow]

DIALECTS = ["vllm", "sglang", "sglang-0.5.15"]  # dialect[-release]
CLI_ENGINE = {"vllm": "sim", "sglang": "sim-sglang"}


def _kind(dialect: str) -> str:
    return dialect.split("-")[0]


def _release_env(dialect: str) -> dict[str, str]:
    """The simulated SGLang release a ``sglang-X.Y.Z`` entry of DIALECTS asks for."""
    return {"AUTOTUNE_SIM_SGLANG_VERSION": dialect.split("-", 1)[1]} if "-" in dialect else {}


WORKLOAD = {
    "name": "faults",
    "dataset": {"input_len": 256, "output_len": 64},
    "num_prompts": 60,
    "warmup_requests": 0,
    "arrival": {"concurrency": 8},
    "request_timeout_s": 60,
}
LONG_WORKLOAD = {**WORKLOAD, "num_prompts": 600}
SPACE = {"params": {"max_running": {"type": "categorical", "choices": [64]}}}
WAIT_S = 120.0  # bounds a broken run only; the states waited for come in seconds
# Fatal line → classified outcome with the group gone: under 2 s on a quiet host, the figure
# benchmarks/classify_latency.py measures. The test only has to tell the supervisor's own kill
# from the wrapper's 120 s linger, with room for a loaded 2-core host.
KILLED_NOT_AWAITED_S = 30.0


def _engine(
    tmp_path: Path, fault: str, dialect: str = "vllm", startup_timeout_s: float = 60.0, speedup: str = "50"
) -> EngineSettings:
    env = {"AUTOTUNE_SIM_FAULT": fault, "AUTOTUNE_TEST_MARK": str(tmp_path), **_release_env(dialect)}
    return sim_engine(_kind(dialect), speedup=float(speedup), env=env, startup_timeout_s=startup_timeout_s)


@pytest.fixture(autouse=True)
def no_engine_outlives_its_test(tmp_path: Path, find_engines: Callable[[str, str], list[int]]) -> Iterator[None]:
    yield
    assert not find_engines("AUTOTUNE_TEST_MARK", str(tmp_path)), "an engine outlived its trial"


def _job(tmp_path: Path, engine: EngineSettings, workload: dict[str, Any] = WORKLOAD, **study: Any) -> TuneJob:
    settings = {"name": "f", "method": "search", "trials": 1, "baseline": False, "finalists": 0, "retries": 0, **study}
    return sim_job(tmp_path, SPACE, engine=engine, workload=workload, **settings)


def _run(
    tmp_path: Path, engine: EngineSettings, workload: dict[str, Any] = WORKLOAD, **study: Any
) -> list[optuna.trial.FrozenTrial]:
    job = _job(tmp_path, engine, workload, **study)
    run_study(job)
    return load_study("f", job.storage_url).trials


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _engine_port(trial_dir: Path) -> int | None:
    """The port of the trial's engine, from argv.json (written before the launch)."""
    try:
        argv = json.loads((trial_dir / "argv.json").read_text())["argv"]
    except (OSError, ValueError, KeyError):
        return None
    return int(argv[argv.index("--port") + 1]) if "--port" in argv else None


RUNNING_GAUGES = ("vllm:num_requests_running", "sglang:num_running_reqs")


def _tokens_streamed(trial_dir: Path) -> bool:
    """True once the trial's engine serves several requests at once: the benchmark (concurrency
    8 or 4) is under way. Tokens generated, or one running request, would not do: SGLang serves
    a warm-up request of its own before it is ready."""
    port = _engine_port(trial_dir)
    if port is None:
        return False
    try:
        samples = prometheus.scrape(f"http://127.0.0.1:{port}", timeout=2.0)
    except Exception:  # not listening yet, or going away
        return False
    return any(key.startswith(RUNNING_GAUGES) and value >= 2 for key, value in samples.items())


# ------------------------------------------------------------------------------ runtime faults
@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    ("fault", "extra", "outcome", "reason_has"),
    [
        ("crash_after_requests=10", {}, "crash", ""),
        ("oom_after_requests=10", {}, "oom_runtime", "out of memory"),
        ("hang_after_requests=10", {"stall_timeout_s": 3}, "crash", "hung"),
        ("drop_connections=0.3", {}, "slo_violation", ""),
        ("slow_startup_s=100", {}, "ok", ""),  # 2 s on the wall at 50×: inside the 60 s timeout
    ],
    ids=["crash-mid-benchmark", "oom-under-load", "hang-mid-benchmark", "connection-drops", "slow-startup-inside"],
)
def test_runtime_faults(
    tmp_path: Path, dialect: str, fault: str, extra: dict[str, Any], outcome: str, reason_has: str
) -> None:
    trials = _run(tmp_path, _engine(tmp_path, fault, dialect), **extra)
    assert [t.user_attrs["outcome"] for t in trials] == [outcome]
    assert reason_has.lower() in trials[0].user_attrs["reason"].lower()
    if Outcome(outcome).retryable:
        # A crash or hang says nothing of the flags: told FAIL, with no value at all.
        assert trials[0].state == optuna.trial.TrialState.FAIL and trials[0].values is None
    elif outcome not in ("ok", "slo_violation"):
        # A failure the flags caused is told the objective's worst value (throughput: 0) and an
        # infeasible constraint, so no direction of the objective can rank it best.
        assert trials[0].state == optuna.trial.TrialState.COMPLETE and trials[0].values == [0.0]
        record = trial_record(trials[0])
        assert record.constraints and all(slack > 0 for slack in record.constraints.values()), record.constraints
        assert not is_feasible(record.outcome, record.constraints)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_engine_killed_mid_benchmark_is_a_crash_naming_the_kill(tmp_path: Path, dialect: str) -> None:
    # What the OOM killer does: SIGKILL of the engine's process while requests stream.
    trial_dir = tmp_path / "f" / "trials" / "0"
    killed: list[int] = []
    trial_over = threading.Event()

    def kill_when_streaming() -> None:
        while not _tokens_streamed(trial_dir):
            if trial_over.wait(0.05):
                return  # never saw the benchmark: the assertion below says so
        pgid = _engine_pgid(tmp_path)
        if pgid is not None:
            os.kill(pgid, signal.SIGKILL)  # the leader only: the supervisor must notice and end the rest
            killed.append(pgid)

    killer = threading.Thread(target=kill_when_streaming, daemon=True)
    killer.start()
    # Ten times the matrix's benchmark: about 10 s of streaming instead of one, so a loaded host
    # still sees it; the kill ends the trial early, so the length costs nothing.
    try:
        trials = _run(tmp_path, _engine(tmp_path, "", dialect, speedup="10"), LONG_WORKLOAD)
    finally:
        trial_over.set()  # a poller left running would scrape during the tests that follow
        killer.join()
    assert killed, "the benchmark never started streaming"
    trial = trials[0]
    assert trial.user_attrs["outcome"] == "crash"
    assert "SIGKILL" in trial.user_attrs["reason"], trial.user_attrs["reason"]
    assert "mid-benchmark" in trial.user_attrs["reason"] or "first request" in trial.user_attrs["reason"]
    # No score recorded: a crash is told to the sampler as a failed trial, with no value.
    assert trial.state == optuna.trial.TrialState.FAIL and trial.values is None
    assert pids_in_group(killed[0]) == []


def _engine_pgid(tmp_path: Path) -> int | None:
    """The running trial's engine group, as the runner records it for the reaper."""
    try:
        trials = optuna.load_study(study_name="f", storage=f"sqlite:///{tmp_path / 'f' / 'study.db'}").trials
    except Exception:
        return None
    pgids = [t.user_attrs.get("engine_pgid") for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    return int(pgids[-1]) if pgids and pgids[-1] is not None else None


# ------------------------------------------------------------------------------ start-up faults
@pytest.mark.parametrize("dialect", DIALECTS)
def test_hang_at_startup_times_out_and_is_retried_once(tmp_path: Path, dialect: str) -> None:
    trials = _run(tmp_path, _engine(tmp_path, "hang_startup", dialect, startup_timeout_s=4), retries=1)
    assert [t.user_attrs["outcome"] for t in trials] == ["startup_timeout", "startup_timeout"]
    assert trials[1].user_attrs["retry_of"] == trials[0].number
    # infrastructure: not told as a value, so the sampler does not learn "these flags are bad"
    assert all(t.state == optuna.trial.TrialState.FAIL for t in trials)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_crash_at_startup_is_a_crash_and_retried_once(tmp_path: Path, dialect: str) -> None:
    # An engine that answers --help like the real one but segfaults while starting: nothing about the flags.
    wrapper = tmp_path / "engine.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --help*) exec {sys.executable} -m autotune_sim {_kind(dialect)} "$@";; esac\n'
        "echo 'Fatal Python error: Segmentation fault' >&2; exit 139\n"
    )
    wrapper.chmod(0o755)
    engine = _engine(tmp_path, "", dialect).model_copy(update={"command": [str(wrapper)]})
    trials = _run(tmp_path, engine, retries=1)
    assert [t.user_attrs["outcome"] for t in trials] == ["crash", "crash"]
    assert trials[1].user_attrs["retry_of"] == trials[0].number


@pytest.mark.parametrize("dialect", DIALECTS)
def test_port_taken_under_the_engine_is_launched_again_on_a_new_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dialect: str
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        # The first launch gets the squatted port (as if another process bound it between the
        # choice and the engine's bind); the retry gets a real free port.
        monkeypatch.setattr("autotune.search.trial.free_port", lambda host: next(ports, None) or free_port(host))
        trials = _run(tmp_path, _engine(tmp_path, "", dialect), retries=1)
    assert [t.user_attrs["outcome"] for t in trials] == ["ok"]
    assert "address already in use" in Path(trials[0].user_attrs["log_path"]).read_text().lower()
    (line,) = trials[0].user_attrs["facts"]["ports_taken"]
    assert "address already in use" in line.lower()
    argv = trials[0].user_attrs["argv"]
    assert int(argv[argv.index("--port") + 1]) != taken


def test_ports_taken_at_every_launch_are_a_transient_crash_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken] * PORT_TRIES)
        monkeypatch.setattr("autotune.search.trial.free_port", lambda host: next(ports, None) or free_port(host))
        trials = _run(tmp_path, _engine(tmp_path, "", "vllm"), retries=1)
    assert [t.user_attrs["outcome"] for t in trials] == ["crash", "ok"]
    assert len(trials[0].user_attrs["facts"]["ports_taken"]) == PORT_TRIES
    assert trials[0].user_attrs["facts"]["root_cause"]["kind"] == "port_in_use"
    assert trials[1].user_attrs["retry_of"] == trials[0].number


@pytest.mark.parametrize("dialect", DIALECTS)
def test_fatal_start_is_classified_and_its_group_killed_not_awaited(tmp_path: Path, dialect: str) -> None:
    """A KV pool too small for the context: the engine prints its fatal line and then — like real
    vLLM, whose shutdown after a failed KV check takes 6-13 s — does not exit. The wrapper keeps
    the group alive after the simulator's own exit, ignoring SIGTERM, so only the supervisor's
    own kill can end it in time."""
    settings = _engine(tmp_path, "", dialect, speedup="100")
    adapter = get_adapter(settings)
    fraction = 0.3 if dialect == "vllm" else 0.1  # vLLM: KV check fails; SGLang: weights leave no KV room
    spec = adapter.build_launch(adapter.to_flags({"memory_fraction": fraction}), free_port())
    lingering = ["sh", "-c", '"$@"; trap "" TERM; exec sleep 120', "sh", *spec.argv]
    events: list[LogEvent] = []

    engine = EngineProcess(
        lingering,
        {**spec.env, "AUTOTUNE_TEST_MARK": str(tmp_path)},
        tmp_path / "engine.log",
        ready_url=spec.base_url + spec.ready_path,
        on_line=adapter.watch_log(events),
        startup_timeout_s=WAIT_S,
    )
    with engine:
        with pytest.raises(EngineStartupError) as info:
            engine.wait_ready()
        outcome = adapter.classify_failure(info.value.returncode, events)
        assert engine.pgid is not None and engine.fatal_at is not None
        gone = pids_in_group(engine.pgid) == []
        classified_at = time.monotonic()
    took = classified_at - engine.fatal_at
    print(f"\n{dialect} sim: fatal line → classified, group gone in {took:.2f}s")
    assert gone, "the group must be gone when the failure is raised"
    assert outcome == Outcome.KV_INSUFFICIENT
    # The grace after the first fatal line let the root cause in (it follows it in the log).
    assert root_cause(events, "").kind == "kv_insufficient"
    assert took <= KILLED_NOT_AWAITED_S, f"classification took {took:.2f}s after the fatal line"


# ------------------------------------------------------------------------------ the tuner's signals
def _cli(tmp_path: Path, dialect: str, speedup: str) -> list[str]:
    # 400 answers of 64 tokens at 4 at a time: ~45 modelled seconds, ~9 wall seconds at 5x, room to
    # signal mid-benchmark. The subject is the signal and the resume: no noise run of the defaults,
    # no run lengthened until its throughput is pinned.
    wl = tmp_path / "wl.yaml"
    wl.write_text(
        "name: slow\ndataset: {input_len: 256, output_len: 64}\nnum_prompts: 400\narrival: {concurrency: 4}\n"
    )
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  max_running: {type: categorical, choices: [32, 64]}\n")
    return [
        sys.executable, "-m", "autotune.cli", "tune", "--study", "c", "--engine", CLI_ENGINE[_kind(dialect)],
        "--model", MODEL, "--method", "search", "--space", str(space), "--workload", str(wl),
        "--trials", "1", "--finalists", "0", "--results", str(tmp_path), "--sim-speedup", speedup,
        "--noise-runs", "0", "--stable-within", "0", "--env", f"AUTOTUNE_TEST_MARK={tmp_path}",
        *(a for k, v in _release_env(dialect).items() for a in ("--env", f"{k}={v}")),
    ]  # fmt: skip


# Each signal once and each dialect once: the tuner handles every signal on one path, whatever
# the engine, and each dialect's engine is torn down the same way whatever the signal.
@pytest.mark.parametrize(
    ("sig", "dialect"),
    [(signal.SIGINT, "vllm"), (signal.SIGHUP, "sglang"), (signal.SIGTERM, "sglang-0.5.15")],
    ids=["ctrl-c-vllm", "sighup-sglang", "sigterm-sglang-0.5.15"],
)
def test_tuner_signal_marks_the_trial_interrupted_and_resume_reruns_it(
    tmp_path: Path, find_engines: Callable[[str, str], list[int]], dialect: str, sig: signal.Signals
) -> None:
    proc = subprocess.Popen(
        _cli(tmp_path, dialect, speedup="5"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        # Mid-benchmark: the engine has streamed tokens (not "ready + a guessed second").
        _wait(lambda: _tokens_streamed(tmp_path / "c" / "trials" / "0") or proc.poll() is not None, "the benchmark")
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert find_engines("AUTOTUNE_TEST_MARK", str(tmp_path)), "the engine never started"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "resume" in err, err[-2000:]
    assert not find_engines("AUTOTUNE_TEST_MARK", str(tmp_path)), "the engine outlived the interrupted tuner"
    storage = f"sqlite:///{tmp_path / 'c' / 'study.db'}"
    first = load_study("c", storage).trials[0]
    assert first.state == optuna.trial.TrialState.FAIL
    assert first.user_attrs["outcome"] == "interrupted"

    done = subprocess.run(
        _cli(tmp_path, dialect, speedup="200"), capture_output=True, text=True, timeout=300, env={**os.environ}
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not find_engines("AUTOTUNE_TEST_MARK", str(tmp_path))
    trials = load_study("c", storage).trials
    rerun = [t for t in trials if t.user_attrs.get("retry_of") == first.number]
    assert len(rerun) == 1 and rerun[0].user_attrs["outcome"] == "ok"
    assert rerun[0].params == first.params  # the same configuration, re-run
