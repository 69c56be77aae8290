"""An exported launch read back (``autotune export``'s bash script, json or yaml record): its
argv and environment, and from the argv the engine, the model and the flags, as a recheck needs
them when the study that tuned it is not at hand."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotune.engines import engines_named
from autotune.errors import ConfigError

__all__ = ["ExportedLaunch", "read_exported"]

_OWNED = ("--host", "--port", "--model", "--model-path")


@dataclass(frozen=True)
class ExportedLaunch:
    """What an exported launch runs: the engine kind, the model, its flags (canonical: ``--x``
    with a value, True for a bare switch, False for ``--no-x``) and the variables it exports."""

    kind: str
    model: str
    flags: dict[str, Any]
    env: dict[str, str]


def read_exported(path: Path) -> ExportedLaunch:
    """Read a launch ``autotune export`` wrote (bash, json or yaml).

    Raises:
        ConfigError: The file cannot be read, or holds no engine launch autotune can tell.
    """
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"--script {path}: cannot read it ({err.strerror or err})") from None
    if path.suffix in (".json", ".yaml", ".yml"):
        argv, env = _from_record(path, text)
    else:
        argv, env = _from_bash(path, text)
    kind, args = _engine(path, argv)
    model, flags = _model_and_flags(path, args)
    return ExportedLaunch(kind, model, flags, env)


def _from_record(path: Path, text: str) -> tuple[list[str], dict[str, str]]:
    try:
        record = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"--script {path}: not a json/yaml export ({str(err).splitlines()[0]})") from None
    if not isinstance(record, dict) or not isinstance(record.get("argv"), list):
        raise ConfigError(f"--script {path}: no argv field; give a file `autotune export --format json|yaml` wrote")
    return [str(word) for word in record["argv"]], {str(k): str(v) for k, v in (record.get("env") or {}).items()}


def _from_bash(path: Path, text: str) -> tuple[list[str], dict[str, str]]:
    """The ``export NAME=VALUE`` lines and the ``exec`` command (continuation lines joined)."""
    env: dict[str, str] = {}
    joined = text.replace("\\\n", " ")
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"] and len(words) == 2 and "=" in words[1]:
            name, _, value = words[1].partition("=")
            env[name] = value
        elif words[:1] == ["exec"]:
            return words[1:], env
    raise ConfigError(f"--script {path}: no `exec` line; give a script `autotune export` wrote")


def _engine(path: Path, argv: list[str]) -> tuple[str, list[str]]:
    """The engine kind the argv runs, and the words after its module (``-m X``) or its ``serve``
    (whose first word is the model)."""
    named = engines_named(argv)
    if len(named) != 1:
        raise ConfigError(f"--script {path}: its argv runs no engine module autotune knows ({shlex.join(argv[:4])} …)")
    for i, word in enumerate(argv[:-1]):
        if word == "-m":
            return named.pop(), argv[i + 2 :]
        if word == "serve":
            return named.pop(), ["--model", *argv[i + 1 :]]
    raise ConfigError(f"--script {path}: its argv runs no engine module autotune knows ({shlex.join(argv[:4])} …)")


def _model_and_flags(path: Path, args: list[str]) -> tuple[str, dict[str, Any]]:
    flags: dict[str, Any] = {}
    model = None
    i = 0
    while i < len(args):
        flag, values = args[i], []
        i += 1
        while i < len(args) and not args[i].startswith("--"):
            values.append(args[i])
            i += 1
        if flag in ("--model", "--model-path") and values:
            model = values[0]
        elif flag.startswith("--") and flag not in _OWNED:
            key, value = _flag_value(flag, values)
            flags[key] = value
    if model is None:
        raise ConfigError(f"--script {path}: no --model in its argv")
    return model, flags


def _flag_value(flag: str, values: list[str]) -> tuple[str, Any]:
    if not values:
        return (f"--{flag[5:]}", False) if flag.startswith("--no-") else (flag, True)
    if len(values) > 1:
        return flag, values
    return flag, _typed(values[0])


def _typed(word: str) -> Any:
    """A flag's value as the tuner records it: a number as a number, a JSON object as a dict."""
    for kind in (int, float):
        try:
            return kind(word)
        except ValueError:
            pass
    if word.startswith("{"):
        try:
            return json.loads(word)
        except json.JSONDecodeError:
            pass
    return word
