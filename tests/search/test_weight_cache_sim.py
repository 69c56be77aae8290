"""The study's weight-cache daemon on the simulated vLLM 0.34 and SGLang 0.5.23: one daemon serves
every trial after the first, and it never outlives the study — after success, a failure, Ctrl-C,
or the tuner's SIGKILL (then the next run reaps whatever is left)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from simstudy import sim_engine, sim_env, sim_job

from autotune.search.record import trial_record, weight_daemon
from autotune.search.storage import load_study
from autotune.search.tune import TuneJob, run_study

pytestmark = [pytest.mark.sim, pytest.mark.slow]

WORKLOAD = {
    "name": "wc-small",
    "dataset": {"input_len": 256, "output_len": 32},
    "num_prompts": 32,
    "warmup_requests": 1,
    "arrival": {"concurrency": 16},
}
SPACE = {"params": {"max_running": {"type": "int", "low": 8, "high": 128, "log": True}}}


def _env(tmp_path: Path, version: str) -> dict[str, str]:
    """The simulated vLLM ``version``'s environment, its compile cache in the test's folder."""
    return sim_env(
        AUTOTUNE_SIM_VLLM_VERSION=version,
        VLLM_CACHE_ROOT=str(tmp_path / "compile-cache"),
        MARK_RESULTS=str(tmp_path),  # finds this test's processes in /proc
    )


def _job(tmp_path: Path, version: str = "0.34.0", kind: str = "vllm", **study: Any) -> TuneJob:
    env = _env(tmp_path, version if kind == "vllm" else "0.34.0")
    if kind == "sglang":
        env["AUTOTUNE_SIM_SGLANG_VERSION"] = version
    settings = {"name": "w", "method": "search", "trials": 2, "finalists": 1, "validation_runs": 1, **study}
    return sim_job(tmp_path, SPACE, engine=sim_engine(kind, env=env), workload=WORKLOAD, **settings)


def _daemons(tmp_path: Path) -> list[int]:
    """Live `vllm preload` processes started for this test."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if ("autotune_sim vllm preload" in cmd or "autotune_sim sglang-weight-cache" in cmd) and str(tmp_path) in env:
            found.append(int(entry.name))
    return found


