"""Workers sharing a study: who re-runs a failed trial, the sequential-stage lease (one holder,
taken over when it stops moving), and trials of a dead tuner on this host failed at once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.search.coordination import LEASE_KEY, Coordinator
from autotune.search.progress import NullProgress


@pytest.fixture
def study(tmp_path: Path) -> optuna.Study:
    return optuna.create_study(study_name="c", storage=f"sqlite:///{tmp_path / 'c.db'}")


def _failed(study: optuna.Study, stage: str, worker: str) -> optuna.trial.FrozenTrial:
    trial = study.ask()
    trial.set_user_attr("stage", stage)
    trial.set_user_attr("worker", worker)
    study.tell(trial, state=TrialState.FAIL)
    return study.trials[-1]


def test_a_lone_worker_retries_everything_once(study: optuna.Study) -> None:
    coord = Coordinator(study, "me", NullProgress(), shared=False, heartbeat_s=1)
    failed = _failed(study, "search", "someone-before-me")
    assert coord.claim_retry(failed) is True
    assert coord.claim_retry(failed) is False  # a second slot does not re-run it too


def test_shared_workers_retry_their_own_adopted_or_led_trials(study: optuna.Study) -> None:
    coord = Coordinator(study, "me", NullProgress(), shared=True, heartbeat_s=1)
    mine, theirs = _failed(study, "search", "me"), _failed(study, "search", "them")
    probe = _failed(study, "memory_edge", "them")
    assert coord.claim_retry(mine) is True
    assert coord.claim_retry(theirs) is False
    coord.adopted.add(theirs.number)
    assert coord.claim_retry(theirs) is True
    assert coord.claim_retry(probe) is False  # a sequential stage: only the lease holder
    coord._leading = True
    assert coord.claim_retry(probe) is True


class _Waiting(NullProgress):
    """Sets ``seen`` when its worker says it waits for another one's sequential stages."""

    def __init__(self) -> None:
        self.seen = threading.Event()

    def message(self, text: str) -> None:
        if text.startswith("waiting: worker"):
            self.seen.set()


def test_one_worker_leads_the_sequential_stages_the_others_wait(study: optuna.Study) -> None:
    log: list[tuple[str, bool]] = []
    waiting = _Waiting()
    coords = [Coordinator(study, f"w{i}", waiting, shared=True, heartbeat_s=1) for i in range(2)]

    def work(coord: Coordinator) -> None:
        def body() -> str:
            log.append((coord.worker, bool((study.user_attrs.get(LEASE_KEY) or {}).get("done"))))
            if not (study.user_attrs.get(LEASE_KEY) or {}).get("done"):
                # The leader holds the stages until the other worker has seen the lease taken.
                assert waiting.seen.wait(30), "the other worker never waited for the lease"
            return "fixed"

        assert coord.sequential(body, poll_s=0.1) == "fixed"

    threads = [threading.Thread(target=work, args=(c,)) for c in coords]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    leaders = [c for c in coords if c.led]
    assert len(leaders) == 1
    # The leader ran the stages before they were done; the other only read them afterwards.
    assert log[0] == (leaders[0].worker, False)
    assert log[1][1] is True
    assert study.user_attrs[LEASE_KEY]["done"]


def test_a_lease_that_stops_moving_is_taken_over(study: optuna.Study) -> None:
    study.set_user_attr(LEASE_KEY, {"worker": "dead:1:x", "host": "dead", "seq": 7})
    coord = Coordinator(study, "me", NullProgress(), shared=True, heartbeat_s=1)
    t0 = time.monotonic()
    assert coord.sequential(lambda: "ran", poll_s=0.1) == "ran"
    assert coord.led and time.monotonic() - t0 >= 3  # the grace period: three beats


@pytest.mark.sim
def test_running_trials_of_a_dead_tuner_on_this_host_are_failed_at_once(study: optuna.Study) -> None:
    host = socket.gethostname()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    owners = {
        "dead": f"{host}:{dead_pid}:aaaaaa",
        "alive": f"{host}:{os.getppid()}:bbbbbb",
        "elsewhere": f"other-host:{dead_pid}:cccccc",
    }
    for name, worker in owners.items():
        trial = study.ask()
        trial.set_user_attr("stage", "search")
        trial.set_user_attr("worker", worker)
        trial.set_user_attr("name", name)
    coord = Coordinator(study, f"{host}:{os.getpid()}:me", NullProgress(), shared=True, heartbeat_s=1)
    adopted = coord.fail_dead_here()
    assert [t.user_attrs["name"] for t in adopted] == ["dead"]
    states = {t.user_attrs["name"]: t.state for t in study.trials}
    assert states == {"dead": TrialState.FAIL, "alive": TrialState.RUNNING, "elsewhere": TrialState.RUNNING}
    assert study.trials[0].user_attrs["outcome"] == "interrupted"
    assert coord.adopted == {adopted[0].number}
