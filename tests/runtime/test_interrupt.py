"""A stop signal swallowed by a finalizer is delivered again (autotune/runtime/interrupt.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.sim

# A SIGTERM that arrives while a finalizer runs: Python runs the handler there, its
# KeyboardInterrupt is printed as "Exception ignored" and dropped. The loop after it stands for the
# rest of a study; the process must still end on the interrupt path, not by finishing the loop.
SCRIPT = textwrap.dedent(
    """
    import gc, os, signal, sys, time
    from autotune.runtime import interrupt

    interrupt.install()

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.{sig})
            for _ in range(1000):  # bytecode boundaries: the handler runs here
                pass

    try:
        Finalized()
        gc.collect()
        print("swallowed", flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
        print("finished", flush=True)
    except KeyboardInterrupt:
        interrupt.acknowledge()
        print("interrupted", flush=True)
        sys.exit(130)
    """
)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_an_interrupt_swallowed_by_a_finalizer_still_stops_the_run(sig: str) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(sig=sig)], capture_output=True, text=True, timeout=120)
    assert "Exception ignored" in proc.stderr  # the first delivery really was lost
    assert proc.stdout.split() == ["swallowed", "interrupted"] and proc.returncode == 130, proc.stdout + proc.stderr


def test_an_ignored_sigint_stays_ignored() -> None:
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "from autotune.runtime import interrupt; interrupt.install()\n"
        "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN,"
        " signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.split() == ["True", "True"]  # SIGINT left as the shell set it; SIGTERM handled
