"""A throwaway stand-in for an engine process, driven by command-line options.

Run as ``python fake_engine.py [options]``. In order it: prints ``--print`` lines and ``--lines``
filler lines, optionally maps a POSIX shared-memory file ``/dev/shm/<--shm>`` (as vLLM's message
queues do; never removed by the fake itself), optionally leaves an orphaned grandchild behind
(same process group, reparented away from this process), optionally ignores SIGTERM, then
either exits with ``--exit`` after ``--exit-after`` seconds, serves HTTP on ``--port`` after
``--ready-after`` seconds, or sleeps.

HTTP: ``GET /health`` answers 200, or what ``--control`` (a file) says: ``503`` → 503,
``exit`` → answer 200 and exit with code 0 (like vLLM after a runtime engine death), ``die`` →
drop the request unanswered, stop listening and SIGKILL itself 0.3 s later (a killed engine whose
socket is gone before its exit status is).
"""

from __future__ import annotations

import argparse
import mmap
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--print", action="append", default=[], dest="lines_to_print")
    p.add_argument("--lines", type=int, default=0)
    p.add_argument("--orphan", action="store_true")
    p.add_argument("--shm", default=None)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--exit", type=int, default=None, dest="exit_code")
    p.add_argument("--exit-after", type=float, default=0.0)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--ready-after", type=float, default=0.0)
    p.add_argument("--control", type=Path, default=None)
    return p.parse_args()


def _leave_orphan(ignore_term: bool) -> None:
    """Double fork: the grandchild keeps our process group but its parent exits at once."""
    if os.fork() == 0:
        if os.fork() == 0:
            if ignore_term:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            # Do not hold the parent's stdout: a real orphan may, but tests check teardown, not EOF.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            while True:
                time.sleep(1)
        os._exit(0)
    os.wait()


def _serve(port: int, control: Path | None) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            order = control.read_text().strip() if control is not None and control.exists() else ""
            if order == "die":
                self.server.socket.close()
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
                return
            status = 503 if order == "503" else 200 if self.path == "/health" else 404
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            if order == "exit":
                self.wfile.flush()
                os._exit(0)

        def log_message(self, format: str, *args: object) -> None:
            print("http:", format % args, flush=True)

    HTTPServer(("127.0.0.1", port), Handler).serve_forever()


def _map_shm(name: str) -> mmap.mmap:
    """Create and map /dev/shm/<name> the way shm_open + mmap do; the mapping is kept, the fd closed."""
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
        return mmap.mmap(fd, 4096)
    finally:
        os.close(fd)


def main() -> None:
    args = _args()
    mapped = _map_shm(args.shm) if args.shm else None  # noqa: F841  (kept mapped until death)
    for line in args.lines_to_print:
        print(line, flush=True)
    for i in range(args.lines):
        print(f"filler line {i} " + "x" * 60)
    sys.stdout.flush()
    if args.orphan:
        _leave_orphan(args.ignore_term)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.exit_code is not None:
        time.sleep(args.exit_after)
        print("exiting", flush=True)
        sys.exit(args.exit_code)
    if args.port is not None:
        time.sleep(args.ready_after)
        print("serving", flush=True)
        _serve(args.port, args.control)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
