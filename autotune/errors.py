"""One tree of errors, each with a one-line message that says what failed and how to fix it.

    AutotuneError
    ├── ConfigError            bad YAML, unknown field, bad range, bad flag value (exit 2)
    ├── EngineError            the engine could not be used
    │   ├── InvalidFlags       a flag the installed engine does not have (caught before launch)
    │   ├── EngineStartupError the engine exited before it became ready
    │   ├── StartupTimeout     the engine did not become ready in time
    │   ├── EngineCrashed      the engine died (or answered 503) after it was ready
    │   └── TeardownError      processes of the engine's group outlived the kill
    ├── BenchmarkError         the load generator could not run the workload
    └── StudyError             the Optuna storage could not be opened or written

The CLI catches AutotuneError in one place, prints the message on one line and exits 2 for
ConfigError/InvalidFlags and 1 for the others; tracebacks appear only with --debug.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "AutotuneError",
    "BenchmarkError",
    "ClientLimited",
    "ConfigError",
    "EngineCrashed",
    "EngineError",
    "EngineFailsRegardless",
    "EngineStartupError",
    "HostDisturbed",
    "InvalidFlags",
    "StartupTimeout",
    "StudyError",
    "TeardownError",
]


class AutotuneError(Exception):
    """Base of every error autotune raises on purpose."""

    exit_code = 1


class ConfigError(AutotuneError):
    """A configuration file, field or command-line option is wrong; nothing was started."""

    exit_code = 2


class EngineError(AutotuneError):
    """The engine could not be started or used.

    Carries what a user needs to look further: the exit code and the log path.
    """

    def __init__(self, message: str, *, returncode: int | None = None, log_path: Path | None = None):
        super().__init__(message)
        self.returncode = returncode
        self.log_path = log_path


class InvalidFlags(EngineError):
    """A flag is unknown to the installed engine (found from its --help before any launch)."""

    exit_code = 2


class EngineStartupError(EngineError):
    """The engine exited before it became ready."""


class StartupTimeout(EngineError):
    """The engine stayed alive but did not become ready before the deadline."""


class EngineCrashed(EngineError):
    """The engine died or turned unhealthy after it was ready."""


class TeardownError(EngineError):
    """Processes of the engine's group survived SIGTERM and SIGKILL (their PIDs are in the message)."""


class BenchmarkError(AutotuneError):
    """The load generator could not run (server unreachable, tokenizer endpoint missing, ...)."""


class ClientLimited(BenchmarkError):
    """Every run of a trial was limited by the client (its self-check, or client-side failures)."""


class HostDisturbed(BenchmarkError):
    """Every run of a trial shared the engine's cores with other processes (autotune/runtime/hostshare.py)."""


class StudyError(AutotuneError):
    """The Optuna storage could not be opened, created or written."""


class EngineFailsRegardless(AutotuneError):
    """The engine fails the same way under different flags: tuning its flags cannot help.

    Raised after the trials that show it are recorded; the study keeps them, and its
    ``stopped`` attribute holds the diagnosis for ``status`` and the report.
    """
