"""One trial: launch the engine with one flag set, benchmark it, tear it down, classify.

Every path — ready or not, served or crashed, Ctrl-C — leaves no engine process behind: the
engine lives inside ``with EngineProcess(...)``, whose exit kills its process group.
Files written per trial (``results/<study>/trials/<n>/``): ``argv.json``, ``engine.log``,
``bench.json`` (one entry per repeat), ``outcome.json``.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from autotune import __version__
from autotune.bench import prometheus, quality
from autotune.bench.capacity import search_capacity
from autotune.bench.earlystop import (
    REASONS,
    SERVER_DEAD,
    SLO_LOST,
    EarlyStop,
    EarlyStopPolicy,
    StopDecision,
)
from autotune.bench.gauges import GaugeSampler
from autotune.bench.instruments import run_engine_client
from autotune.bench.loadgen import BenchProgress, run_workload_sync
from autotune.bench.stability import throughput_interval
from autotune.config import CAPACITY_KEY, StudySettings, Workload
from autotune.engines.base import EngineAdapter, EventKind, LaunchSpec, LogEvent, startup_split
from autotune.engines.rootcause import root_cause
from autotune.errors import (
    AutotuneError,
    BenchmarkError,
    ClientLimited,
    EngineCrashed,
    EngineStartupError,
    HostDisturbed,
    InvalidFlags,
    StartupTimeout,
)
from autotune.outcomes import Outcome
from autotune.runtime import interrupt
from autotune.runtime.cpuset import CpuPartition, pinned
from autotune.runtime.hostshare import CoreShare, disturbance, gpu_strangers, visible_devices
from autotune.runtime.ports import free_port
from autotune.runtime.process import EngineProcess, exit_text
from autotune.runtime.procfs import send_group
from autotune.search.diagnosis import STARTUP, WHERE, client_problem, failed_at, in_flight_story, in_flight_text
from autotune.search.objective import Score, score
from autotune.search.progress import NullProgress, Progress
from autotune.search.stage import Stage

__all__ = [
    "GRAPH_FACTS",
    "NEVER_STOPPED",
    "TrialResult",
    "TrialRunner",
    "TrialSpec",
    "early_stop_policy",
    "graph_facts",
    "run_trial",
]

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1


#: What an engine tells of its CUDA graphs: the captured max, and how many steps ran without one
#: (SGLang's decode-pass counter; vLLM's ``--cudagraph-metrics`` table): the graph stage's evidence.
GRAPH_FACTS = ("cuda_graph_max_bs", "cuda_graph_false_share", "decode_passes", "graph_steps", "eager_min_tokens")


def graph_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The graph facts of a trial, from its facts (a live result's or a stored record's)."""
    return {k: facts[k] for k in GRAPH_FACTS if k in facts}


@dataclass(frozen=True)
class TrialSpec:
    number: int
    stage: str
    flags: dict[str, Any]  # canonical dialect flags, already validated
    trial_dir: Path
    repeats: int = 1
    # Called with the engine's process-group id as soon as it exists, so a killed tuner's
    # engine can be found and reaped on resume.
    on_launch: Callable[[int], None] | None = None
    # Where the engine runs (CUDA_VISIBLE_DEVICES of its GPU group): given to the engine and
    # written to argv.json, but kept out of the result's env, which exported scripts reuse.
    env: Mapping[str, str] = field(default_factory=dict)
    stall_timeout_s: float = 120.0  # no new tokens this long mid-benchmark: the engine is hung
    bench_timeout_s: float | None = None  # the whole benchmark (None: derived from the workload)
    # The baseline trial's greedy.json: answers this trial's are compared with when the workload
    # sets quality_min_agreement (None: this trial is the baseline, or it has none).
    quality_reference: Path | None = None
    # A CPU engine's cores and the load generator's (None: they share, as on a GPU host).
    cpus: CpuPartition | None = None
    # A run whose throughput's 95 % half-width exceeds this share of it is lengthened (more
    # prompts) up to max_run_s; None: runs are as long as the workload says (the simulator).
    stable_within: float | None = None
    max_run_s: float = 60.0
    # False for a probe under a peak shape (the memory edge): it asks only whether the engine
    # survives the load, which a slow client does not change, and its value never ranks.
    judge_client: bool = True
    # Re-run a run during which other processes took the engine's cores (with ``cpus``) or held
    # its GPUs (``runtime/hostshare.py``); a simulated engine runs in modelled time and is not
    # judged. What was seen is recorded either way.
    judge_host: bool = False
    # Flags that change how the engine starts, not what is measured (mapping its weights from
    # the study's weight-cache daemon): launched and written to argv.json, never exported.
    launch_flags: Mapping[str, Any] = field(default_factory=dict)
    # The environment those flags need (where the daemon's sockets are), recorded the same way.
    launch_env: Mapping[str, str] = field(default_factory=dict)
    # What may end a benchmark run early (autotune.bench.earlystop); None: every run goes to its end.
    early_stop: EarlyStopPolicy | None = None


