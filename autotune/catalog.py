"""The search spaces and workloads shipped beside the package, found by name (``chat`` means
``workloads/chat.yaml``); a name that matches nothing is refused with the closest shipped one."""

from __future__ import annotations

import difflib
from pathlib import Path

from autotune.errors import ConfigError

__all__ = ["DEFAULT_SPACE", "PACKAGE_ROOT", "SHIPPED", "closest", "resolve_file"]

PACKAGE_ROOT = Path(__file__).resolve().parent

SHIPPED = PACKAGE_ROOT.parent  # search_spaces/ and workloads/ sit beside the package in a checkout

#: The search space a tune uses when none is given, per engine.
DEFAULT_SPACE = {"vllm": "vllm-default", "sglang": "sglang-throughput"}


def resolve_file(path: str, folder: str) -> Path:
    """A name like `chat` means the shipped workloads/chat.yaml; anything else is a path. A name
    that matches nothing is refused with the closest shipped names."""
    p = Path(path)
    if p.exists() or p.suffix in (".yaml", ".yml") or "/" in path:
        if not p.exists() and not (SHIPPED / folder / p.name).exists():
            hint = closest(p.stem, _shipped(folder))
            if hint and p.parent in (Path("."), Path(folder)):
                raise ConfigError(f"{p}: file not found; did you mean {hint}? (shipped {folder}: {_list(folder)})")
        return p
    shipped = SHIPPED / folder / f"{path}.yaml"
    if not shipped.exists():
        option = "--workload" if folder == "workloads" else "--space"
        hint = closest(path, _shipped(folder))
        fix = f"did you mean {hint}?" if hint else "give a YAML file path"
        raise ConfigError(f"{option} {path!r}: no such file or shipped name; {fix} (shipped: {_list(folder)})")
    return shipped


def _shipped(folder: str) -> list[str]:
    return sorted(f.stem for f in (SHIPPED / folder).glob("*.yaml"))


def _list(folder: str) -> str:
    return ", ".join(_shipped(folder))


def closest(name: str, names: list[str]) -> str | None:
    match = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return match[0] if match else None
