"""The study's orchestrator: the slots, shared quotas and threads the method (``search/stages``)
runs through, on one slot or several per box, each on its own GPU group, and many boxes per study.

Every study runs here; a plain sequential one is one slot, run on the calling thread (so Ctrl-C
reaches the trial as it runs) with no GPU placement of its own. On one box, ``parallel`` slots
(threads) each run trials through the shared
:class:`~autotune.search.runner.StudyRun`; every trial holds a group of TP × PP × DP GPUs from
the :class:`~autotune.runtime.allocator.GpuAllocator` for as long as its engine lives, and its
engine sees only that group (``CUDA_VISIBLE_DEVICES``). Without GPUs, parallelism is bounded by
the CPU cores (an engine and the load generator per trial). Several boxes cooperate through the
study's storage (:mod:`autotune.search.coordination`).

The stages keep their order: the sequential ones (baseline, context, memory edge, graph coverage)
run one trial at a time on one worker, because each step depends on the one before, and the
other workers wait for them. The scenario search (or the plain search) and the validation re-runs
then use every slot of every worker. A quota is shared: a slot starts another trial only while
finished + running + about-to-start trials of that kind stay below it, so N slots do not
overshoot it by N − 1; across workers, the trial asked later withdraws (``_Gate``). Before
validation every worker waits until no search trial runs anywhere, so all workers pick the same
finalists. Validation runs round by round (the defaults and every finalist once, then again),
so each gain over the defaults is a paired comparison.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from autotune.config import CategoricalParam, IntParam
from autotune.engines.base import EngineAdapter
from autotune.errors import ConfigError
from autotune.runtime.allocator import AllocatorClosed, GpuAllocator
from autotune.runtime.gpu import default_backend, list_gpus
from autotune.search.coordination import Coordinator
from autotune.search.job import TuneJob
from autotune.search.objective import rate_bound_note
from autotune.search.progress import Progress
from autotune.search.runner import Placement, StudyRun, Withdrawn, await_start_records, worker_id
from autotune.search.stage import Stage
from autotune.search.stages import Dispatch, Task, run_method
from autotune.search.storage import superseded
from autotune.search.trial import TrialRunner
from autotune.search.weightcache import WeightCache

__all__ = ["Slots", "orchestrate", "plan_slots"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: CPU cores one trial keeps busy without a GPU: the engine and the load generator.
CORES_PER_CPU_TRIAL = 2
_POLL_S = 1.0
_GATE_POLL_S = 0.1  # a reservation ends once its trial is admitted: moments (at most START_RECORD_WAIT_S)


# ------------------------------------------------------------------------------ group sizes
def _value_range(param: Any) -> tuple[int, int] | None:
    if isinstance(param, IntParam):
        return param.low, param.high
    if isinstance(param, CategoricalParam):
        sizes = [int(c) for c in param.choices if isinstance(c, int) and not isinstance(c, bool)]
        return (min(sizes), max(sizes)) if sizes else None
    return None


def size_bounds(job: TuneJob, adapter: EngineAdapter) -> tuple[int, int]:
    """The smallest and largest GPU group any trial of the job can need."""
    fixed = adapter.to_flags({**job.engine.fixed_flags, **job.space.fixed})
    low = high = 1
    for knob, names in adapter.parallel_flags.items():
        searched = [
            r
            for name, p in job.space.params.items()
            if (r := _value_range(p)) and next(iter(adapter.to_flags({name: None}))) in names
        ]
        if searched:
            low, high = low * searched[0][0], high * searched[0][1]
        else:
            value = adapter.parallel_size(fixed, knob) or 1
            low, high = low * value, high * value
    return low, high


# ------------------------------------------------------------------------------ slots
@dataclass
class Slots:
    """How many trials run at once on this box, and where each one runs."""

    count: int
    placement: Placement
    allocator: GpuAllocator | None
    note: str


def _no_env(flags: dict[str, Any]) -> contextlib.AbstractContextManager[Mapping[str, str]]:
    return contextlib.nullcontext({})


def plan_slots(job: TuneJob, adapter: EngineAdapter) -> Slots:
    """Size the box: free GPUs (NVML, or ``AUTOTUNE_FAKE_GPUS``) and group sizes, else CPU cores.
    One trial at a time with no ``--gpus``: one slot, and the engine sees the GPUs it would
    see without autotune.

    Raises:
        ConfigError: ``--gpus`` without GPUs, or a group larger than the free GPUs.
    """
    wanted = job.study.parallel
    if wanted == 1 and job.study.gpus is None:
        return Slots(1, _no_env, None, "")
    backend = default_backend()
    if backend is None or not list_gpus(backend):
        if job.study.gpus is not None:
            raise ConfigError("--gpus was given but NVML finds no GPU on this machine; drop --gpus")
        cores = os.cpu_count() or 1
        bound = max(1, cores // CORES_PER_CPU_TRIAL)
        count = bound if wanted == "auto" else min(wanted, bound)
        note = (
            f"no GPU: {count} trial(s) at once, bounded by {cores} CPU core(s) "
            f"({CORES_PER_CPU_TRIAL} per trial: the engine and the load generator)"
        )
        return Slots(count, _no_env, None, note)
    allocator = GpuAllocator(backend, job.study.gpus)
    low, high = size_bounds(job, adapter)
    if high > len(allocator.pool):
        raise ConfigError(
            f"trials need up to {high} GPUs (TP × PP × DP) but {len(allocator.pool)} are free "
            f"({', '.join(map(str, allocator.pool))}); lower the parallel sizes or free GPUs"
        )
    fit = allocator.groups_at_once(low)
    count = fit if wanted == "auto" else min(wanted, fit)
    sizes = f"{low} GPU(s) per trial" if low == high else f"{low}–{high} GPUs per trial"
    note = f"{count} trial(s) at once on GPUs {','.join(map(str, allocator.pool))} ({sizes})"
    if wanted != "auto" and wanted > fit:
        note += f"; --parallel {wanted} capped: only {fit} group(s) fit"
    if allocator.skipped:
        note += "; skipped " + "; ".join(f"GPU {d} ({why})" for d, why in allocator.skipped.items())

    @contextlib.contextmanager
    def on_group(flags: dict[str, Any]) -> Iterator[Mapping[str, str]]:
        with allocator.lease(adapter.gpu_count(flags)) as group:
            yield group.env()

    return Slots(count, on_group, allocator, note)


# ------------------------------------------------------------------------------ progress
class _ThreadProgress:
    """Serialises the observer for several slots and labels phases with their trial."""

    def __init__(self, inner: Progress, on_started: Callable[[int], None], *, label: bool):
        self._inner, self._on_started, self._label = inner, on_started, label
        self._lock = threading.RLock()
        self._local = threading.local()

    def study_started(self, study: str, total: int, done: int) -> None:
        with self._lock:
            self._inner.study_started(study, total, done)

    def trial_started(self, number: int, stage: str, params: dict[str, Any]) -> None:
        self._local.number = number
        self._on_started(number)
        with self._lock:
            self._inner.trial_started(number, stage, params)

    def phase(self, name: str) -> None:
        number = getattr(self._local, "number", None) if self._label else None
        with self._lock:
            self._inner.phase(name if number is None else f"trial {number}: {name}")

    def bench_progress(self, completed: int, total: int, output_tps: float) -> None:
        with self._lock:
            self._inner.bench_progress(completed, total, output_tps)

    def trial_finished(self, summary: dict[str, Any]) -> None:
        with self._lock:
            self._inner.trial_finished(summary)

    def message(self, text: str) -> None:
        with self._lock:
            self._inner.message(text)


# ------------------------------------------------------------------------------ shared quotas
class _Gate:
    """Counts a task's trials: finished (not replaced by a retry) + running anywhere + reserved
    by a slot of this worker whose trial is not in the storage yet.

    Reservations are this worker's alone: two workers can both see a free place and ask at the
    same moment. The storage numbers trials in the order they were asked, so :meth:`admitted`
    lets the first ones run and the later one is withdrawn before its engine starts."""

    def __init__(self, study: optuna.Study):
        self.study = study
        self._lock = threading.Lock()
        self._pending: dict[int, Task] = {}  # thread id → the task it reserved a trial of

    def count(self, match: Callable[[FrozenTrial], bool], below: int | None = None) -> int:
        """Counted trials of a task (only those numbered below ``below``, when given)."""
        trials = self.study.get_trials(deepcopy=False)
        replaced = superseded(trials)
        return sum(
            1
            for t in trials
            if (below is None or t.number < below)
            and match(t)
            and (t.state == TrialState.RUNNING or (t.state.is_finished() and t.number not in replaced))
        )

    def running(self, match: Callable[[FrozenTrial], bool]) -> int:
        return sum(1 for t in self.study.get_trials(deepcopy=False) if match(t) and t.state == TrialState.RUNNING)

    def reserve(self, task: Task) -> int | None:
        """Reserve a trial of ``task`` for this thread; returns how many there were, or None when full.

        A slot's trial is in the storage (counted there) a little before its reservation ends, so
        a place can look taken twice; while another slot holds a reservation of the same task,
        a full count is waited out instead of believed (believing it ends this slot early and
        runs the rest of the stage on fewer slots)."""
        me = threading.get_ident()
        while True:
            with self._lock:
                others = sum(1 for thread, pending in self._pending.items() if thread != me and pending.key == task.key)
                have = self.count(task.match) + others
                if have < task.quota:
                    self._pending[me] = task
                    return have
                if not others:
                    return None
            time.sleep(_GATE_POLL_S)

    def admitted(self, number: int) -> bool:
        """Whether this thread's trial ``number``, its start record stored, is within its task's
        quota counting only trials asked before it (a thread with no reservation: always)."""
        with self._lock:
            task = self._pending.get(threading.get_ident())
        if task is None:
            return True
        await_start_records(self.study, number)
        return self.count(task.match, below=number) < task.quota

    def visible(self) -> None:
        """This thread's trial is in the storage now (or never will be)."""
        with self._lock:
            self._pending.pop(threading.get_ident(), None)


