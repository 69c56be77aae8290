"""A study being run: one trial at a time through Optuna, with its bookkeeping.

Stages (baseline, memory edge, graph coverage, scenario search, validation) are written on top
of :meth:`StudyRun.run`, which accepts explicit parameters (chosen by the methodology, or a
repeat), a sub-space to sample, and a workload override (the memory probe's peak shape).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, NoReturn

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.bench.earlystop import CANNOT_WIN
from autotune.config import SearchSpace, Workload, as_given
from autotune.engines.base import EngineAdapter
from autotune.engines.rootcause import UNTUNED_KINDS
from autotune.errors import EngineFailsRegardless
from autotune.outcomes import Outcome
from autotune.runtime.cpuset import plan_partition
from autotune.runtime.gpu import wait_pids_released
from autotune.search.diagnosis import WHERE
from autotune.search.job import TuneJob
from autotune.search.noise import StudyNoise, expected_best_of, runs_by_configuration, study_noise
from autotune.search.novelty import config_key, measured, screened, unmeasured_point
from autotune.search.progress import Progress
from autotune.search.record import (
    INTERRUPTED,
    SCREENED,
    WITHDRAWN,
    StageState,
    set_stage_state,
    set_stopped,
    stage_state,
    trial_record,
    trial_records,
    write_trial,
)
from autotune.search.space import distribution, finite_points, fits, suggest, suggest_param
from autotune.search.stage import Stage
from autotune.search.storage import best_trial, primary_value, superseded
from autotune.search.trial import RANKED_STAGES, TrialResult, TrialRunner, TrialSpec, early_stop_policy, run_trial
from autotune.search.twin import PREDICTED, Pending, Twin
from autotune.search.weightcache import WeightCache

__all__ = ["Placement", "Screened", "StudyRun", "Withdrawn", "redact_env", "worker_id"]

#: Where a trial runs: given its engine flags, a context that holds the resources (a GPU group)
#: for the trial and yields the environment that confines the engine to them.
Placement = Callable[[dict[str, Any]], AbstractContextManager[Mapping[str, str]]]

RELEASE_TIMEOUT_S = 120.0
#: How long a new trial waits for the start records of trials asked just before it.
START_RECORD_WAIT_S = 10.0
# Environment names that hold secrets: recorded as a reference to the variable, never by value.
_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (f"${{{k}}}" if _SECRET.search(k) else v) for k, v in env.items()}


def worker_id() -> str:
    """This tuner process among all that share a study: host, PID, and a nonce (PIDs repeat
    across restarts and containers)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def await_start_records(study: optuna.Study, number: int) -> None:
    """Wait (briefly) until every running trial asked before ``number`` has its start record,
    so what it runs is known. A worker writes it right after asking; one that died in
    between has its trial failed by the heartbeat, and is not waited for long."""
    deadline = time.monotonic() + START_RECORD_WAIT_S
    while time.monotonic() < deadline:
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if all(trial_record(t).started for t in running if t.number < number):
            return
        time.sleep(0.05)


def _anywhere(flags: dict[str, Any]) -> AbstractContextManager[Mapping[str, str]]:
    return contextlib.nullcontext({})


class Withdrawn(Exception):
    """A trial given back before its engine started: a trial asked before it filled its quota or
    measures the same configuration (``StudyRun._gives_way``)."""


class Screened(Withdrawn):
    """A search trial the twin ruled out before its engine started (``StudyRun._screen``): it
    counts toward its stage's quota, as a trial that cost no engine time."""


def _deterministic_failure(t: FrozenTrial) -> tuple[str, str] | None:
    """(root-cause signature, where it failed) of a failure the engine's log explained and no tuned
    knob points to, else None."""
    facts = trial_record(t).facts
    cause = facts.get("root_cause")
    if not cause or facts.get("transient", True) or "failed_at" not in facts or cause["kind"] not in UNTUNED_KINDS:
        return None
    return str(cause["signature"]), str(facts["failed_at"])


