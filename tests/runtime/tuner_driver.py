"""A stand-in for ``autotune tune``: launches one fake engine the way a parallel trial does and
then blocks until it is killed. Used by test_guard.py, which SIGKILLs it.

Run as ``python tuner_driver.py LOG_PATH [fake engine options]``. The engine is started and
waited for in a worker thread that then *ends* (as a trial thread of a finished slot does), so
a parent-death signal tied to the launching thread would fire too early, and one tied to
nothing would never fire. Prints one JSON line ``{"pid", "pgid", "members"}`` once the engine
is ready, then sleeps.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from autotune.runtime.ports import free_port
from autotune.runtime.process import EngineProcess

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")


def main() -> None:
    log_path, options = Path(sys.argv[1]), sys.argv[2:]
    port = free_port()
    engine = EngineProcess(
        [sys.executable, str(FAKE_ENGINE), *options, "--port", str(port)],
        {},
        log_path,
        ready_url=f"http://127.0.0.1:{port}/health",
        startup_timeout_s=60.0,
    )

    def trial() -> None:
        engine.start()
        engine.wait_ready()

    worker = threading.Thread(target=trial, name="trial-slot-0")
    worker.start()
    worker.join()
    print(json.dumps({"pid": engine.pid, "pgid": engine.pgid, "members": engine.group_pids()}), flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