@dataclass
class TrialResult:
    number: int
    stage: str
    outcome: Outcome
    flags: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    engine_args: list[str] = field(default_factory=list)  # argv after the launch command
    engine_pids: list[int] = field(default_factory=list)  # the engine's processes at teardown
    metrics: dict[str, float] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)  # relative (max−min)/median per key
    facts: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    reason: str = ""  # the log line or error that explains a failure
    log_path: str = ""
    score: Score | None = None
    early_stop: dict[str, Any] | None = None  # why a run ended early: reason, at_requests, evidence

    def summary(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "stage": self.stage,
            "outcome": str(self.outcome),
            "value": self.score.value if self.score else None,
            "reason": self.reason,
            "early_stop": self.early_stop,
            "metrics": self.metrics,
            "timings": self.timings,
            "pool": {k: self.facts[k] for k in ("kv_tokens", "preemptions") if k in self.facts},
            "graphs": graph_facts(self.facts),
        }


GAUGE_INTERVAL_S = 0.5  # one /metrics read per half second: negligible next to the workload
CLIENT_RERUNS = 2  # a client-limited run is run again this many times before the trial gives up
PORT_TRIES = 3  # launches of one trial when each finds its port taken by someone else
LENGTHENINGS, MAX_GROWTH = 2, 4.0  # a short run is lengthened at most twice, each time ≤ 4× the prompts
SERVER_POLL_S = 1.0  # how often a run with early stop looks whether its engine is still alive
HEALTH_TIMEOUT_S, HEALTH_MISSES = 3.0, 3  # this many failed health checks in a row: the engine is dead


#: Stages whose runs always go to their end: every gain is measured against the baseline and
#: re-measured by validation, and a memory probe's failure under load is its answer.
NEVER_STOPPED = frozenset({Stage.BASELINE, Stage.NOISE, Stage.VALIDATION, Stage.MEMORY_EDGE})
#: Stages whose trials rank against the best so far: the staged method's scenario search, ``--method search``.
RANKED_STAGES = frozenset({Stage.SCENARIO, Stage.SEARCH})


def early_stop_policy(
    settings: StudySettings,
    stage: str,
    probe: bool,
    incumbent: Callable[[], float | None],
    noise: Callable[[], float | None] = lambda: None,
    full: bool = False,
) -> EarlyStopPolicy | None:
    """What may end a trial's runs early (None: nothing). A dead engine always may; a lost SLO
    only with one run per trial (with repeats the median of the runs decides); ``cannot_win``
    only in the search stages, whose trials rank against the incumbent (``incumbent()``: what the
    best served configuration would score again), and only once the study measured its run-to-run
    noise (``noise()``, None until then: a cut would rest on an assumed figure). ``full``: the
    configuration was cut once already, so it now runs to its end (a cut is not a measurement).
    The context and graph stages compare a run with their own last step."""
    if not settings.early_stop or probe or stage in NEVER_STOPPED:
        return None
    if settings.repeats > 1:
        return EarlyStopPolicy(frozenset({SERVER_DEAD}))
    margin = noise() if stage in RANKED_STAGES and not full else None
    if margin is None:
        return EarlyStopPolicy(frozenset({SLO_LOST, SERVER_DEAD}))
    return EarlyStopPolicy(REASONS, incumbent=incumbent(), noise_margin=margin)


