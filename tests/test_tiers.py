"""The tiers hold: a unit test that starts a process or opens a network socket fails, naming it;
a test is in one tier; an unmarked test is a unit test."""

from __future__ import annotations

import socket
import subprocess

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
