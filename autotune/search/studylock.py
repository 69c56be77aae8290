"""One live run per local study.

A second ``autotune tune`` of a study that another run is tuning would take that run's trials
for a killed tuner's (RUNNING in the storage), end its engine as a leftover and fail its trial.
So a run holds an exclusive ``flock`` on a file in the study's folder for as long as it runs: the
kernel releases it on any exit, SIGKILL included, so a dead holder's lock is taken over at once,
and a live holder's is never taken. The file says who holds it, for the refusal's message.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from autotune.errors import StudyError

__all__ = ["LOCK_FILE", "study_lock"]

LOCK_FILE = "tune.lock"


@contextlib.contextmanager
def study_lock(folder: Path, study: str) -> Iterator[None]:
    """Hold ``folder``'s lock while the block runs.

    Raises:
        StudyError: When a live run holds it (nothing was read or changed).
    """
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the engines it starts
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StudyError(
                f"study {study!r} is being tuned by another run ({_holder(path)}); wait for it to end "
                "(`autotune status` shows it) or stop that run first; nothing was changed"
            ) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": datetime.now(UTC).isoformat()}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(holder).encode())
        yield
    finally:
        os.close(fd)  # releases the lock


def _holder(path: Path) -> str:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return "its holder unknown"
    since = str(data.get("since", "?"))[:19].replace("T", " ")
    return f"pid {data.get('pid', '?')} on {data.get('host', '?')}, since {since} UTC"