def _explain(result: TrialResult, t: _Trial, err: AutotuneError) -> None:
    """Record the failure's root cause (never a wrapper line), the knob it points to, where it
    happened and what was in flight."""
    cause = root_cause(t.events, str(err), getattr(err, "returncode", None))
    where = failed_at(t.ready, t.attempts or t.runs)
    flight = in_flight_story(t.events, t.attempts or t.runs) if t.ready else {}
    result.reason = f"{cause.line} ({WHERE[where]})"
    if text := in_flight_text(flight):
        result.reason += f"; in flight: {text}"
    transient = not cause.from_log or result.outcome == Outcome.STARTUP_TIMEOUT or cause.kind == "port_in_use"
    result.facts.update(root_cause=cause.to_json(), failed_at=where, transient=transient)
    if flight:
        result.facts["in_flight"] = flight


def _time_to_ready(t: _Trial) -> float | None:
    """Seconds from launch to ready, as ``max_startup_s`` judges them: the wall clock a real
    engine took, or for the simulator the modelled seconds its log gives (weights, then engine
    init — or graph capture and compile where the dialect logs no init)."""
    if not t.adapter.settings.simulated:
        return t.timings.get("startup_s")
    split = startup_split(t.events)
    after_weights = split.get("init_s", split.get("capture_s", 0.0) + split.get("compile_s", 0.0))
    return float(split.get("weights_s", 0.0)) + float(after_weights) if split else None


