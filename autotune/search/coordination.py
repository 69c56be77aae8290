"""Several workers on one study: who runs what, and what happens when one of them dies.

Workers — ``autotune tune`` or ``autotune worker`` processes on one box or many — share nothing
but the Optuna storage, which is Optuna's own distributed mode. Through it they:

- **beat**: every ``heartbeat_s`` each worker records a heartbeat for its running trials
  (Optuna beats by itself only inside ``study.optimize``; autotune asks and tells);
- **fail a dead worker's trials**: a running trial whose last beat is older than the grace period
  (3 beats) is failed by whichever worker sees it first. Failing is an atomic RUNNING → FAIL
  change, so exactly one worker succeeds; it adopts the trial — reaps its engine when it ran on
  the same host — and re-runs it (the retry records ``retry_of``);
- **lease the sequential stages** (baseline, context, memory edge, graph coverage — each needs
  the one before): one worker runs them while the others wait, then all of them search. The
  lease is a study attribute: written, then read back after a settle time (the last writer
  wins), renewed with every beat, and taken over when it has not moved for the grace period.
  Staleness is judged on the reader's own clock, so clocks of different boxes need not agree.

A failed trial is re-run by one worker only: the worker that ran it, the one that adopted it,
or — for a sequential stage — the lease holder. A lone worker on SQLite (``shared=False``)
owns everything and needs no beats or lease.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from autotune.runtime.reaper import reap_process_groups
from autotune.search.progress import Progress
from autotune.search.record import lease, set_lease, trial_record, trial_records
from autotune.search.stage import Stage
from autotune.search.storage import GRACE_BEATS

__all__ = ["LEASE_KEY", "SEQUENTIAL_STAGES", "Coordinator"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Optuna warns on every ask() when the storage has a heartbeat, expecting study.optimize to beat;
# this module beats for ask/tell trials itself.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used", category=UserWarning)

#: Stages whose trials depend on the one before; one worker runs them.
SEQUENTIAL_STAGES = frozenset({Stage.BASELINE, Stage.CONTEXT, Stage.MEMORY_EDGE, Stage.CUDA_GRAPH})
#: Study attribute holding the sequential-stage lease: {"worker", "host", "seq"} or {"done": True}.
LEASE_KEY = "lease.sequential"
#: Time between writing the lease and reading it back: longer than a storage round trip, so
#: two workers that wrote at about the same time both see the same (last) writer.
SETTLE_S = 1.0


class Coordinator:
    """One worker's side of the cooperation; its :meth:`claim_retry` is what the worker's
    :class:`~autotune.search.runner.StudyRun` asks before it re-runs a failed trial.

    Args:
        study: The study the workers share.
        worker: This worker's id (``runner.worker_id``), as its trials record it.
        progress: Where the waits and adoptions are said.
        shared: Whether other workers may share the study (an RDB storage other than SQLite).
        heartbeat_s: Seconds between beats; the grace period is three beats.
        on_adopt: Called with each trial this worker failed for a dead worker (tests, messages).
    """

    def __init__(
        self,
        study: optuna.Study,
        worker: str,
        progress: Progress,
        *,
        shared: bool,
        heartbeat_s: int,
        on_adopt: Callable[[FrozenTrial], None] | None = None,
    ):
        self.study, self.worker, self.progress = study, worker, progress
        self.shared, self.heartbeat_s = shared, heartbeat_s
        self.grace_s = GRACE_BEATS * heartbeat_s
        self.host = socket.gethostname()
        self.adopted: set[int] = set()
        self.led = not shared  # whether this worker ran the sequential stages
        self._on_adopt = on_adopt
        self._leading = not shared
        self._seq = 0
        self._lease_seen: tuple[Any, Any] | None = None
        self._lease_seen_at = 0.0
        self._claimed: set[int] = set()
        self._lock = threading.Lock()
        self._lease_lock = threading.Lock()  # a renewal must never overwrite "done"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Coordinator:
        if self.shared:
            self.fail_dead_here()
            self.fail_stale()
            self._thread = threading.Thread(target=self._beat_loop, name="autotune-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s + 5)

    # ------------------------------------------------------------------ retries
    def claim_retry(self, trial: FrozenTrial) -> bool:
        """Whether this worker (and this thread, first) re-runs the failed ``trial``."""
        with self._lock:
            if trial.number in self._claimed:
                return False
            if self.shared and not self._owns(trial):
                return False
            self._claimed.add(trial.number)
            return True

    def _owns(self, trial: FrozenTrial) -> bool:
        r = trial_record(trial)
        if r.stage in SEQUENTIAL_STAGES:
            return self._leading
        return r.worker == self.worker or trial.number in self.adopted

    # ------------------------------------------------------------------ heartbeats
    def _beat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.beat()
            except Exception as err:  # a storage hiccup must not end the run; the next beat retries
                log.warning("heartbeat failed: %s", err)

    def _storage(self) -> Any:
        """The study's storage as a heartbeat store (RDBStorage, behind Optuna's cache)."""
        return self.study._storage

    def beat(self) -> None:
        """One round: beat for this worker's running trials, renew the lease, fail stale trials."""
        storage = self._storage()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if trial_record(t).worker == self.worker:
                storage.record_heartbeat(t._trial_id)
        if self.shared:
            self._renew()
        self.fail_stale()

    def beat_trial(self, number: int) -> None:
        """Beat for a trial at once (called when it starts), so it can be found stale even if
        this worker dies before the next round."""
        if not self.shared:
            return
        study = self.study
        storage = self._storage()
        storage.record_heartbeat(storage.get_trial_id_from_study_id_trial_number(study._study_id, number))

    def fail_stale(self) -> list[FrozenTrial]:
        """Fail running trials whose worker stopped beating; adopt the ones this call failed."""
        study = self.study
        storage = self._storage()
        if not self.shared or getattr(storage, "get_heartbeat_interval", lambda: None)() is None:
            return []
        return self._fail_and_adopt(storage._get_stale_trial_ids(study._study_id))

    def fail_dead_here(self) -> list[FrozenTrial]:
        """Fail at once the running trials of workers on this host whose process is gone (this
        box's tuner was killed and restarted): no need to wait out their heartbeats."""
        dead = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            host, _, rest = trial_record(t).worker.partition(":")
            pid = rest.partition(":")[0]
            if host == self.host and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                dead.append(t._trial_id)
        return self._fail_and_adopt(dead)

    def _fail_and_adopt(self, trial_ids: list[int]) -> list[FrozenTrial]:
        storage = self._storage()
        adopted: list[FrozenTrial] = []
        for trial_id in trial_ids:
            try:
                # The reason goes first: Optuna allows no attribute on a finished trial.
                storage.set_trial_user_attr(trial_id, "outcome", "interrupted")
                if storage.set_trial_state_values(trial_id, TrialState.FAIL):
                    adopted.append(storage.get_trial(trial_id))
            except UpdateFinishedTrialError:
                continue  # its worker finished it after all, or another worker failed it first
        for trial in adopted:
            self._adopt(trial)
        return adopted

    def _adopt(self, trial: FrozenTrial) -> None:
        """Take over a failed trial of another worker: end its engine here, re-run it later."""
        with self._lock:
            self.adopted.add(trial.number)
        r = trial_record(trial)
        reaped = []
        if r.engine_pgid is not None and r.host == self.host:
            reaped = reap_process_groups([int(r.engine_pgid)])
        self.progress.message(
            f"trial {trial.number} of worker {r.worker or '?'} stopped beating: failed here"
            + (", its engine reaped" if reaped else "")
            + "; it will be re-run"
        )
        if self._on_adopt is not None:
            self._on_adopt(trial)

    def abandon_running(self) -> list[FrozenTrial]:
        """Fail this worker's running trials as interrupted and end their engines (Ctrl-C, or a
        bug in one thread): the study stays consistent and a resume re-runs them."""
        storage = self.study._storage
        mine = [
            t
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if trial_record(t).worker == self.worker
        ]
        for t in mine:
            try:
                storage.set_trial_user_attr(t._trial_id, "outcome", "interrupted")
                storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            except UpdateFinishedTrialError:
                continue
        reap_process_groups(r.engine_pgid for r in trial_records(mine) if r.engine_pgid is not None)
        return mine

    # ------------------------------------------------------------------ the sequential lease
    def sequential(self, body: Callable[[], T], *, poll_s: float | None = None) -> T:
        """Run ``body`` (the sequential stages) on one worker while the others wait for it to be
        done; then every waiting worker runs ``body`` too, which only reads the stored decisions."""
        if not self.shared:
            return body()
        poll = poll_s if poll_s is not None else min(2.0, float(self.heartbeat_s))
        told = False
        while not self._lease_done():
            if self._try_lead():
                try:
                    result = body()
                except BaseException:
                    with self._lease_lock:
                        self._leading = False  # the lease runs out; another worker takes over
                    raise
                with self._lease_lock:
                    self._leading = False
                    set_lease(self.study, LEASE_KEY, {"done": True, "worker": self.worker})
                return result
            if not told:
                holder = lease(self.study, LEASE_KEY).get("worker", "?")
                self.progress.message(f"waiting: worker {holder} runs the sequential stages")
                told = True
            time.sleep(poll)
        return body()

    def _lease_done(self) -> bool:
        return bool(lease(self.study, LEASE_KEY).get("done"))

    def _try_lead(self) -> bool:
        study = self.study
        current = lease(study, LEASE_KEY)
        if current and current.get("worker") != self.worker and not self._expired(current):
            return False
        set_lease(study, LEASE_KEY, {"worker": self.worker, "host": self.host, "seq": 0})
        time.sleep(SETTLE_S)
        won = lease(study, LEASE_KEY).get("worker") == self.worker
        self._leading = self.led = won
        self._seq = 0
        return won

    def _expired(self, lease: dict[str, Any]) -> bool:
        """Whether the holder stopped renewing: the (worker, seq) pair has not changed for the
        grace period, measured on this worker's clock from when it first saw the pair."""
        seen = (lease.get("worker"), lease.get("seq"))
        now = time.monotonic()
        if seen != self._lease_seen:
            self._lease_seen, self._lease_seen_at = seen, now
            return False
        return now - self._lease_seen_at > self.grace_s

    def _renew(self) -> None:
        study = self.study
        with self._lease_lock:
            current = lease(study, LEASE_KEY)
            if not self._leading or current.get("done"):
                return
            if current.get("worker") != self.worker:
                self._leading = False
                log.warning("the sequential-stage lease was taken over by %s", current.get("worker"))
                return
            self._seq += 1
            set_lease(study, LEASE_KEY, {"worker": self.worker, "host": self.host, "seq": self._seq})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True
