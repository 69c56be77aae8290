"""The engine adapter contract: one subclass per serving-engine dialect (vllm.py, sglang.py).

An adapter knows one dialect and nothing else. It

* builds the launch argv + env from a flag dict, with the real spellings of the *installed*
  engine version, discovered from the engine's own ``--help`` (read once per install);
* maps portable knobs (``memory_fraction``, ``max_running``, ``batched_tokens``,
  ``context_len``, ``cuda_graph_max_bs``) to that dialect's flags;
* refuses unknown flags before any launch, naming the closest valid spelling;
* says where readiness is polled, turns log lines into :class:`LogEvent` s, turns a failed start
  into an :class:`~autotune.outcomes.Outcome`, and reads ``/metrics`` deltas into engine facts.

Adapters never import the engine: it runs under its own Python (``EngineSettings.python``) or
an explicit launch command (``EngineSettings.command``). Adapters never start processes either
(except the short ``--help`` probe); the runtime supervisor does that.

Flag dicts use canonical long names with dashes: ``{"--max-num-seqs": 64, "--enforce-eager": True}``.
"""

from __future__ import annotations

import datetime
import difflib
import json
import os
import re
import shlex
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from autotune.config import EngineSettings
from autotune.engines.helpcache import HelpCache
from autotune.errors import InvalidFlags
from autotune.outcomes import Outcome

if TYPE_CHECKING:  # drift.py builds on this module's FlagSet
    from autotune.engines.drift import EnvChange, FlagChange

__all__ = [
    "STARTUP_FATAL",
    "ContainerImage",
    "EngineAdapter",
    "EventKind",
    "FlagSet",
    "LaunchSpec",
    "LogEvent",
    "MemorySemantics",
    "WeightDaemon",
    "canonical_flag",
    "counter_delta",
    "deprecation_notes",
    "flag_words",
    "flags_text",
    "metric_max",
    "metric_sum",
    "parse_help_flags",
    "samples_named",
    "split_sample_key",
    "startup_split",
    "version_tuple",
]


def flag_words(flags: Mapping[str, Any], known: FlagSet | None = None) -> list[str]:
    """Flag dict → argv tokens, as an engine reads them. Booleans: True → ``--x``; False →
    ``--no-x`` (when ``known`` is given, only where the engine has it, else omitted). Lists → one
    token per item (nargs=+). Dicts → JSON. None → left out (the engine's default)."""
    argv: list[str] = []
    for flag, value in flags.items():
        if value is None:
            continue
        if isinstance(value, bool):
            negated = "--no-" + flag[2:]
            if value:
                argv.append(flag)
            elif known is None or negated in known:
                argv.append(negated)
            continue
        argv.append(flag)
        if isinstance(value, (list, tuple)):
            argv.extend(str(v) for v in value)
        elif isinstance(value, dict):
            argv.append(json.dumps(value, separators=(",", ":")))
        else:
            argv.append(str(value))
    return argv


def flags_text(flags: Mapping[str, Any]) -> str:
    """Flags as one shell-quoted command-line fragment (what a person pastes after the command)."""
    return shlex.join(flag_words(flags))


class EventKind(StrEnum):
    """What a log line told us. ``data`` on the event carries the parsed numbers."""

    VERSION = "version"  # data: version
    NON_DEFAULT_ARGS = "non_default_args"  # data: args (dict as logged)
    KV_CAPACITY = "kv_capacity"  # data: kv_tokens, max_concurrency?, context_len?, headroom_gib?
    GRAPH_CAPTURE = "graph_capture"  # data: seconds?, gib?
    READY = "ready"
    OOM_STARTUP = "oom_startup"
    KV_INSUFFICIENT = "kv_insufficient"  # data: max_len_estimate? (when the engine quotes one)
    OOM_RUNTIME = "oom_runtime"
    INVALID_ARGS = "invalid_args"  # argparse / pydantic validation errors
    PORT_IN_USE = "port_in_use"
    FATAL = "fatal"  # the engine said it is dead (runtime engine-core death etc.)
    PREEMPTION = "preemption"  # vLLM never logs these; SGLang retraction warnings land here
    DECODE_BATCH = "decode_batch"  # SGLang periodic line: running, token_usage, cuda_graph, queue
    WORKER_DIED = "worker_died"  # data: worker, exit_code (None when unknown), signal? (e.g. "SIGILL")
    EXCEPTION = "exception"  # data: type, message — an exception line that is not a known wrapper
    IN_FLIGHT = "in_flight"  # data: running?, waiting?, prompt_lens? — the engine's dump at its death
    # data: phase ("weights", "compile", "init"), seconds; weights: source ("disk", or
    # "daemon:<mode>" when mapped from a weight cache); phase "compile_source": warm (a graph
    # loaded from the compile cache) or not (compiled)
    STARTUP_PHASE = "startup_phase"
    COMPILE_CACHE = "compile_cache"  # data: path — where the engine keeps its compiled artifacts
    GRAPH_DISPATCH = "graph_dispatch"  # data: tokens, mode ("NONE": no graph), count — steps of one shape


