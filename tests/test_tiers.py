"""The tiers hold: a unit test that starts a process or opens a network socket fails, naming it;
a test is in one tier; an unmarked test is a unit test."""

from __future__ import annotations

import socket
import subprocess
import threading

import pytest
from tiers import TierViolation, unit_guard

CONFTEST = "from tiers import *  # noqa: F403 (the hooks under test)\n"


def test_the_guard_refuses_a_process_before_it_starts() -> None:
    seen: list[str] = []
    with unit_guard(seen), pytest.raises(TierViolation, match=r"started a process \(\['true'\]"):
        subprocess.run(["true"], check=True)
    assert len(seen) == 1 and "mark the test @pytest.mark.sim" in seen[0]


def test_the_guard_refuses_a_network_socket_but_not_a_local_pair() -> None:
    seen: list[str] = []
    with unit_guard(seen):
        left, right = socket.socketpair()  # in-process plumbing (asyncio's own) stays allowed
        left.close(), right.close()
        with socket.socket() as sock, pytest.raises(TierViolation, match="bind a network socket"):
            sock.bind(("127.0.0.1", 0))
    assert len(seen) == 1


def _bind_in_a_thread(start: threading.Event, errors: list[Exception]) -> threading.Thread:
    def bind() -> None:
        start.wait(10)
        try:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
        except Exception as exc:  # recorded for the test to read
            errors.append(exc)

    thread = threading.Thread(target=bind)
    thread.start()
    return thread


def test_a_thread_the_test_starts_is_refused_too() -> None:
    seen: list[str] = []
    errors: list[Exception] = []
    with unit_guard(seen):
        start = threading.Event()
        start.set()
        _bind_in_a_thread(start, errors).join(10)
    assert [type(error) for error in errors] == [TierViolation] and len(seen) == 1


@pytest.mark.sim  # the thread binds a socket for real
def test_a_thread_an_earlier_test_left_running_is_neither_refused_nor_blamed() -> None:
    # A poller of an earlier sim test, finishing its last scrape while a unit test runs.
    seen: list[str] = []
    errors: list[Exception] = []
    start = threading.Event()
    earlier = _bind_in_a_thread(start, errors)
    with unit_guard(seen):
        start.set()
        earlier.join(10)
    assert not errors and not seen


@pytest.mark.sim  # checks that processes and sockets work again after the guard
def test_outside_the_guard_nothing_is_refused() -> None:
    with unit_guard([]):
        pass
    assert subprocess.run(["true"], check=False).returncode == 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))


@pytest.mark.sim  # the inner session's sim test starts a process
def test_an_unmarked_test_that_swallows_the_refusal_still_fails(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        """
        import contextlib, subprocess, pytest

        def test_hides_it():
            with contextlib.suppress(Exception):
                subprocess.run(["true"])

        @pytest.mark.sim
        def test_marked_sim():
            subprocess.run(["true"], check=True)

        def test_pure():
            assert sum([1, 2]) == 3
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*a unit test started a process*mark the test @pytest.mark.sim*"])
    assert pytester.runpytest_inprocess("-m", "unit", "-p", "no:cacheprovider").parseoutcomes()["deselected"] == 1


def test_two_tiers_on_one_test_are_refused(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.sim
        @pytest.mark.real_engine
        def test_both():
            pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*marked sim and real_engine; a test is in one tier*"])