def _median_metrics(runs: list[dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """Median of each numeric key over repeats, and its relative spread (max−min)/median."""
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    med: dict[str, float] = {}
    spread: dict[str, float] = {}
    for k in keys:
        vals = [float(r[k]) for r in runs if isinstance(r.get(k), (int, float))]
        med[k] = statistics.median(vals)
        if len(vals) > 1 and med[k]:
            spread[k] = (max(vals) - min(vals)) / abs(med[k])
    return med, spread


class _Trial:
    """State of one running trial; methods are the phases."""

    def __init__(self, spec: TrialSpec, adapter: EngineAdapter, workload: Workload, progress: Progress):
        self.spec, self.adapter, self.workload, self.progress = spec, adapter, workload, progress
        self.events: list[LogEvent] = []
        self.runs: list[dict[str, Any]] = []  # the benchmark's runs so far, kept for a failure's story
        self.reruns: list[dict[str, Any]] = []  # runs thrown away because the client limited them
        self.attempts: list[dict[str, Any]] = []  # every run's JSON, the one an engine died in too
        self.lengthened: list[dict[str, Any]] = []  # runs replaced by longer ones, and why
        self.early_stop: dict[str, Any] | None = None  # the run that ended early, and why
        self.ready = False
        self.proc: EngineProcess | None = None
        self.timings: dict[str, float] = {}
        spec.trial_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = spec.trial_dir / "engine.log"

    def launch_spec(self) -> LaunchSpec:
        flags = {**self.adapter.measurement_flags(), **self.spec.flags, **self.spec.launch_flags}
        spec = self.adapter.build_launch(flags, free_port(self.adapter.settings.host))
        if self.spec.launch_env:
            spec = replace(spec, env={**spec.env, **self.spec.launch_env})
        record = {
            "schema_version": SCHEMA_VERSION,
            "argv": spec.argv,
            "env": {**spec.env, **self.spec.env},
            "measurement": self.measurement,
        }
        _write_json(self.spec.trial_dir / "argv.json", record)
        return spec

    @property
    def measurement(self) -> dict[str, Any]:
        """How the tuner runs the engine to measure it, beyond the trial's flags: the cores and
        the environment it adds. Recorded with the trial, never exported."""
        cpus = self.spec.cpus
        env = {**self.adapter.measurement_env(), **(cpus.engine_env(self.adapter.settings.env) if cpus else {})}
        return {**(cpus.to_json() if cpus else {}), "env": env, "flags": self.adapter.measurement_flags()}

    def engine_command(self, launch: LaunchSpec) -> tuple[list[str], dict[str, str]]:
        """The argv and environment actually started: the trial's, on the engine's cores."""
        prefix = self.spec.cpus.engine_prefix() if self.spec.cpus else []
        return [*prefix, *launch.argv], {**launch.env, **self.spec.env, **self.measurement["env"]}

    def bench(self, launch: LaunchSpec, proc: EngineProcess) -> tuple[list[dict[str, float]], dict[str, Any]]:
        before = prometheus.scrape(launch.base_url)
        runs = self.runs
        # The engine's own client reports no progress to watch: only the bench timeout bounds it.
        stall_s = self.spec.stall_timeout_s if self.workload.client == "autotune" else math.inf
        self.watchdog = _Watchdog(proc, stall_s)
        sampler = GaugeSampler(launch.base_url, self.adapter.sampled_gauges, GAUGE_INTERVAL_S)
        try:
            with sampler:
                self._runs(launch, proc)
        finally:
            self.watchdog.stop()
        after = prometheus.scrape(launch.base_url)
        facts = {**self.adapter.served_facts(launch.base_url), **self.adapter.engine_facts(self.events, before, after)}
        facts.update(_sampled_facts(sampler.summary(), facts))
        facts["client_limited"] = any(r.get("client_limited") for r in runs)
        if self.reruns:
            facts["client_reruns"] = self.reruns
        if self.lengthened:
            facts["lengthened_runs"] = self.lengthened
        intervals = [r["throughput_interval"]["relative"] for r in runs if "throughput_interval" in r]
        if intervals:
            facts["throughput_ci"] = max(intervals)  # the loosest run's 95 % half-width, relative
        _write_json(self.spec.trial_dir / "bench.json", {"schema_version": SCHEMA_VERSION, "runs": runs})
        return runs, facts

    def _runs(self, launch: LaunchSpec, proc: EngineProcess) -> None:
        """The workload ``repeats`` times, each with the client the workload names."""
        for i in range(self.spec.repeats):
            self.progress.phase(
                f"benchmarking {i + 1}/{self.spec.repeats}" if self.spec.repeats > 1 else "benchmarking"
            )
            if self.workload.client != "autotune":  # the engine's own benchmark client measures
                self.runs.append(self._engine_client(launch, i))
            elif self.workload.searches_capacity and self.workload.slos:  # a probe's peak load has none
                self.runs.append(self._capacity(launch))
            else:
                self.runs.append(self._valid_run(launch, proc, i))
            self._check_engine(proc)
            if self.early_stop is not None:
                break  # the trial's verdict is known: the other repeats cannot change it

    def _check_engine(self, proc: EngineProcess, monitor: _ServerMonitor | None = None) -> None:
        """Raise EngineCrashed if the engine is gone or hung: the watchdog's verdict first, then
        the exit as the process reports it (a dead engine's refused connections are not the
        client's fault), then the monitor's failed health route (it knows whether tokens had
        stopped too), then the health route now."""
        if self.watchdog.fired:
            raise EngineCrashed(self.watchdog.reason, log_path=self.log_path)
        if monitor is not None and monitor.error is not None and proc.returncode is None:
            raise monitor.error
        proc.check_alive()  # vLLM answers 200 streams with an error body when its core dies

    def _valid_run(self, launch: LaunchSpec, proc: EngineProcess, repeat: int) -> dict[str, Any]:
        """One run of the workload that measured the engine, not the client or the host.

        A run whose client says it was starved, that lost requests on the client's side, or
        during which other processes took the engine's cores, is not a measurement, nor is its
        early stop: it is run again (up to :data:`CLIENT_RERUNS` times, each recorded with its
        reason), and when every attempt was limited the trial is ``client_limited`` (or
        ``host_disturbed`` when the host disturbed the last one).
        """
        problem, disturbed = "", ""
        for attempt in range(CLIENT_RERUNS + 1):
            run = self._watched_run(launch, proc)
            disturbed = disturbance(run) if self.spec.judge_client and self.spec.judge_host else ""
            problem = (client_problem(run) or disturbed) if self.spec.judge_client else ""
            if not problem and run.get("early_stop"):
                # A stopped run is final: its verdict is known, and lengthening it would undo the saving.
                self.early_stop = run["early_stop"]
                return run
            if not problem:
                return self._long_enough(launch, proc, run) if self.spec.judge_client else run
            self.reruns.append({"repeat": repeat, "attempt": attempt, "reason": problem})
            self.progress.message(f"  run {repeat + 1} not scored: {problem}; running it again")
        if problem == disturbed:
            raise HostDisturbed(f"host-disturbed in all {CLIENT_RERUNS + 1} attempts, last: {problem}")
        raise ClientLimited(f"client-limited in all {CLIENT_RERUNS + 1} attempts, last: {problem}")

    def _watched_run(self, launch: LaunchSpec, proc: EngineProcess, workload: Workload | None = None) -> dict[str, Any]:
        """One run of the workload (or a longer one), ended early when the trial's policy allows and
        the run cannot matter; an engine that dies mid-run ends it at once (:class:`_ServerMonitor`)."""
        workload = workload or self.workload
        policy = self.spec.early_stop if self.spec.judge_client else None
        watch = EarlyStop(policy, workload) if policy is not None else None
        monitor = _ServerMonitor(proc, watch, self.watchdog) if watch is not None else None
        host = _HostWatch(self.spec.cpus, proc.pgid, {**launch.env, **self.spec.env}, self.adapter.runs_on_cpu())
        try:
            result = run_workload_sync(
                launch.base_url,
                workload,
                api_key=self.adapter.api_key(),
                on_progress=self._bench_progress,
                deadline_s=self.spec.bench_timeout_s,
                early_stop=watch,
            )
        except Exception:
            # A stop signal cancels the run's tasks; an HTTP stream torn down mid-cancel can raise
            # an error of its own (anyio's "cancel scope" RuntimeError), which must not hide the stop.
            if interrupt.requested():
                raise KeyboardInterrupt from None
            raise
        finally:
            if monitor is not None:
                monitor.stop()
        run = result.to_json(detailed=True)
        if (seen := host.stop()) is not None:
            run["host"] = seen
        self.attempts.append(run)
        try:
            self._check_engine(proc, monitor)
        except EngineCrashed as err:
            if watch is not None and (run.get("early_stop") or run.get("failed_engine") or (monitor and monitor.error)):
                # The engine died during the run; whatever ended it first (the refused requests of
                # a dead engine can fail it fast, or lose its SLO), that is why it ended.
                self.early_stop = StopDecision(SERVER_DEAD, watch.completed, str(err)).to_json()
            raise
        return run

    def _long_enough(self, launch: LaunchSpec, proc: EngineProcess, run: dict[str, Any]) -> dict[str, Any]:
        """The run, or a longer one when its throughput is not pinned down within
        ``stable_within`` (each lengthening recorded); never past ``max_run_s``."""
        target = self.spec.stable_within
        interval = throughput_interval(run)
        for _ in range(LENGTHENINGS):
            duration = float(run.get("duration") or 0.0)
            if target is None or interval.relative <= target or duration >= self.spec.max_run_s / 2:
                break
            needed = max(2.0, (interval.relative / target) ** 2)  # the half-width shrinks as 1/sqrt(length)
            grow = min(MAX_GROWTH, needed, self.spec.max_run_s / max(duration, 0.1))
            before = int(run.get("num_prompts") or self.workload.num_prompts)
            longer = self.workload.model_copy(update={"num_prompts": math.ceil(before * grow)})
            self.lengthened.append({"from": before, "to": longer.num_prompts, "relative_ci": interval.relative})
            self.progress.message(
                f"  run of {duration:.1f} s: throughput ±{interval.relative:.0%}, not within ±{target:.0%}; "
                f"running {longer.num_prompts} prompts"
            )
            candidate = self._watched_run(launch, proc, longer)
            if client_problem(candidate):
                break  # keep the shorter valid run rather than a limited longer one
            run, interval = candidate, throughput_interval(candidate)
            if candidate.get("early_stop"):
                self.early_stop = candidate["early_stop"]
                break
        run["throughput_interval"] = interval.to_json()
        return run

    def _capacity(self, launch: LaunchSpec) -> dict[str, Any]:
        """A capacity search scored as one run: the metrics of the run at the level found (of the
        lowest level run when none held, so its SLO violations show), plus ``max_slo_rate``."""
        found = search_capacity(
            launch.base_url,
            self.workload,
            api_key=self.adapter.api_key(),
            on_progress=self._bench_progress,
            on_run=lambda r: self.progress.message(
                f"  capacity: {r.level:,.2f} {'holds' if r.passed else 'fails'}"
                + ("" if r.passed else f" ({', '.join(sorted(r.violations))})")
            ),
        )
        judged = [r for r in found.runs if math.isfinite(r.level)] or found.runs
        shown = found.best or min(judged, key=lambda r: r.level)
        return {**shown.metrics, CAPACITY_KEY: found.value, "capacity": found.to_json()}

    def _engine_client(self, launch: LaunchSpec, repeat: int) -> dict[str, Any]:
        """One run of the engine's own benchmark client, its saved result in client/<repeat>/."""
        settings, out_dir = self.adapter.settings, self.spec.trial_dir / "client" / str(repeat)
        python, kind = settings.python or "python3", self.workload.client
        env = {**launch.env, **self.spec.env}  # the engine's environment suits its own client too
        return run_engine_client(
            kind, python, launch.base_url, settings.model, self.workload, out_dir,
            timeout_s=self.spec.bench_timeout_s, env=env,
        )  # fmt: skip

    def quality_check(self, launch: LaunchSpec) -> float | None:
        """Greedy answers to the fixed prompts, saved as greedy.json; their agreement with the
        baseline's (None when this trial is the reference). Runs before the benchmark, on a fresh
        engine, so every trial answers in the same engine state."""
        prompts = quality.QUALITY_PROMPTS
        outputs = quality.greedy_outputs(
            launch.base_url, self.adapter.settings.model, prompts, api_key=self.adapter.api_key()
        )
        quality.save_outputs(self.spec.trial_dir / "greedy.json", prompts, outputs)
        ref = self.spec.quality_reference
        reference = quality.load_outputs(ref, prompts) if ref is not None else None
        return quality.agreement(reference, outputs) if reference is not None else None

    def _bench_progress(self, p: BenchProgress) -> None:
        # Cumulative chunks (rate × elapsed): the watchdog wants to see them grow.
        self.watchdog.observe(p.completed + p.output_throughput * p.elapsed_s)
        self.progress.bench_progress(p.completed, p.total, p.output_throughput)


class _HostWatch:
    """Who else used the engine's cores (a CPU engine with its own cores) or its GPUs during
    one run (``runtime/hostshare.py``); what :meth:`stop` returns is the run's ``host`` record."""

    def __init__(self, cpus: CpuPartition | None, pgid: int | None, env: Mapping[str, str], on_cpu: bool):
        self.pgid, self.on_cpu = pgid, on_cpu
        self.devices = visible_devices(dict(env))
        self.cores = CoreShare(cpus.engine, pgid) if cpus is not None and pgid else None
        self.strangers: dict[str, list[int]] = {}
        if self.cores is not None:
            self.cores.start(time.monotonic())
        elif pgid and not on_cpu:
            self.strangers = gpu_strangers(self.devices, pgid)

    def stop(self) -> dict[str, Any] | None:
        if self.cores is not None:
            return self.cores.stop(time.monotonic())
        if not self.pgid or self.on_cpu:
            return None
        for index, pids in gpu_strangers(self.devices, self.pgid).items():
            self.strangers[index] = sorted({*self.strangers.get(index, []), *pids})
        return {"gpu_strangers": self.strangers} if self.strangers else None


class _ServerMonitor:
    """Ends a watched run at once when its engine died: the process exited, or its health route
    failed :data:`HEALTH_MISSES` checks in a row (a check that timed out counts only while no
    token arrived either: a saturated engine may answer its health route late). Without it the
    requests in flight would sit out their timeouts before the trial could say why."""

    def __init__(self, proc: EngineProcess, watch: EarlyStop, watchdog: _Watchdog):
        self.proc, self.watch, self.watchdog = proc, watch, watchdog
        self.error: EngineCrashed | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="engine-monitor", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        misses = 0
        while not self._done.wait(SERVER_POLL_S):
            code = self.proc.returncode
            if code is not None:
                self._dead(f"engine exited ({exit_text(code)}) mid-run", code)
                return
            misses = 0 if self._healthy() else misses + 1
            if misses >= HEALTH_MISSES:
                route = f"health route {self.proc.health_url} failed {misses} checks in a row"
                quiet = self.watchdog.quiet_for()
                # SGLang's /health runs a generation: on a hung engine it times out and answers
                # 503, so the failed checks are the hang seen from outside, not another fault.
                if quiet >= HEALTH_MISSES * SERVER_POLL_S:
                    self._dead(f"engine hung: no tokens for {quiet:.0f}s while requests were in flight and its {route}")
                else:
                    self._dead(f"engine {route}")
                return

    def _healthy(self) -> bool:
        url = self.proc.health_url
        if url is None:
            return True
        try:
            return httpx.get(url, timeout=HEALTH_TIMEOUT_S, trust_env=False).status_code == 200
        except httpx.TimeoutException:
            return self.watchdog.quiet_for() < HEALTH_TIMEOUT_S  # late but streaming: busy, not dead
        except httpx.HTTPError:
            return False

    def _dead(self, why: str, code: int | None = None) -> None:
        log.warning("%s; stopping the run", why)
        self.error = EngineCrashed(f"{why}; see {self.proc.log_path}", returncode=code, log_path=self.proc.log_path)
        self.watch.request_stop(SERVER_DEAD, why)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=HEALTH_TIMEOUT_S + 2)


class _Watchdog:
    """Kills an engine that stopped producing tokens mid-benchmark (alive, /health 200, but hung):
    without it every in-flight request would sit out its full timeout."""

    def __init__(self, proc: EngineProcess, stall_s: float):
        self.proc, self.stall_s = proc, stall_s
        self.fired, self.reason = False, ""
        self._seen, self._last = -1.0, time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="engine-watchdog", daemon=True)
        self._thread.start()

    def observe(self, progress: float) -> None:
        if progress > self._seen:
            self._seen, self._last = progress, time.monotonic()

    def quiet_for(self) -> float:
        """Seconds since the benchmark last made progress."""
        return time.monotonic() - self._last

    def _watch(self) -> None:
        while not self._done.wait(1.0):
            if time.monotonic() - self._last > self.stall_s and self.proc.pgid is not None:
                self.fired = True
                self.reason = f"engine hung: no tokens for {self.stall_s:.0f}s while requests were in flight; killed it"
                log.warning(self.reason)
                send_group(self.proc.pgid, signal.SIGKILL)  # the streams then fail fast
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)