class StudyRun:
    """Trial plumbing shared by every stage.

    :meth:`run` may be called from several threads at once (``autotune.search.parallel``): the
    ask-and-sample step is serialised. What a run needs from the box and the other workers it is
    given when it is built, by the orchestrator that owns them.

    Args:
        trial_runner: What runs one configuration and classifies it: a real launch
            (``run_trial``, looked up when the run is built), or in the search-efficiency
            benchmark a model.
        worker: This tuner process among the study's workers (``worker_id``).
        placement: Gives each trial its own resources (a GPU group) for as long as its engine lives.
        admit: Called with a trial's number once its start record is stored; False withdraws
            it (its quota was filled by trials asked before it).
        claim_retry: Whether this worker (and thread) re-runs a failed trial.
        weights: The study's weight-cache daemon, while the orchestrator holds one.
    """

    def __init__(
        self,
        job: TuneJob,
        adapter: EngineAdapter,
        study: optuna.Study,
        progress: Progress,
        *,
        trial_runner: TrialRunner | None = None,
        worker: str | None = None,
        placement: Placement | None = None,
        admit: Callable[[int], bool] | None = None,
        claim_retry: Callable[[FrozenTrial], bool] | None = None,
        weights: WeightCache | None = None,
    ):
        self.job, self.adapter, self.study, self.progress = job, adapter, study, progress
        self.trial_runner: TrialRunner = trial_runner or run_trial
        self.deadline = time.monotonic() + job.study.time_budget_s if job.study.time_budget_s else None
        self.worker = worker or worker_id()
        self.placement: Placement = placement or _anywhere
        self.admit: Callable[[int], bool] = admit or (lambda number: True)
        self.claim_retry: Callable[[FrozenTrial], bool] = claim_retry or (lambda trial: True)
        self.weights = weights
        fixed = {**job.engine.fixed_flags, **job.space.fixed}
        self.twin = Twin(job.workload, fixed) if job.study.twin else None
        # The twin answers on a thread of its own while the engine starts: its prediction uses
        # only the runs recorded before the launch, and costs the trial no time.
        self._twin_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="twin") if self.twin else None
        # An enqueued trial is popped by whichever ask() comes next, and the sampler sees a
        # running trial only once its params are suggested: ask and sample one trial at a time.
        self._ask_lock = threading.Lock()
        self.noise_lock = threading.Lock()  # one slot launches the noise runs (stages.context.measure_noise)
        # A CPU engine would take the load generator's cores: split them (runtime/cpuset.py).
        self.cpus = plan_partition() if job.study.partition_cpus and adapter.runs_on_cpu() else None
        if self.cpus is not None:
            progress.message(self.cpus.describe())
        elif adapter.runs_on_cpu():
            progress.message("CPU engine sharing its cores with the load generator: expect noisier runs")

    # -- bookkeeping
    def trials(self, stage: str | None = None) -> list[FrozenTrial]:
        ts = self.study.get_trials(deepcopy=False)
        return [t for t in ts if stage is None or trial_record(t).stage == stage]

    def finished(self, stage: str | None = None) -> list[FrozenTrial]:
        """Trials that count toward a stage's quota (every stage's when None): finished and not
        superseded by a retry."""
        replaced = superseded(self.trials())
        return [t for t in self.trials(stage) if t.state.is_finished() and t.number not in replaced]

    def engine_version(self) -> str | None:
        """The engine's version as its first logged trial said it (None before any)."""
        for r in trial_records(self.trials()):
            if v := r.facts.get("engine_version"):
                return str(v)
        return None

    def _weight_client(self, flags: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """What maps this trial's weights from the study's weight-cache daemon (nothing: it loads them)."""
        return self.weights.client(flags, self.engine_version()) if self.weights else ({}, {})

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def stage_state(self, name: str) -> StageState | None:
        return stage_state(self.study, name)

    def set_stage_state(self, name: str, state: StageState) -> None:
        set_stage_state(self.study, name, state)

    # -- one trial through Optuna
    def run(
        self,
        stage: str,
        *,
        explicit: Mapping[str, Any] | None = None,
        sample: SearchSpace | None = None,
        workload: Workload | None = None,
        extra: Mapping[str, Any] | None = None,
        hint: Mapping[str, Any] | None = None,
    ) -> TrialResult:
        """One trial with ``explicit`` params plus a sample of ``sample`` (neither: the engine's
        defaults). Explicit values inside the space are enqueued, so the sampler sees them;
        ``hint`` gives values to try for some sampled params (a warm start)."""
        explicit = dict(explicit or {})
        space = self.job.space.params
        recorded = {k: v for k, v in explicit.items() if k in space and fits(distribution(space[k]), v)}
        hinted = {k: v for k, v in (hint or {}).items() if sample and k in sample.params}
        repeat = False  # a sampled trial that may measure a configuration again
        with self._ask_lock:
            trial, params = self._ask(explicit, recorded, hinted, sample)
            if sample is not None:
                trial, params, repeat = self._unmeasured(trial, stage, params, explicit, recorded, sample)
        asked = None  # the twin's answer, when screening already asked it
        if sample is not None and workload is None and stage in RANKED_STAGES:
            asked = self._screen(trial, stage, params)
        extra = dict(extra or {})
        if workload is not None:
            extra["workload_override"] = workload.model_dump(mode="json")
        return self._execute(
            trial,
            stage,
            params,
            workload or self.job.workload,
            extra,
            probe=workload is not None,
            new_only=sample is not None and not repeat,
            asked=asked,
        )

    def _ask(
        self, explicit: dict[str, Any], recorded: dict[str, Any], hinted: dict[str, Any], sample: SearchSpace | None
    ) -> tuple[optuna.Trial, dict[str, Any]]:
        """A new trial and its params: ``explicit``, with a sample of ``sample`` (``hinted``
        values first). The explicit values inside the space are enqueued, so the sampler sees them."""
        if recorded or hinted:
            self.study.enqueue_trial({**hinted, **recorded}, skip_if_exists=False)
        trial = self.study.ask()
        for name in recorded:
            suggest_param(trial, name, self.job.space.params[name])  # the enqueued value, now recorded
        return trial, {**explicit, **(suggest(trial, sample) if sample else {})}

    def _unmeasured(
        self,
        trial: optuna.Trial,
        stage: str,
        params: dict[str, Any],
        explicit: dict[str, Any],
        recorded: dict[str, Any],
        sample: SearchSpace,
    ) -> tuple[optuna.Trial, dict[str, Any], bool]:
        """The sampled trial to run, its params, and whether it repeats a measured configuration:
        ``trial``, unless it proposes a configuration the study measured already; that one is
        withdrawn and an unmeasured random point of ``sample`` runs instead, or — in a used-up
        space — the repeat runs (:mod:`autotune.search.novelty`)."""
        trials = self.trials()
        seen = measured(trials)
        earlier = seen.get(config_key(self.flags(params)))
        if earlier is None:
            return trial, params, False
        seed = None if self.job.study.seed is None else self.job.study.seed * 100_003 + trial.number
        ruled_out = screened(trial_records(trials))  # a random draw never runs what the twin ruled out
        known = set(seen) | ruled_out
        point = unmeasured_point(
            sample, lambda values: config_key(self.flags({**explicit, **values})) not in known, self.study, seed
        )
        if point is None:
            if finite_points(sample) is not None:
                self.end_used_up(trial, stage, params, ruled_out=bool(ruled_out))
            self.progress.message(f"trial {trial.number} repeats trial {earlier}: every point drawn was measured")
            return trial, params, True
        self._withdraw(trial, f"trial {earlier} measured the configuration it proposed", stage=stage, params=params)
        replacement, params = self._ask(explicit, recorded, point, sample)
        self.progress.message(
            f"the sampler proposed trial {earlier}'s configuration again: trial {replacement.number} "
            "tries an unmeasured point instead"
        )
        return replacement, params, False

    def end_used_up(self, trial: optuna.Trial, stage: str, params: dict[str, Any], ruled_out: bool = False) -> NoReturn:
        """End ``stage``: every configuration of its space was measured (or, ``ruled_out``,
        screened by the twin), so ``trial`` (which proposed one of them again) is withdrawn and
        the stage is recorded as stalled."""
        why = f"every configuration of the {stage} space was measured" + (" or screened" if ruled_out else "")
        state = self.stage_state(stage) or StageState()
        self.set_stage_state(stage, dataclasses.replace(state, done=True, stalled=why))
        self.progress.message(f"{why}: the {stage} stage ends here")
        raise Withdrawn(self._withdraw(trial, why, stage=stage, params=params))

    def _screen(self, trial: optuna.Trial, stage: str, params: dict[str, Any]) -> Pending | None:
        """Record ``trial`` as screened and raise :class:`Screened` when the twin rules it out
        (``Twin.screen``); else the twin's answer when it was asked (the trial's prediction).
        The sampler is told a screened trial was pruned; a configuration screened once runs when
        the sampler proposes it again."""
        if self.twin is None or not self.job.study.screen or len(self.study.directions) > 1:
            return None
        if self.job.workload.objective.metric != "output_throughput" or not self._maximises():
            return None  # the twin predicts output throughput; other objectives are not screened
        flags = self.flags(params)
        records = trial_records(self.finished())
        if config_key(flags) in screened(records):
            return None  # the sampler proposed it again: it runs
        incumbent = self._incumbent()
        twin = None if incumbent is None else self.twin.screen(params, records, incumbent, self.noise().margin)
        if twin is None or "screened" not in twin:
            return None if twin is None else Pending.ready(twin, params, records)
        reason = f"screened before its engine started: {twin['screened']}"
        write_trial(trial, stage=stage, params=params, flags=flags, worker=self.worker, twin=twin)
        write_trial(trial, outcome=SCREENED, reason=reason)
        trial.report(float(twin["predicted"]["output_throughput"]), 0)
        self.study.tell(trial, state=TrialState.PRUNED)
        self.progress.message(f"trial {trial.number} {reason}")
        raise Screened(reason)

    def _maximises(self) -> bool:
        return self.study.directions[0] == optuna.study.StudyDirection.MAXIMIZE

    def _gives_way(self, number: int, stage: str, flags: dict[str, Any], new_only: bool) -> str | None:
        """Why trial ``number``, its start record stored, must give way to a trial asked before
        it, or None. Slots and workers ask at the same moment without seeing each other's
        choice; the storage's trial numbers order them. The earlier trial filled the quota, or
        (``new_only``) measures the same configuration."""
        if not self.admit(number):
            return f"trials of other workers had filled the {stage} quota"
        if new_only:
            await_start_records(self.study, number)
            earlier = measured(t for t in self.trials() if t.number < number).get(config_key(flags))
            if earlier is not None:
                return f"trial {earlier}, asked just before, measures the same configuration"
        return None

    def _withdraw(self, trial: optuna.Trial, why: str, **attrs: Any) -> str:
        """Give ``trial`` back before any engine starts: recorded ``withdrawn``, told FAIL (the
        sampler learns nothing from it), never counted nor re-run. Returns the recorded reason."""
        reason = f"withdrawn before its engine started: {why}"
        write_trial(trial, **attrs, outcome=WITHDRAWN, reason=reason)
        self.study.tell(trial, state=TrialState.FAIL)
        return reason

    def flags(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The engine flags a trial with ``params`` runs with."""
        return self.adapter.to_flags({**self.job.engine.fixed_flags, **self.job.space.fixed, **params})

    def _execute(
        self,
        trial: optuna.Trial,
        stage: str,
        params: dict[str, Any],
        workload: Workload,
        extra: dict[str, Any],
        *,
        probe: bool = False,
        new_only: bool = False,
        asked: Pending | None = None,
    ) -> TrialResult:
        """One trial; ``probe``: a run under another workload (a peak shape) that asks only
        whether the engine survives it, so the client's limits do not invalidate it;
        ``new_only``: withdrawn if a trial asked before it measures the same configuration;
        ``asked``: the twin's prediction, when screening made it already."""
        flags = self.flags(params)
        trial_dir = self.job.dir / "trials" / str(trial.number)
        # What says which quota a trial counts toward (stage, extra) is stored before params,
        # which mark the start record complete (TrialRecord.started).
        write_trial(
            trial,
            stage=stage,
            **extra,
            params=params,
            flags=flags,
            host=socket.gethostname(),
            worker=self.worker,
            trial_dir=str(trial_dir.resolve()),
        )
        why = self._gives_way(trial.number, stage, flags, new_only)
        if why is not None:
            raise Withdrawn(self._withdraw(trial, why))
        self.progress.trial_started(trial.number, stage, params)
        prediction = asked or self._predict(stage, params, probe)
        try:
            with self.placement(flags) as env:
                if env:
                    write_trial(trial, placement=dict(env))
                weight_flags, weight_env = self._weight_client(flags)
                spec = TrialSpec(
                    trial.number,
                    stage,
                    flags,
                    trial_dir,
                    launch_flags=weight_flags,
                    launch_env=weight_env,
                    repeats=self.job.study.repeats,
                    on_launch=lambda pgid: write_trial(trial, engine_pgid=pgid),
                    env=env,
                    stall_timeout_s=self.job.study.stall_timeout_s,
                    bench_timeout_s=self.job.study.bench_timeout_s,
                    quality_reference=None if stage == Stage.BASELINE else self._quality_reference(),
                    cpus=self.cpus,
                    # Real engines only: the simulator's runs are deterministic and its clock compressed.
                    stable_within=None if self.job.engine.simulated or probe else self.job.study.stable_within,
                    judge_client=not probe,
                    judge_host=self.job.study.judge_host and not self.job.engine.simulated,
                    early_stop=early_stop_policy(
                        self.job.study, stage, probe, self._incumbent, self._measured_noise, self._was_cut(flags)
                    ),
                )
                result = self.trial_runner(spec, self.adapter, workload, self.progress)
        except BaseException:
            # Ctrl-C or a bug: the engine is already torn down; record the trial as failed so the
            # study stays consistent and a resume re-runs it.
            write_trial(trial, outcome=INTERRUPTED)
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        twin = self._checked(trial, result, prediction)
        self._record(trial, result)
        self.progress.trial_finished({**result.summary(), "best": self.best_summary(), "twin": twin})
        # The next engine on these GPUs would fail its free-memory check: wait for the driver to
        # release what the stopped engine held (returns at once without NVML).
        wait_pids_released(result.engine_pids, timeout_s=RELEASE_TIMEOUT_S)
        self.stop_if_flag_independent()
        return result

    def _predict(self, stage: str, params: dict[str, Any], probe: bool) -> Pending | None:
        """The twin's prediction for a search trial, asked from the runs recorded so far."""
        if self._twin_pool is None or self.twin is None or probe or stage not in PREDICTED:
            return None
        return self.twin.ask(self._twin_pool, params, trial_records(self.finished()))

    def _checked(self, trial: optuna.Trial, result: TrialResult, prediction: Pending | None) -> dict[str, Any] | None:
        """Store the twin's prediction with what the trial measured."""
        if prediction is None or self.twin is None:
            return None
        twin = self.twin.check(prediction, result.metrics, result.outcome.served, bool(result.early_stop))
        write_trial(trial, twin=twin)
        return twin

    def stop_if_flag_independent(self) -> None:
        """Stop the study when two launches with different flags failed with the same root cause
        at the same point and nothing was served yet: the engine fails whatever the flags are,
        so sampling on would only burn the night.

        Raises:
            EngineFailsRegardless: With the diagnosis, also stored as the study's ``stopped`` attribute.
        """
        finished = [t for t in self.trials() if t.state.is_finished()]
        served = {str(Outcome.OK), str(Outcome.SLO_VIOLATION)}
        if any(trial_record(t).outcome in served for t in finished):
            return
        groups: dict[tuple[str, str], list[FrozenTrial]] = {}
        for t in finished:
            if (key := _deterministic_failure(t)) is not None:
                groups.setdefault(key, []).append(t)
        for same in groups.values():
            if len({json.dumps(trial_record(t).flags, sort_keys=True, default=str) for t in same}) > 1:
                raise self._stopped(same)

    def _stopped(self, same: list[FrozenTrial]) -> EngineFailsRegardless:
        # The most telling line of the group: a death with its signal beats one not yet reaped.
        records = trial_records(same)
        causes = [r.facts["root_cause"] for r in records]
        cause = max(causes, key=lambda c: "SIG" in c["line"])
        where = WHERE[records[0].facts["failed_at"]]
        outcomes = sorted({str(r.outcome) for r in records})
        hint = cause["hint"] or "read engine.log of those trials"
        line = (
            f"the engine fails independently of the flags tried: {len(same)} launches with different flags "
            f"(trials {', '.join(str(t.number) for t in same)}) all ended {'/'.join(outcomes)} {where}: "
            f"{cause['line']}. {hint[0].upper()}{hint[1:]}; stopped before sampling more"
        )
        stopped = {"reason": "flag_independent_failure", "line": line, "trials": [t.number for t in same]}
        set_stopped(self.study, {**stopped, "root_cause": cause})
        return EngineFailsRegardless(line)

    def _quality_reference(self) -> Path | None:
        """The baseline's greedy answers (greedy.json in its trial folder), the quality reference."""
        for r in trial_records(self.trials(Stage.BASELINE)):
            path = Path(r.trial_dir) / "greedy.json"
            if r.trial_dir and path.is_file():
                return path
        return None

    def _record(self, trial: optuna.Trial, result: TrialResult) -> None:
        assert result.score is not None
        write_trial(
            trial,
            outcome=str(result.outcome),
            constraints=result.score.constraints,
            violations=result.score.violations,
            metrics=result.metrics,
            spread=result.spread,
            facts=result.facts,
            timings=result.timings,
            reason=result.reason,
            argv=result.argv,
            engine_args=result.engine_args,
            env=redact_env(result.env),
            log_path=result.log_path,
            early_stop=result.early_stop,
        )
        for name, slack in result.score.constraints.items():
            trial.set_constraint(name, slack)
        if result.outcome.retryable:
            self.study.tell(trial, state=TrialState.FAIL)
        elif (result.early_stop or {}).get("reason") == CANNOT_WIN:
            # Pruned, not complete: its value is a partial run's, so it must not rank as a full
            # observation (nor ever be best or a finalist: those are complete trials). TPE puts
            # pruned trials below every complete one, which is what the stop proved.
            trial.report(result.score.value, 0)
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, result.score.values)

    def _incumbent(self) -> float | None:
        """What the best served configuration would score again, the value a search trial must
        beat to survive ``cannot_win``: the median of its runs when it was launched more than
        once, else its one run taken down by the measured noise — by more the more single runs it
        was the best of (``expected_best_of``), since the best of many is likely a lucky one."""
        best = best_trial(self.study)
        if best is None or (value := primary_value(best)) is None:
            return None
        groups = runs_by_configuration(self.trials(), self.job.workload.objective.metric)
        runs = groups.get(config_key(trial_record(best).flags or {}), ([], []))[1]
        if len(runs) > 1:
            return statistics.median(runs)
        luck = min(0.9, self.noise().margin * max(1.0, expected_best_of(len(groups))))
        return value * (1 - luck) if self._maximises() else value * (1 + luck)

    def noise(self) -> StudyNoise:
        """The study's run-to-run noise on its objective (``search/noise.py``): the one figure
        every decision that compares two measurements allows for."""
        return study_noise(self.trials(), self.job.workload.objective.metric)

    def _measured_noise(self) -> float | None:
        return self.noise().measured

    def unmeasured(self, space: SearchSpace, fixed: Mapping[str, Any]) -> int | None:
        """How many configurations of ``space`` (with ``fixed`` on top) nothing has measured
        yet, or None when the space is too large to list."""
        points = finite_points(space)
        if points is None:
            return None
        seen = measured(self.trials())
        return sum(config_key(self.flags({**fixed, **point})) not in seen for point in points)

    def _was_cut(self, flags: Mapping[str, Any]) -> bool:
        """Whether a trial of this configuration was cut early as unable to win: then it runs in
        full when proposed again (a cut is not a measurement)."""
        key = config_key(flags)
        return any(
            t.state == TrialState.PRUNED and config_key(trial_record(t).flags or {}) == key for t in self.trials()
        )

    def best_summary(self) -> dict[str, Any] | None:
        best = best_trial(self.study)
        return None if best is None else {"number": best.number, "value": primary_value(best)}

    # -- shared stages
    def retry_failed(self) -> None:
        """Re-run (within the retry budget) trials that crashed, timed out or were interrupted."""
        for t in self.trials():
            r = trial_record(t)
            if t.state != TrialState.FAIL or t.number in superseded(self.trials()) or r.params is None:
                continue
            if not r.facts.get("transient", True):
                continue  # the log named a cause that does not go away on a re-run
            if r.attempt >= self.job.study.retries or self.out_of_time() or not self.claim_retry(t):
                continue
            self.progress.message(f"retrying trial {t.number} ({r.outcome or 'failed'})")
            kept = {"validates": r.validates, "probe": r.probe, "workload_override": r.workload_override}
            extra = {k: v for k, v in kept.items() if v is not None}
            override = r.workload_override
            workload = Workload.model_validate(as_given(Workload, override)) if override else None
            self.run(
                r.stage,
                explicit=r.params,
                workload=workload,
                extra={**extra, "attempt": r.attempt + 1, "retry_of": t.number},
            )
