"""What an engine release changed about a launch: flags renamed, deprecated or removed, and
environment variables it stopped reading — the check a tuned launch gets before it runs on a new
release (``autotune recheck``).

Each verdict comes from the new release itself where it can: its ``--help`` (a flag it no longer
lists is removed; help prose that says a flag is deprecated is quoted) and its installed package
(an ``VLLM_*`` / ``SGLANG_*`` variable no file of it names is no longer read). The adapters'
tables (:class:`FlagChange`, :class:`EnvChange`) add what the help cannot say: which flag
replaces a removed one, and variables still named in the package but ignored.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autotune.engines.base import EngineAdapter, FlagSet, version_tuple

__all__ = [
    "EngineInstall",
    "EnvChange",
    "Finding",
    "FlagChange",
    "FlagReport",
    "check_launch",
    "engine_install",
    "installed",
    "launch_report",
]


@dataclass(frozen=True)
class FlagChange:
    """One flag that was renamed or deprecated, with the releases that did it (read from each
    release's own parser).

    Which case applies is decided from the installed ``--help`` alone, flag by flag: both
    spellings listed is the deprecation window, only the new one means the old was removed.

    Attributes:
        old: The old spelling.
        new: The flag that replaces it.
        since: The first release with ``new`` (and with ``old`` deprecated).
        removed_in: The first release without ``old`` (passing it is then an error), if any.
        advice: How to write the replacement, when it is more than the new flag itself.
        knob: The portable knob that spells the right flag on every version, if there is one.
        replace: The flags that say what ``old`` said when it was switched on, where the new
            spelling is not one flag with the same value (a bool that became a choice).
    """

    old: str
    new: str
    since: str
    removed_in: str | None = None
    advice: str = ""
    knob: str | None = None
    replace: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EnvChange:
    """An environment variable a release stopped reading, and the flag that replaces it.

    Attributes:
        name: The variable.
        flag: The flag that replaces it (its value carried over), if any.
        since: The first release that ignores it, for a variable its package still names; None
            when the release's sources decide (no file of it names the variable).
    """

    name: str
    flag: str | None = None
    since: str | None = None


Verdict = Literal["kept", "renamed", "deprecated", "removed", "ignored"]


@dataclass(frozen=True)
class Finding:
    """What the new release makes of one flag or variable of the launch."""

    subject: str
    verdict: Verdict
    line: str


@dataclass
class FlagReport:
    """The launch's flags and environment checked against a release, and the launch translated
    to it (renamed flags respelt, removed or unread ones left out)."""

    engine: str
    version: str | None
    findings: list[Finding]
    flags: dict[str, Any]
    env: dict[str, str]

    @property
    def changed(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict != "kept"]

    def lines(self) -> list[str]:
        """One line per flag or variable the release changed, and a summary line."""
        kept = sum(f.verdict == "kept" for f in self.findings)
        release = f"{self.engine} {self.version or '(version unknown)'}"
        head = f"{release}: {kept} of {len(self.findings)} flags and variables unchanged"
        return [head + ("" if self.changed else "; nothing to translate"), *(f.line for f in self.changed)]


# ---------------------------------------------------------------------------- the installed engine
@dataclass(frozen=True)
class EngineInstall:
    """The engine package an interpreter has: its release and the folder of its sources."""

    version: str | None
    package_dir: Path | None

    def reads(self, variable: str) -> bool:
        """Whether any source file of the package names ``variable`` (an engine reads its
        variables by name: ``envs.py`` lists them, call sites use ``os.environ[...]``)."""
        if self.package_dir is None:
            return True  # nothing to read: never call a variable unread on no evidence
        needle = variable.encode()
        return any(needle in path.read_bytes() for path in self.package_dir.rglob("*.py"))


_PROBE = """
import importlib.metadata as m, importlib.util as u, json, sys
spec = u.find_spec(sys.argv[1])
dists = m.packages_distributions().get(sys.argv[1]) or [sys.argv[1]]
try:
    version = m.version(dists[0])
except m.PackageNotFoundError:
    version = None
folders = list(spec.submodule_search_locations or []) if spec else []
print(json.dumps({"version": version, "dir": folders[0] if folders else None}))
"""


def engine_install(python: str, package: str, timeout_s: float = 60.0) -> EngineInstall:
    """The release and source folder of ``package`` in ``python``'s environment, read from its
    metadata without importing it (importing vLLM takes seconds and a torch)."""
    try:
        proc = subprocess.run([python, "-c", _PROBE, package], capture_output=True, text=True, timeout=timeout_s)
        found = json.loads(proc.stdout) if proc.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        found = {}
    folder = found.get("dir")
    return EngineInstall(version=found.get("version"), package_dir=Path(folder) if folder else None)


# ------------------------------------------------------------------------------------- the check
@dataclass(frozen=True)
class _Release:
    engine: str
    known: FlagSet
    version: str | None
    changes: tuple[FlagChange, ...]

    def at_least(self, release: str) -> bool:
        return self.version is not None and version_tuple(self.version) >= version_tuple(release)


def check_launch(
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    *,
    engine: str,
    known: FlagSet,
    version: str | None,
    changes: tuple[FlagChange, ...] = (),
    env_changes: tuple[EnvChange, ...] = (),
    env_prefixes: tuple[str, ...] = (),
    reads: Callable[[str], bool] | None = None,
) -> FlagReport:
    """Check a launch's canonical ``flags`` and ``env`` against a release whose help gave
    ``known``; ``reads(name)`` says whether the release still names a variable (only variables
    with one of the engine's ``env_prefixes`` are checked: others are not the engine's)."""
    release = _Release(engine, known, version, changes)
    findings: list[Finding] = []
    out_flags: dict[str, Any] = {}
    for flag, value in flags.items():
        finding, translated = _check_flag(release, flag, value)
        findings.append(finding)
        for new_flag, new_value in translated.items():
            out_flags.setdefault(new_flag, new_value)
    out_env: dict[str, str] = {}
    for name, value in env.items():
        finding, carried = _check_env(release, name, value, env_changes, env_prefixes, reads)
        findings.append(finding)
        if finding.verdict not in ("ignored", "removed"):
            out_env[name] = value
        for new_flag, new_value in carried.items():
            out_flags.setdefault(new_flag, new_value)
    return FlagReport(engine, version, findings, out_flags, out_env)


def _check_flag(release: _Release, flag: str, value: Any) -> tuple[Finding, dict[str, Any]]:
    known, name = release.known, _name(release)
    change = next((c for c in release.changes if c.old == flag), None)
    replacement = _replacement(change, value, known) if change else None
    if flag in known:
        if change is not None and replacement is not None:
            line = f"{flag}: deprecated since {release.engine} {change.since}; written as {_words(replacement)}"
            return Finding(flag, "deprecated", line), replacement
        if note := known.deprecated.get(flag):
            line = f"{flag}: deprecated in {name}: {note.rstrip('.')}; kept as it is"
            return Finding(flag, "deprecated", line), {flag: value}
        return Finding(flag, "kept", f"{flag}: unchanged"), {flag: value}
    if change is not None and replacement is not None:
        removed = f", the old spelling removed in {change.removed_in}" if change.removed_in else ""
        line = f"{flag}: renamed in {release.engine} {change.since}{removed}; written as {_words(replacement)}"
        return Finding(flag, "renamed", line), replacement
    hint = f" ({change.advice or change.new} from {change.since})" if change else ""
    if not hint and (closest := known.closest(flag)):
        hint = f" (closest: {closest})"
    line = f"{flag}: not in {name}'s --help, so it was removed; left out{hint}"
    return Finding(flag, "removed", line), {}


def _replacement(change: FlagChange, value: Any, known: FlagSet) -> dict[str, Any] | None:
    """The flags that say what ``change.old`` = ``value`` said, when the release has them all."""
    if change.replace:
        if value is False or value is None:
            return {}
        return dict(change.replace) if all(f in known for f in change.replace) else None
    if change.advice or change.new not in known:
        return None  # not a plain respelling: said, not translated
    return {change.new: value}


def _check_env(
    release: _Release,
    name: str,
    value: str,
    env_changes: tuple[EnvChange, ...],
    prefixes: tuple[str, ...],
    reads: Callable[[str], bool] | None,
) -> tuple[Finding, dict[str, Any]]:
    if not prefixes or not name.startswith(prefixes):
        return Finding(name, "kept", f"{name}: not the engine's variable"), {}
    change = next((c for c in env_changes if c.name == name), None)
    unread = reads is not None and not reads(name)
    if change is not None and (release.at_least(change.since) if change.since else unread):
        when = f"since {release.engine} {change.since}" if change.since else f"by {_name(release)}"
        if change.flag and change.flag in release.known:
            line = f"{name}: ignored {when}; written as {change.flag} {value}"
            return Finding(name, "ignored", line), {change.flag: value}
        return Finding(name, "ignored", f"{name}: ignored {when}; left out"), {}
    if unread:
        return Finding(name, "removed", f"{name}: no file of {_name(release)} reads it any more; left out"), {}
    return Finding(name, "kept", f"{name}: unchanged"), {}


def _name(release: _Release) -> str:
    return f"{release.engine} {release.version}" if release.version else release.engine


def _words(flags: Mapping[str, Any]) -> str:
    return " ".join(f"{f}" if v is True else f"{f} {v}" for f, v in flags.items()) or "nothing"


def installed(adapter: EngineAdapter) -> EngineInstall:
    """The release ``adapter`` runs and its sources: read from the package of the engine's
    Python; a launch command has none to read, and the simulator speaks the release its
    environment names (unset: its default, not known here)."""
    settings = adapter.settings
    if settings.python and not settings.command:
        return engine_install(settings.python, adapter.package)
    simulated = settings.env.get(f"AUTOTUNE_SIM_{adapter.name.upper()}_VERSION") if settings.simulated else None
    return EngineInstall(version=simulated, package_dir=None)


def launch_report(adapter: EngineAdapter, flags: Mapping[str, Any], env: Mapping[str, str]) -> FlagReport:
    """A launch checked against the release ``adapter`` runs: its help for the flags, its
    installed package (when it runs under a Python) for its release and variables."""
    known = adapter.discover_flags()
    install = installed(adapter)
    return check_launch(
        flags,
        env,
        engine=adapter.title,
        known=known,
        version=known.version or install.version,
        changes=adapter.flag_changes,
        env_changes=adapter.env_changes,
        env_prefixes=adapter.env_prefixes,
        reads=install.reads,
    )