# ------------------------------------------------------------------------------ the worker
class _Worker:
    """This worker's slots, quota gate and cooperation with the study's other workers — the
    :class:`~autotune.search.stages.Dispatch` the stages run through — and the
    :class:`StudyRun` built on them."""

    def __init__(
        self,
        job: TuneJob,
        adapter: EngineAdapter,
        study: optuna.Study,
        progress: Progress,
        slots: Slots,
        *,
        shared: bool,
        trial_runner: TrialRunner | None,
    ):
        self.slots = slots
        worker = worker_id()
        self.gate = _Gate(study)
        # Several slots: each phase line names its trial, and each trial's resources come from its slot.
        self.progress = _ThreadProgress(progress, self._trial_visible, label=slots.count > 1)
        self.coord = Coordinator(study, worker, self.progress, shared=shared, heartbeat_s=job.study.heartbeat_s)
        self.weights = WeightCache(
            job.study.weight_cache, adapter, study, job.dir, self.progress, why_not=_no_daemon(slots)
        )
        self.run = StudyRun(
            job,
            adapter,
            study,
            self.progress,
            trial_runner=trial_runner,
            worker=worker,
            placement=slots.placement,
            admit=self.gate.admitted,
            claim_retry=self.coord.claim_retry,
            weights=self.weights,
        )
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []

    def _trial_visible(self, number: int) -> None:
        self.gate.visible()
        self.coord.beat_trial(number)

    # -- the Dispatch the stages run through
    @property
    def leads(self) -> bool:
        return self.coord.led

    def sequential(self, body: Callable[[], T]) -> T:
        return self.coord.sequential(body)

    def fill(self, tasks: list[Task]) -> None:
        """Run the tasks' trials on every slot until each quota is met and nothing of them runs
        anywhere (other workers' trials included)."""
        while not self.stopping.is_set():
            self._on_slots(lambda: self._slot(tasks))
            self._settle(tasks)
            done = all(self.gate.count(t.match) >= t.quota or t.stalled() for t in tasks)
            if done or self.run.out_of_time():
                return

    # -- filling quotas on every slot
    def _slot(self, tasks: list[Task]) -> None:
        run = self.run
        while not self.stopping.is_set() and not run.out_of_time():
            run.retry_failed()
            live = [task for task in tasks if not task.stalled()]
            reserved = next(((task, have) for task in live if (have := self.gate.reserve(task)) is not None), None)
            if reserved is None:
                return
            task, have = reserved
            try:
                task.start(have == 0)
            except Withdrawn:
                continue  # another worker's trial took the place: look again
            except (UpdateFinishedTrialError, AllocatorClosed):
                if self.stopping.is_set():
                    return
                # Another worker failed this trial after missed heartbeats; it re-runs it.
                run.progress.message("a trial of this worker was failed by another worker (missed heartbeats)")
            finally:
                self.gate.visible()

    def _settle(self, tasks: list[Task]) -> None:
        """Wait until no trial of the tasks runs anywhere, re-running failures this worker owns."""
        told = False
        while not self.stopping.is_set():
            self.run.retry_failed()
            running = sum(self.gate.running(t.match) for t in tasks)
            if not running:
                return
            if not told:
                self.progress.message(f"waiting for {running} trial(s) of other workers to finish")
                told = True
            time.sleep(_POLL_S)

    def _on_slots(self, body: Callable[[], None]) -> None:
        """Run ``body`` on every slot (thread) and wait; the first error stops them all. One
        slot runs on this thread: an interrupt then reaches the trial where it runs."""
        if self.slots.count == 1:
            body()
            return

        def guarded() -> None:
            try:
                body()
            except BaseException as err:
                self._errors.append(err)

        self._threads = [
            threading.Thread(target=guarded, name=f"autotune-slot-{i}", daemon=True) for i in range(self.slots.count)
        ]
        for thread in self._threads:
            thread.start()
        # join() in short steps: the main thread must stay responsive to Ctrl-C.
        while any(t.is_alive() for t in self._threads) and not self._errors:
            for thread in self._threads:
                thread.join(timeout=0.2)
        if self._errors:
            self.abort()
            raise self._errors[0]

    def abort(self) -> None:
        """Stop every slot now: no new trials, waiting ones released, running ones failed as
        interrupted and their engines ended (a resume re-runs them)."""
        self.stopping.set()
        if self.slots.allocator is not None:
            self.slots.allocator.close()
        self.coord.abandon_running()
        deadline = time.monotonic() + 30
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def orchestrate(
    job: TuneJob,
    adapter: EngineAdapter,
    study: optuna.Study,
    progress: Progress,
    *,
    trial_runner: TrialRunner | None = None,
    method: Callable[[StudyRun, Dispatch], None] = run_method,
) -> None:
    """Run ``job``'s method (``method``: the tuning method by default) on every slot of this box,
    cooperating with any other worker of the study; ``trial_runner`` runs one configuration
    (default: a real launch, ``run_trial``)."""
    slots = plan_slots(job, adapter)
    shared = not job.storage_url.startswith("sqlite")
    if shared:
        # Workers started with the same --seed would draw the same random start-up points.
        study.sampler.reseed_rng()
    worker = _Worker(job, adapter, study, progress, slots, shared=shared, trial_runner=trial_runner)
    worker.progress.study_started(job.study.name, job.study.trials, len(worker.run.finished(Stage.SEARCH)))
    if note := rate_bound_note(job.workload):
        worker.progress.message(note)
    if slots.note:
        worker.progress.message(slots.note)
    try:
        with worker.coord, worker.weights:
            method(worker.run, worker)
    except BaseException:
        worker.abort()
        raise
    finally:
        if slots.allocator is not None:
            slots.allocator.close()


def _no_daemon(slots: Slots) -> str | None:
    """Why this box's slots rule out one weight-cache daemon for the study: its weights sit on
    one GPU group, and trials that run at once or on groups the allocator picks may not share it."""
    if slots.count > 1 or slots.allocator is not None:
        return "trials run on several GPU groups (--parallel/--gpus); a daemon serves one group"
    return None