#: Runs one trial's configuration and returns its classified result: :func:`run_trial` launches
#: the engine; the search-efficiency benchmark hands StudyRun a simulator-backed one.
TrialRunner = Callable[[TrialSpec, EngineAdapter, Workload, Progress | None], TrialResult]


def run_trial(
    spec: TrialSpec, adapter: EngineAdapter, workload: Workload, progress: Progress | None = None
) -> TrialResult:
    """Run one trial end to end and return its classified result (never raises for engine
    failures: they are outcomes). KeyboardInterrupt still propagates — after teardown.

    A port taken between choosing it and the engine binding it says nothing about the flags:
    the engine is started again on a new port (up to :data:`PORT_TRIES` launches), and each
    taken port's root-cause line is kept in the facts (the engine log holds every launch).
    """
    taken: list[str] = []
    while True:
        result = _run_once(spec, adapter, workload, progress)
        cause = result.facts.get("root_cause") or {}
        if cause.get("kind") != "port_in_use" or result.facts.get("failed_at") != STARTUP:
            break
        taken.append(str(cause.get("line", "")))
        if len(taken) >= PORT_TRIES:
            break
        log.warning("trial %d: the engine's port was taken; launching again on a new port", spec.number)
    if taken:
        result.facts["ports_taken"] = taken
        _write_json(spec.trial_dir / "outcome.json", _outcome_record(result))
    return result