def _gone_within(tmp_path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _daemons(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _daemons(tmp_path)


def _mapped_study(job: TuneJob) -> tuple[optuna.Study, list[Any]]:
    """Run ``job``; its first trial tells the engine's version and loads from disk, every later
    one maps its weights from the daemon, zero-copy. Returns the study and its trial records."""
    run_study(job)
    study = load_study("w", job.storage_url)
    records = [trial_record(t) for t in study.trials]
    sources = [r.facts.get("startup", {}).get("weights_from") for r in records]
    assert sources[0] == "disk" and len(sources) >= 4, sources
    assert all(s == "daemon:zero_copy" for s in sources[1:]), sources
    return study, records


def test_one_daemon_serves_every_trial_after_the_first_and_is_gone_at_the_end(tmp_path: Path) -> None:
    study, records = _mapped_study(_job(tmp_path))  # the first trial's log says 0.34
    mapped = records[1].facts["startup"]
    assert mapped["weights_s"] < records[0].facts["startup"]["weights_s"] / 5, (mapped, records[0].facts)
    # Zero-copy: the daemon's weights count inside the engine's budget, so the pool is unchanged.
    same_flags = [r for r in records[1:] if r.flags == records[0].flags]
    assert all(r.facts["kv_tokens"] == records[0].facts["kv_tokens"] for r in same_flags)
    # What is recorded for export is the trial's own launch, without the study's daemon.
    assert all("ipc_cache" not in r.argv for r in records)
    argv_json = json.loads((Path(records[1].trial_dir) / "argv.json").read_text())
    assert "ipc_cache" in argv_json["argv"]
    assert (tmp_path / "w" / "weight-cache" / "daemon.log").read_text().count("Weight cache daemon READY") == 1
    assert weight_daemon(study) is None and _gone_within(tmp_path, 5)


def test_sglang_maps_its_weights_from_a_standalone_daemon_in_a_private_folder(tmp_path: Path) -> None:
    # SGLang reports its version over HTTP once the first trial serves.
    study, records = _mapped_study(_job(tmp_path, "0.5.23", "sglang"))
    # Client mode adds the daemon's weights back onto the baseline: the pool is a cold start's.
    same_flags = [r for r in records[1:] if r.flags == records[0].flags]
    assert same_flags and all(r.facts["kv_tokens"] == records[0].facts["kv_tokens"] for r in same_flags)
    argv_json = json.loads((Path(records[1].trial_dir) / "argv.json").read_text())
    assert argv_json["argv"][argv_json["argv"].index("--weight-cache-mode") + 1] == "client"
    socket_template = argv_json["env"]["SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"]
    assert not socket_template.startswith("/tmp/sglang_weight_cache_"), socket_template  # never a user's daemon
    assert all(
        "--weight-cache-mode" not in r.argv and "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE" not in r.env for r in records
    )
    log = (tmp_path / "w" / "weight-cache" / "daemon.log").read_text()
    assert log.count("Listening on") == 1, log[-2000:]
    assert weight_daemon(study) is None and _gone_within(tmp_path, 5)
    assert not Path(socket_template).parent.exists()  # its sockets and ready files went with it


def test_a_study_that_fails_takes_its_daemon_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.search import runner

    real_run_trial, calls = runner.run_trial, []

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:  # the daemon serves by now
            assert _daemons(tmp_path), "no daemon while the third trial starts"
            raise RuntimeError("a bug in the tuner")
        return real_run_trial(*args, **kwargs)

    monkeypatch.setattr(runner, "run_trial", failing)
    job = _job(tmp_path, trials=4)
    with pytest.raises(RuntimeError, match="a bug in the tuner"):
        run_study(job)
    assert _gone_within(tmp_path, 5), "the weight-cache daemon outlived a failed study"
    assert weight_daemon(load_study("w", job.storage_url)) is None


def test_older_vllm_or_weight_cache_off_starts_no_daemon(tmp_path: Path) -> None:
    for kind, version, mode in (("vllm", "0.33.0", "auto"), ("vllm", "0.34.0", "off"), ("sglang", "0.5.20", "auto")):
        job = _job(tmp_path / f"{version}-{mode}", version, kind, weight_cache=mode, finalists=0)
        run_study(job)
        study = load_study("w", job.storage_url)
        sources = {trial_record(t).facts.get("startup", {}).get("weights_from") for t in study.trials}
        assert sources <= {"disk", None} and "daemon:zero_copy" not in sources, (version, mode, sources)
        assert not (job.dir / "weight-cache" / "daemon.log").exists()


def _tune_command(tmp_path: Path) -> list[str]:
    (tmp_path / "space.json").write_text(json.dumps(SPACE))
    (tmp_path / "wl.json").write_text(json.dumps({**WORKLOAD, "num_prompts": 400}))
    env_flags = [w for k, v in _env(tmp_path, "0.34.0").items() for w in ("--env", f"{k}={v}")]
    return [
        *(sys.executable, "-m", "autotune.cli", "tune", "--study", "k", "--engine", "sim", "--method", "search"),
        *("--space", str(tmp_path / "space.json"), "--workload", str(tmp_path / "wl.json"), "--trials", "3"),
        *("--finalists", "0", "--results", str(tmp_path), "--seed", "3", "--sim-speedup", "5", *env_flags),
    ]


def _start_until_the_daemon_serves(tmp_path: Path, cmd: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MARK_RESULTS": str(tmp_path)}
    tuner = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    storage = f"sqlite:///{tmp_path / 'k' / 'study.db'}"
    deadline = time.monotonic() + 400  # generous: the machine may be busy
    while time.monotonic() < deadline and tuner.poll() is None:
        time.sleep(0.5)
        if not (tmp_path / "k" / "manifest.json").exists():
            continue  # the tuner writes it once the study exists: opening the database earlier races its creation
        try:
            study = optuna.load_study(study_name="k", storage=storage)
        except Exception:  # not created yet
            continue
        if weight_daemon(study) is not None and _daemons(tmp_path):
            return tuner
    tuner.kill()
    pytest.fail("the tuner never started its weight-cache daemon")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_the_daemon_dies_with_its_tuner_and_a_resume_finishes_the_study(tmp_path: Path, sig: signal.Signals) -> None:
    cmd = _tune_command(tmp_path)
    tuner = _start_until_the_daemon_serves(tmp_path, cmd)
    tuner.send_signal(sig)
    tuner.wait(timeout=120)
    # Ctrl-C tears it down on the way out; after SIGKILL its parent-death watchdog ends it.
    assert _gone_within(tmp_path, 10), "a weight-cache daemon outlived its tuner"
    done = subprocess.run(cmd, env={**os.environ, "MARK_RESULTS": str(tmp_path)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    study = load_study("k", f"sqlite:///{tmp_path / 'k' / 'study.db'}")
    assert weight_daemon(study) is None and _gone_within(tmp_path, 5)
    finished = [t for t in study.trials if trial_record(t).stage == "search" and t.state.is_finished()]
    assert len(finished) >= 3
