"""What the tuning loop tells its observer. The library never prints: the CLI renders these."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["NullProgress", "Progress"]


class Progress(Protocol):
    def study_started(self, study: str, total: int, done: int) -> None: ...
    def trial_started(self, number: int, stage: str, params: dict[str, Any]) -> None: ...
    def phase(self, name: str) -> None: ...  # launching | warming | benchmarking | tearing down
    def bench_progress(self, completed: int, total: int, output_tps: float) -> None: ...
    def trial_finished(self, summary: dict[str, Any]) -> None: ...
    def message(self, text: str) -> None: ...


class NullProgress:
    """Silent observer (library use, tests)."""

    def study_started(self, study: str, total: int, done: int) -> None:
        pass

    def trial_started(self, number: int, stage: str, params: dict[str, Any]) -> None:
        pass

    def phase(self, name: str) -> None:
        pass

    def bench_progress(self, completed: int, total: int, output_tps: float) -> None:
        pass

    def trial_finished(self, summary: dict[str, Any]) -> None:
        pass

    def message(self, text: str) -> None:
        pass