# Events that end the wait for readiness at once: the engine will not become ready.
STARTUP_FATAL = frozenset(
    {
        EventKind.OOM_STARTUP,
        EventKind.KV_INSUFFICIENT,
        EventKind.INVALID_ARGS,
        EventKind.PORT_IN_USE,
        EventKind.FATAL,
        EventKind.WORKER_DIED,
    }
)


@dataclass(frozen=True)
class LogEvent:
    kind: EventKind
    line: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one engine and to reproduce it in a script."""

    argv: list[str]
    env: dict[str, str]  # only what autotune adds on top of the user's environment
    host: str
    port: int
    ready_path: str  # polled until 200
    ready_fallback: str | None = None  # polled instead when ready_path answers 404 (not served)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class WeightDaemon:
    """A weight-cache daemon's launch, and what an engine adds to map its weights from it.

    Attributes:
        argv: The daemon's full command line.
        env: Variables autotune adds to the user's environment (as for an engine).
        ready_url: Polled until it answers 200: the daemon holds the weights and serves. None
            where the daemon serves no HTTP and ``ready_check`` says instead.
        key: What the daemon's weights are valid for (checkpoint, parallelism, dtypes,
            quantization); an engine whose key differs loads its own weights.
        client_flags: Flags an engine with the same key adds to map the daemon's weights.
        mode: How the engine maps them: ``zero_copy`` (the daemon's memory counts inside the
            engine's memory budget) or ``copy`` (the engine holds its own copy besides).
        client_env: Variables such an engine adds to find the daemon (its socket's folder).
        ready_check: True once the daemon serves, for a daemon with no ``ready_url``.
    """

    argv: list[str]
    env: dict[str, str]
    ready_url: str | None
    key: tuple[tuple[str, str], ...]
    client_flags: dict[str, Any]
    mode: str
    client_env: dict[str, str] = field(default_factory=dict)
    ready_check: Callable[[], bool] | None = None


@dataclass(frozen=True)
class MemorySemantics:
    """What the memory knob means on the installed engine, for the memory-edge stage.

    Attributes:
        start: The lowest value worth probing first (the stage starts at the space's low end or
            here, whichever is higher).
        ceiling: The highest meaningful value, or None for the space's own high end.
        note: One line for the log: what the knob sizes on this version.
    """

    start: float
    ceiling: float | None
    note: str


@dataclass(frozen=True)
class ContainerImage:
    """An engine's official image: ``repo:tag`` (``tag`` formats ``{version}``), serving on ``port``."""

    repo: str
    tag: str
    port: int


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.34.1+cpu"`` → ``(0, 34, 1)``: the release, without a local suffix."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


@dataclass(frozen=True)
class FlagSet:
    """The long options the installed engine accepts (from its --help)."""

    flags: frozenset[str]
    version: str | None = None
    #: flag → the sentence of its help that says it is deprecated (:func:`deprecation_notes`)
    deprecated: Mapping[str, str] = field(default_factory=dict)

    def __contains__(self, flag: object) -> bool:
        return flag in self.flags

    def closest(self, flag: str) -> str | None:
        match = difflib.get_close_matches(flag, sorted(self.flags), n=1, cutoff=0.6)
        return match[0] if match else None


def _fold_json_flag(out: dict[str, Any], key: str, value: Any) -> None:
    """``speculative_config.method: ngram`` → ``out["--speculative-config"]["method"] = "ngram"``.

    A JSON-valued flag (vLLM's ``--speculative-config``, ``--compilation-config``) is one flag but
    several knobs: a search space names each field ``<flag>.<field>`` so each can be sampled and
    made conditional on its own. ``None`` (``null`` in YAML, e.g. "no speculative decoding") leaves
    the field out, and a flag left with no field is not sent at all.
    """
    name, field = key.split(".", 1)
    flag = canonical_flag(name)
    fields = dict(out.pop(flag, None) or {})  # a copy: a fixed dict of the same flag is merged, not mutated
    if value is not None:
        fields[field] = value
    if fields:
        out[flag] = fields


def canonical_flag(name: str) -> str:
    """``max_num_seqs`` / ``--max_num_seqs`` / ``--max-num-seqs`` → ``--max-num-seqs``."""
    bare = name.lstrip("-").replace("_", "-")
    return f"--{bare}"


_LONG_OPTION = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")
# argparse indents declarations by 2 (a little more in nested groups) and help prose at the help
# column (24 by default); prose lines may start with a flag, declarations never sit that deep.
_MAX_DECLARATION_INDENT = 6


def parse_help_flags(help_text: str) -> frozenset[str]:
    """Every ``--long-option`` an argparse help text declares (``--x`` / ``--no-x`` both kept).

    Reads both the ``usage:`` block (which lists every option, even where the engine prints
    only some groups' details, as vLLM's plain ``--help`` does) and the indented declaration
    lines; help prose that mentions flags is ignored.
    """
    found: set[str] = set()
    in_usage = False
    for line in help_text.splitlines():
        if line.startswith("usage:"):
            in_usage = True
        elif not line.strip():
            in_usage = False
        stripped = line.lstrip()
        if in_usage:
            found.update(_LONG_OPTION.findall(line))
        elif stripped.startswith("-") and len(line) - len(stripped) <= _MAX_DECLARATION_INDENT:
            # The declaration ends where the help text starts (two or more spaces).
            found.update(_declared_options(stripped.split("  ")[0]))
    return frozenset(found)


_OPTION = re.compile(r"--[a-z0-9][a-z0-9-]*")
_METAVAR_START = re.compile(r"[A-Z{\[<]")


def _declared_options(declaration: str) -> list[str]:
    """Long options of one declaration such as ``--port PORT, -p PORT`` or ``--x, --no-x``.

    Each comma-separated item must be an option optionally followed by a metavar; this keeps
    out example lines of an epilog (``--json-arg.key1 value1``, ``--json-arg '{...}'``).
    """
    options = []
    for item in declaration.split(", "):
        tokens = item.split(" ", 2)
        if _OPTION.fullmatch(tokens[0]) and (len(tokens) == 1 or _METAVAR_START.match(tokens[1])):
            options.append(tokens[0])
    return options


_OWN_DEPRECATION = re.compile(r"^\(?\[?deprecated\b", re.IGNORECASE)
# "... as given. Deprecated with model runner V2, which ..." (vLLM 0.34): a sentence of its own.
_DEPRECATED_SENTENCE = re.compile(r"(?<=[.:)]\s)\(?\[?Deprecated\b")


def deprecation_notes(help_text: str) -> dict[str, str]:
    """flag → the sentence of its help that says it is deprecated.

    A flag counts as deprecated when its help starts so ("Deprecated. Use …", "(Deprecated, use
    …)"), names the flag itself as deprecated ("--log-config-file is deprecated …"), or has a
    sentence of its own that starts so ("… as given. Deprecated with model runner V2"); prose
    about something else that is deprecated does not count.
    """
    notes: dict[str, str] = {}
    for flags, prose in _help_entries(help_text):
        text = " ".join(prose.split())
        for flag in flags:
            if _OWN_DEPRECATION.match(text) or re.search(rf"{re.escape(flag)} is deprecated", text):
                notes[flag] = _first_sentences(text)
            elif later := _DEPRECATED_SENTENCE.search(text):
                notes[flag] = _first_sentences(text[later.start() :])
    return notes


def _help_entries(help_text: str) -> list[tuple[list[str], str]]:
    """(long options, help prose) of each option the help details."""
    entries: list[tuple[list[str], str]] = []
    for line in help_text.splitlines():
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if stripped.startswith("-") and indent <= _MAX_DECLARATION_INDENT:
            declaration, _, prose = stripped.partition("  ")
            flags = re.findall(r"--[a-z0-9][a-z0-9-]*", declaration)
            entries.append((flags, prose))
        elif entries and stripped and indent > _MAX_DECLARATION_INDENT:
            flags, prose = entries[-1]
            entries[-1] = (flags, f"{prose} {stripped}")
        elif not stripped or indent <= _MAX_DECLARATION_INDENT:
            entries.append(([], ""))  # a group header or a blank line ends the option's prose
    return [(flags, prose.strip()) for flags, prose in entries if flags]


def _first_sentences(text: str, limit: int = 200) -> str:
    """The prose up to its second sentence, at most ``limit`` characters."""
    cut = re.split(r"(?<=[.)])\s+(?=[A-Z(])", text)
    kept = " ".join(cut[:2])
    return kept if len(kept) <= limit else kept[: limit - 1] + "…"


_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_LABEL_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def split_sample_key(key: str) -> tuple[str, dict[str, str]]:
    """Split a flat ``/metrics`` sample key into its name and labels.

    Example:
        ``split_sample_key('vllm:cache_config_info{block_size="128",engine="0"}')`` gives
        ``("vllm:cache_config_info", {"block_size": "128", "engine": "0"})``.
    """
    name, brace, rest = key.partition("{")
    if not brace:
        return key, {}
    return name, {k: re.sub(r'\\[\\"n]', lambda m: _LABEL_ESCAPES[m.group(0)], v) for k, v in _LABEL.findall(rest)}


def samples_named(samples: Mapping[str, float], name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of metric ``name`` (any labels) as ``(labels, value)`` pairs."""
    out = []
    for key, value in samples.items():
        sample_name, labels = split_sample_key(key)
        if sample_name == name:
            out.append((labels, value))
    return out


def metric_sum(samples: Mapping[str, float], name: str) -> float | None:
    """A metric summed over all its label sets (TP/DP ranks, engines); None when absent."""
    values = [value for _, value in samples_named(samples, name)]
    return sum(values) if values else None


def metric_max(samples: Mapping[str, float], name: str) -> float | None:
    """A metric's largest value over its label sets; None when absent."""
    values = [value for _, value in samples_named(samples, name)]
    return max(values) if values else None


def counter_delta(before: Mapping[str, float], after: Mapping[str, float], name: str) -> float | None:
    """How much a counter (summed over label sets) grew between two reads; None when absent."""
    end = metric_sum(after, name)
    if end is None:
        return None
    start = metric_sum(before, name) or 0.0
    # A smaller value means the counter restarted (a new engine): count from zero.
    return end if end < start else end - start


def startup_split(events: Iterable[LogEvent]) -> dict[str, Any]:
    """Where the engine's start-up went, from its own log lines (seconds as the engine logged
    them; the simulator logs modelled seconds): ``weights_s``, ``compile_s``, ``capture_s`` and
    ``init_s`` (vLLM's engine init: profiling, KV cache and warm-up, compile and capture
    included), whether compile came from the cache (``compile_warm``), where the weights came
    from (``weights_from``) and the compile cache's directory. Ranks load in parallel: the
    slowest counts; a compile logged in pieces (one per graph) adds up."""
    split: dict[str, Any] = {}
    for event in events:
        data = event.data
        if event.kind == EventKind.GRAPH_CAPTURE and "seconds" in data:
            split["capture_s"] = round(split.get("capture_s", 0.0) + data["seconds"], 3)
        elif event.kind == EventKind.COMPILE_CACHE:
            split.setdefault("compile_cache", data["path"])
        elif event.kind == EventKind.STARTUP_PHASE:
            _add_phase(split, data)
    split.pop("_compile_from", None)  # a warm-up the log never closed
    return split


def _add_phase(split: dict[str, Any], data: Mapping[str, Any]) -> None:
    phase, seconds = data["phase"], float(data.get("seconds", 0.0))
    if phase == "weights":
        split["weights_s"] = round(max(split.get("weights_s", 0.0), seconds), 3)
        if "source" in data:
            split["weights_from"] = data["source"]
        else:
            split.setdefault("weights_from", "disk")
    elif phase == "compile":
        split["compile_s"] = round(split.get("compile_s", 0.0) + seconds, 3)
    elif phase == "compile_source":  # one graph loaded from the cache, or compiled: cold wins
        split["compile_warm"] = bool(data["warm"]) and split.get("compile_warm", True)
    elif phase == "compile_start":
        split["_compile_from"] = data["at"]
    elif phase == "compile_end" and "_compile_from" in split:  # a warm-up that compiles, timed by its log lines
        seconds = _seconds_between(split.pop("_compile_from"), data["at"])
        split["compile_s"] = round(split.get("compile_s", 0.0) + seconds, 3)
    elif phase == "init":
        split["init_s"] = round(seconds, 3)
        if "compile_s" in data and "compile_s" not in split:
            split["compile_s"] = round(float(data["compile_s"]), 3)


def _seconds_between(start: str, end: str) -> float:
    """Seconds between two ``MM-DD HH:MM:SS`` log stamps of one start-up (across midnight too)."""
    a, b = (datetime.datetime.strptime(f"2000-{t}", "%Y-%m-%d %H:%M:%S") for t in (start, end))
    return max((b - a).total_seconds() % 86400, 0.0)


class EngineAdapter(ABC):
    """Base of every dialect. Subclasses set the class attributes and the abstract methods."""

    name: ClassVar[str]
    title: ClassVar[str]  # as the engine spells itself: vLLM, SGLang
    default_module: ClassVar[str]  # run as `<python> -m <module>` when no command is configured
    #: portable knob → this dialect's flag (a knob missing here is not tunable on this engine)
    knobs: ClassVar[Mapping[str, str]]
    #: arguments that make the engine print every flag it accepts
    help_args: ClassVar[tuple[str, ...]] = ("--help",)
    #: liveness after readiness (vLLM: 503 once the engine core is dead)
    health_path: ClassVar[str] = "/health"
    #: ``/metrics`` gauges sampled during a run: fact → gauge names (each sample takes the largest,
    #: so of several pools the tightest counts). Facts: ``token_usage`` (0–1), ``queue``, ``running``.
    sampled_gauges: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: the engine's official container image, and its CPU release where one exists
    image: ClassVar[ContainerImage | None] = None
    cpu_image: ClassVar[ContainerImage | None] = None
    #: the command before the engine's args in that image (empty: the image's entry point serves)
    container_command: ClassVar[tuple[str, ...]] = ()
    #: every spelling the engine accepts of the parallel sizes whose product is its GPU count
    parallel_flags: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: the engine's Python package (its release and sources are read from it, never imported)
    package: ClassVar[str]
    #: flags renamed or deprecated by a release, and variables a release stopped reading (drift.py)
    flag_changes: ClassVar[tuple[FlagChange, ...]] = ()
    env_changes: ClassVar[tuple[EnvChange, ...]] = ()
    #: the prefixes of the engine's own environment variables
    env_prefixes: ClassVar[tuple[str, ...]] = ()
    #: what every launch's environment gets from the tuner (the user's ``engine.env`` wins)
    launch_env: ClassVar[Mapping[str, str]] = {}
    #: flags newer than the oldest release the adapter speaks: flag → the first release with it
    flags_since: ClassVar[Mapping[str, str]] = {}

    def __init__(self, settings: EngineSettings):
        self.settings = settings
        self._flagset: FlagSet | None = None

    def api_key(self) -> str | None:
        """The engine's API key, read from the environment variable the settings name (never stored)."""
        name = self.settings.api_key_env
        return os.environ.get(name) if name else None

    def runs_on_cpu(self) -> bool:
        """Whether the installed engine computes on this host's CPUs (then it competes with the
        load generator for cores, and the tuner partitions them). GPU engines: False."""
        return False

    def pinned_kv_pool(self, flags: Mapping[str, Any]) -> str | None:
        """Why the memory fraction sizes no KV cache with these (canonical) flags and the
        engine's environment, or None when it does. Engines with no such setting: None."""
        return None

    def memory_semantics(self, version: str | None) -> MemorySemantics:
        """What the ``memory_fraction`` knob sizes on this engine ``version`` (None: unknown)."""
        return MemorySemantics(0.80, None, f"{self.name}: probing the memory fraction")

    # ------------------------------------------------------------------- weight-cache daemon
    def weight_cache_unsupported(self, version: str | None) -> str | None:
        """Why this engine ``version`` cannot map its weights from a daemon that outlives it
        (None when it can). Never assumed: an unknown version cannot."""
        return f"{self.name} {version or '(version unknown)'} has no weight-cache daemon autotune drives"

    def weight_cache_conflict(self, flags: Mapping[str, Any]) -> str | None:
        """Why an engine launched with ``flags`` cannot map its weights from a daemon (it then
        loads them itself), or None."""
        return None

    def weight_daemon(self, flags: Mapping[str, Any], socket_dir: Path, port: int) -> WeightDaemon:
        """The daemon that holds the weights engines launched with ``flags`` load."""
        raise NotImplementedError(f"{self.name}: no weight-cache daemon")

    def served_facts(self, base_url: str) -> dict[str, Any]:
        """Facts the running engine reports about itself over HTTP (its version, where its log
        has no version line), read once while it serves; the log's facts win where both say."""
        return {}

    def measurement_env(self) -> dict[str, str]:
        """Environment the tuner adds to its own trials because it changes nothing measured but
        keeps the measurement sound (recorded with each trial, left out of exports)."""
        return {}

    def measurement_flags(self) -> dict[str, Any]:
        """Flags the tuner adds to its own trials to observe the engine (changing nothing it
        measures): recorded with each trial, left out of exports; the trial's own flags win."""
        return {}

    # ------------------------------------------------------------------------- launch command
    def launch_prefix(self) -> list[str]:
        """The command before the flags: the configured command, or `<python> -m <module>`."""
        if self.settings.command:
            return list(self.settings.command)
        python = self.settings.python or "python3"
        return [python, "-m", self.default_module]

    def discover_flags(self, timeout_s: float = 120.0) -> FlagSet:
        """The long options the installed engine's --help declares: read once per install
        (helpcache.py), then kept by this adapter."""
        if self._flagset is None:
            argv = [*self.launch_prefix(), *self.help_args]
            cache = None if self.settings.command else HelpCache.for_engine(self.settings.python, argv)
            text = cache.read() if cache else None
            if not text:  # none kept, or a file left empty by a full disk: read it again
                text = self._run_help(argv, timeout_s)
                if cache:
                    cache.write(text)
            self._flagset = FlagSet(
                flags=parse_help_flags(text), version=self.version_from_help(text), deprecated=deprecation_notes(text)
            )
        return self._flagset

    def _run_help(self, argv: list[str], timeout_s: float) -> str:
        env = {**os.environ, **self.settings.env}
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
        except FileNotFoundError:
            given = "command" if self.settings.command else "python"  # the one the user set
            given = f"--{given} (engine.{given} in a config file)"
            raise InvalidFlags(
                f"engine command not found: {argv[0]!r}; point {given} at the engine's installed Python or launcher"
            ) from None
        except subprocess.TimeoutExpired:
            raise InvalidFlags(f"`{' '.join(argv)}` did not answer within {timeout_s:.0f}s") from None
        if proc.returncode != 0 or not parse_help_flags(proc.stdout):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise InvalidFlags(
                f"`{' '.join(argv)}` failed (exit {proc.returncode}): {tail[0][:200]}; "
                "check engine.python / engine.command"
            )
        return proc.stdout

    def version_from_help(self, help_text: str) -> str | None:
        """Engines rarely print their version in --help; subclasses may find it elsewhere."""
        return None

    # --------------------------------------------------------------------------------- flags
    def parallel_size(self, flags: Mapping[str, Any], knob: str) -> int | None:
        """The parallel size ``knob`` (``tensor_parallel``, ``pipeline_parallel``,
        ``data_parallel``) the flags set under any of its spellings; None when unset."""
        return next((int(flags[f]) for f in self.parallel_flags.get(knob, ()) if flags.get(f) is not None), None)

    def gpu_count(self, flags: Mapping[str, Any]) -> int:
        """GPUs an engine launched with ``flags`` uses: TP × PP × DP (1 when none is set)."""
        count = 1
        for knob in self.parallel_flags:
            count *= self.parallel_size(flags, knob) or 1
        return count

    def to_flags(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Portable knobs and raw flag names → canonical dialect flags. A knob this dialect has
        no flag for is a ConfigError-grade problem and raises InvalidFlags."""
        out: dict[str, Any] = {}
        for key, value in params.items():
            if "." in key:
                _fold_json_flag(out, key, value)
            elif key in self.knobs:
                out[self.knobs[key]] = value
            elif key.startswith("-") or "_" in key or "-" in key or self._is_engine_flag(key):
                out[canonical_flag(key)] = value
            else:
                raise InvalidFlags(
                    f"knob {key!r} has no {self.name} flag; portable knobs: {', '.join(sorted(self.knobs))}"
                )
        return out

    def flag_for(self, name: str) -> str:
        """The flag a space parameter sets, read without the installed help: a knob's flag, a
        JSON field's flag (``speculative_config.method`` → ``--speculative-config``), or the name."""
        return self.knobs.get(name) or canonical_flag(name.split(".", 1)[0])

    def offers(self, name: str, known: FlagSet) -> bool:
        """Whether a release whose help gave ``known`` has the space parameter ``name``."""
        return self.flag_for(name) in known

    def _is_engine_flag(self, word: str) -> bool:
        """A one-word raw flag such as ``dtype``: accepted when the installed engine has ``--dtype``
        (a one-word name is otherwise more likely a misspelt knob, refused with the knob list)."""
        try:
            return canonical_flag(word) in self.discover_flags()
        except InvalidFlags:  # an engine that cannot print its help is reported by validate_flags
            return False

    def validate_flags(self, flags: Iterable[str]) -> None:
        """Raise InvalidFlags (before any launch) for a flag the installed engine does not have."""
        known = self.discover_flags()
        for flag in flags:
            if flag not in known:
                hint = known.closest(flag)
                fix = f"did you mean {hint}?" if hint else f"see `{' '.join(self.launch_prefix())} --help`"
                raise InvalidFlags(f"{self.name} does not accept {flag}: {fix}")

    def render_flags(self, flags: Mapping[str, Any]) -> list[str]:
        """Flag dict → argv tokens (:func:`flag_words`), ``--no-x`` only where the engine has it."""
        return flag_words(flags, self._flagset)

    @abstractmethod
    def build_launch(self, flags: Mapping[str, Any], port: int) -> LaunchSpec:
        """The full launch for these (already canonical, validated) flags on this port."""

    # ------------------------------------------------------------------------ observing
    @abstractmethod
    def parse_log_line(self, line: str) -> LogEvent | None:
        """Turn one engine log line into an event, or None when it says nothing we use."""

    def watch_log(self, events: list[LogEvent]) -> Callable[[str], bool]:
        """An ``on_line`` for :class:`~autotune.runtime.process.EngineProcess`: each line this
        adapter understands is appended to ``events``; True when it ends the start-up wait."""

        def on_line(line: str) -> bool:
            event = self.parse_log_line(line)
            if event is None:
                return False
            events.append(event)
            return event.kind in STARTUP_FATAL

        return on_line

    @abstractmethod
    def classify_failure(self, returncode: int | None, events: list[LogEvent]) -> Outcome:
        """Outcome of a launch that never became ready (exit code and the events seen)."""

    @abstractmethod
    def engine_facts(
        self, events: list[LogEvent], before: Mapping[str, float], after: Mapping[str, float]
    ) -> dict[str, Any]:
        """Facts about a served trial: KV tokens, max concurrency, preemptions, KV usage peak ...

        ``before``/``after`` are flat ``/metrics`` samples (name{labels} → value) around the run.
        """
