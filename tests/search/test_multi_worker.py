"""Several workers on one study through PostgreSQL (Optuna's distributed mode), on the simulator.

Needs a server: ``make postgres`` starts one on 127.0.0.1 and the Makefile exports
``AUTOTUNE_TEST_PG_URL``. Without it these tests are skipped, unless ``AUTOTUNE_REQUIRE_POSTGRES=1``
(``make test``) turns the skip into a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState
from simstudy import SMALL_WORKLOAD

from autotune.search.coordination import LEASE_KEY
from autotune.search.storage import superseded

pytestmark = [pytest.mark.sim, pytest.mark.slow]

SPACE = {
    "params": {
        "max_running": {"type": "int", "low": 8, "high": 512, "log": True},
        "batched_tokens": {"type": "categorical", "choices": [2048, 8192]},
    }
}


@pytest.fixture(scope="module")
def pg_url() -> str:
    url = os.environ.get("AUTOTUNE_TEST_PG_URL")
    required = os.environ.get("AUTOTUNE_REQUIRE_POSTGRES") == "1"
    problem = "AUTOTUNE_TEST_PG_URL is not set (run `make postgres`)" if not url else None
    if url:
        import sqlalchemy

        try:
            with sqlalchemy.create_engine(url).connect():
                pass
        except Exception as err:  # any driver error means: no usable server
            problem = f"PostgreSQL at AUTOTUNE_TEST_PG_URL is not reachable ({type(err).__name__}); run `make postgres`"
    if problem:
        if required:
            pytest.fail(problem)
        pytest.skip(problem)
    assert url is not None
    return url


@pytest.fixture
def study_name(pg_url: str) -> Iterator[str]:
    name = f"mw-{uuid.uuid4().hex[:10]}"
    yield name
    with contextlib.suppress(KeyError):
        optuna.delete_study(study_name=name, storage=pg_url)


def _files(tmp_path: Path, workload: dict[str, Any]) -> tuple[Path, Path]:
    space, wl = tmp_path / "space.json", tmp_path / "wl.json"
    space.write_text(json.dumps(SPACE))
    wl.write_text(json.dumps(workload))
    return space, wl


def _tune(name: str, url: str, space: Path, wl: Path, results: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "autotune.cli", "tune", "--study", name, "--storage", url, "--engine", "sim",
        "--method", "search", "--space", str(space), "--workload", str(wl), "--results", str(results),
        "--heartbeat", "1", "--sim-speedup", "50", "--seed", "0", *extra,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "AUTOTUNE_SIM_SEED": "0"}


def _wait_for(check: Any, what: str, timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = check()
        except (KeyError, Exception):  # the study or its tables may not exist yet
            value = None
        if value:
            return value
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}")


def _counted(trials: list[FrozenTrial], stage: str) -> list[FrozenTrial]:
    replaced = superseded(trials)
    return [t for t in trials if t.user_attrs.get("stage") == stage and t.number not in replaced]


def test_two_workers_share_one_study(tmp_path: Path, pg_url: str, study_name: str) -> None:
    space, wl = _files(tmp_path, SMALL_WORKLOAD)
    first = subprocess.Popen(
        [*_tune(study_name, pg_url, space, wl, tmp_path / "a"), "--trials", "6", "--finalists", "1",
         "--validation-runs", "2"],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    _wait_for(lambda: optuna.load_study(study_name=study_name, storage=pg_url).user_attrs.get("config"), "the study")
    # The second box joins with `autotune worker`: everything but where it runs comes from the study.
    second = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "worker", "--study", study_name, "--storage", pg_url,
         "--results", str(tmp_path / "b"), "--heartbeat", "1", "--sim-speedup", "50"],
        env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out
    assert second.returncode == 0, second.stdout + second.stderr
    study = optuna.load_study(study_name=study_name, storage=pg_url)
    # Both workers can find the same place free at once: the trial asked later is withdrawn
    # before its engine starts, and nothing else may fail. A trial the twin screened never
    # launched either; it counts in the search's quota.
    every = study.get_trials()
    withdrawn = [t for t in every if t.user_attrs.get("outcome") == "withdrawn"]
    assert all(t.state == TrialState.FAIL and "engine_pgid" not in t.user_attrs for t in withdrawn)
    screened = [t for t in every if t.user_attrs.get("outcome") == "screened"]
    assert all(t.state == TrialState.PRUNED and "engine_pgid" not in t.user_attrs for t in screened)
    trials = [t for t in every if t not in withdrawn]
    launched = [t for t in trials if t not in screened]
    unfinished = [(t.number, t.state.name, t.user_attrs.get("outcome"), t.user_attrs.get("reason")) for t in launched
                  if t.state != TrialState.COMPLETE]  # fmt: skip
    assert not unfinished, unfinished
    assert [len(_counted(every, s)) for s in ("baseline", "noise", "search")] == [1, 1, 6]
    # Each validated config (the finalist, and the defaults beside it unless it is the defaults) runs twice.
    runs: dict[Any, int] = {}
    for t in _counted(every, "validation"):
        runs[t.user_attrs["validates"]] = runs.get(t.user_attrs["validates"], 0) + 1
    (finalist,) = [k for k in runs if k != "defaults"]
    assert set(runs.values()) == {2}
    assert ("defaults" in runs) == bool(study.trials[finalist].user_attrs["params"])
    assert len(trials) == 8 + sum(runs.values())
    # No configuration is measured twice, even by two workers asking at the same moment.
    searched = [tuple(sorted(t.params.items())) for t in _counted(launched, "search")]
    assert len(set(searched)) == len(searched), searched
    workers = {t.user_attrs["worker"] for t in launched}
    assert len(workers) == 2, "one worker did everything"
    assert study.user_attrs[LEASE_KEY]["done"]
    for t in launched:  # every launched trial says where its logs are
        assert Path(t.user_attrs["log_path"]).is_file() and t.user_attrs["host"]


def test_a_killed_workers_trial_is_failed_and_rerun_by_the_other(tmp_path: Path, pg_url: str, study_name: str) -> None:
    space, wl = _files(tmp_path, {**SMALL_WORKLOAD, "num_prompts": 300})
    # No early stop: which configuration the killed trial had depends on which worker asked
    # first, and a re-run cut against the incumbent would be PRUNED rather than COMPLETE.
    args = ["--trials", "4", "--finalists", "0", "--no-early-stop"]
    survivor = subprocess.Popen(
        [*_tune(study_name, pg_url, space, wl, tmp_path / "a"), *args, "--sim-speedup", "10"],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    _wait_for(
        lambda: (optuna.load_study(study_name=study_name, storage=pg_url).user_attrs.get(LEASE_KEY) or {}).get("done"),
        "the baseline",
    )
    victim = subprocess.Popen(
        [*_tune(study_name, pg_url, space, wl, tmp_path / "b"), *args, "--sim-speedup", "10"],
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def victim_trial() -> FrozenTrial | None:
        running = optuna.load_study(study_name=study_name, storage=pg_url).get_trials(states=(TrialState.RUNNING,))
        mine = [t for t in running if f":{victim.pid}:" in t.user_attrs.get("worker", "")]
        return next((t for t in mine if "engine_pgid" in t.user_attrs), None)

    killed = _wait_for(victim_trial, "a running trial of the second worker")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    out, _ = survivor.communicate(timeout=300)
    assert survivor.returncode == 0, out
    study = optuna.load_study(study_name=study_name, storage=pg_url)
    trials = study.get_trials()
    dead = next(t for t in trials if t.number == killed.number)
    assert dead.state == TrialState.FAIL and dead.user_attrs["outcome"] == "interrupted"
    retry = [t for t in trials if t.user_attrs.get("retry_of") == killed.number]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE
    assert retry[0].user_attrs["worker"].split(":")[1] == str(survivor.pid)
    assert retry[0].params == dead.params
    assert len(_counted(trials, "search")) == 4
    assert f"trial {killed.number} of worker" in out and "stopped beating" in out
    engine_group = int(killed.user_attrs["engine_pgid"])
    assert not any(
        (Path("/proc") / p.name / "stat").exists() and _pgid(p) == engine_group for p in Path("/proc").glob("[0-9]*")
    ), "the dead worker's engine is still running"


def _pgid(entry: Path) -> int | None:
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[2])