def _run_once(spec: TrialSpec, adapter: EngineAdapter, workload: Workload, progress: Progress | None) -> TrialResult:
    t = _Trial(spec, adapter, workload, progress or NullProgress())
    result = TrialResult(spec.number, spec.stage, Outcome.CRASH, spec.flags, [], {}, log_path=str(t.log_path))
    t0 = time.monotonic()
    try:
        launch = t.launch_spec()
        # What is recorded for exports is the trial's own launch: the weight-cache flags point
        # at this study's daemon, which a deployment does not have, and the measurement flags
        # only observe (argv.json keeps both).
        plain = launch
        if spec.launch_flags or spec.launch_env or adapter.measurement_flags():
            plain = adapter.build_launch(spec.flags, launch.port)
        result.argv, result.env = plain.argv, plain.env
        result.engine_args = plain.argv[len(adapter.launch_prefix()) :]
        t.progress.phase("launching")
        argv, env = t.engine_command(launch)
        proc = EngineProcess(
            argv,
            env,
            t.log_path,
            ready_url=launch.base_url + launch.ready_path,
            ready_fallback_url=launch.base_url + launch.ready_fallback if launch.ready_fallback else None,
            health_url=launch.base_url + adapter.health_path,
            on_line=t.adapter.watch_log(t.events),
            startup_timeout_s=adapter.settings.startup_timeout_s,
        )
        t.proc = proc
        with proc:
            if spec.on_launch and proc.pgid is not None:
                spec.on_launch(proc.pgid)
            t.timings["startup_s"] = proc.wait_ready()
            t.ready = True
            agreement = None
            if workload.quality_min_agreement is not None:
                t.progress.phase("quality check")
                agreement = t.quality_check(launch)
            t.progress.phase("warming")
            b0 = time.monotonic()
            with pinned(spec.cpus.client if spec.cpus else None):
                runs, facts = t.bench(launch, proc)
            facts["measurement"] = t.measurement
            facts["ready_route"] = (proc.ready_url or "").removeprefix(launch.base_url)  # the one this release serves
            t.timings["bench_s"] = time.monotonic() - b0
            t.progress.phase("tearing down")
            d0 = time.monotonic()
        t.timings["teardown_s"] = time.monotonic() - d0
        result.metrics, result.spread = _median_metrics(runs)
        result.facts = facts if agreement is None else {**facts, "quality_agreement": agreement}
        result.score = score(Outcome.OK, result.metrics, workload, agreement, _time_to_ready(t))
        result.outcome = Outcome.SLO_VIOLATION if result.score.violations else Outcome.OK
        if (t.early_stop or {}).get("reason") == SLO_LOST:
            result.outcome = Outcome.SLO_VIOLATION  # the bound proved the full run would miss it
    except InvalidFlags as err:
        result.outcome, result.reason = Outcome.INVALID_FLAGS, str(err)
    except StartupTimeout as err:
        result.outcome = Outcome.STARTUP_TIMEOUT
        _explain(result, t, err)
    except EngineStartupError as err:
        result.outcome = adapter.classify_failure(err.returncode, t.events)
        _explain(result, t, err)
    except (ClientLimited, HostDisturbed) as err:
        limited = isinstance(err, ClientLimited)
        result.outcome, result.reason = Outcome.CLIENT_LIMITED if limited else Outcome.HOST_DISTURBED, str(err)
        result.facts.update(client_reruns=t.reruns, transient=True)
    except (EngineCrashed, BenchmarkError) as err:
        oom = any(e.kind == EventKind.OOM_RUNTIME for e in t.events)
        result.outcome = Outcome.OOM_RUNTIME if oom else Outcome.CRASH
        _explain(result, t, err)
    except AutotuneError as err:  # e.g. port trouble or teardown failure: infrastructure
        result.outcome = Outcome.CRASH
        _explain(result, t, err)
    result.facts.update(_event_facts(t.events, result.facts))
    result.early_stop = t.early_stop
    if result.score is None:
        result.score = score(result.outcome, {}, workload)
    t.timings["total_s"] = time.monotonic() - t0
    result.timings = t.timings
    if t.proc is not None:
        result.engine_pids = list(t.proc.stopped_pids)
    _write_json(spec.trial_dir / "outcome.json", _outcome_record(result))
    return result


def _sampled_facts(sampled: Mapping[str, Any], facts: Mapping[str, Any]) -> dict[str, Any]:
    """The gauges sampled during the run, and the peaks they raise: a periodic log line (SGLang
    logs every 40 decode steps) can miss the moment the pool was fullest."""
    if not sampled:
        return {}
    out: dict[str, Any] = {"gauges": dict(sampled)}
    for name in ("token_usage", "queue", "running"):
        if name in sampled:
            peak = sampled[name]["peak"]
            logged = facts.get(f"{name}_peak")
            out[f"{name}_peak"] = peak if logged is None else max(peak, logged)
    if "token_usage" in sampled and "token_usage_mean" not in facts:
        out["token_usage_mean"] = sampled["token_usage"]["mean"]
    return out


def _event_facts(events: list[LogEvent], facts: Mapping[str, Any]) -> dict[str, Any]:
    """Facts readable from the log even when the trial failed (KV size before an OOM ...)."""
    out: dict[str, Any] = {}
    for event in events:
        if event.kind == EventKind.KV_CAPACITY:
            out.setdefault("kv_tokens", event.data.get("kv_tokens"))
            if event.data.get("max_concurrency") is not None:
                out.setdefault("max_concurrency", event.data.get("max_concurrency"))
        elif event.kind == EventKind.VERSION:
            out.setdefault("engine_version", event.data.get("version"))
    out["startup"] = startup_split(events) or None
    return {k: v for k, v in out.items() if k not in facts and v is not None}


def _outcome_record(result: TrialResult) -> dict[str, Any]:
    record = asdict(result)
    record.update(schema_version=SCHEMA_VERSION, autotune_version=__version__, outcome=str(result.outcome))
    return record


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
