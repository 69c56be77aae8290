"""Command-line values: durations, KEY=VALUE pairs, GPU lists, and the type of each engine flag.

A value given on the command line (``--fixed``) or in a search space is checked against what its
flag takes (an integer ≥ 1, a fraction in (0, 1], on/off …) before any engine is launched, and
refused with one line naming the option or file, the flag and the type.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from typing import Any

from autotune.config import BoolParam, CategoricalParam, FloatParam, IntParam, Param, SearchSpace
from autotune.engines import ADAPTERS
from autotune.engines.base import canonical_flag
from autotune.errors import ConfigError

__all__ = [
    "FLAG_TYPES",
    "KNOB_TYPES",
    "check_space_values",
    "checked_value",
    "flag_type",
    "parse_duration",
    "parse_env",
    "parse_gpus",
    "parse_pairs",
    "parse_parallel",
    "typed_fixed",
]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str, option: str) -> float:
    """'8h', '30m', '90s', '3600' → seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"{option} {text!r} is not a duration; use e.g. 8h, 45m, 900s")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def parse_pairs(pairs: list[str], option: str) -> dict[str, str]:
    """KEY=VALUE options → {KEY: VALUE}, the value verbatim (a string; nothing is guessed)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{option} {pair!r} must look like KEY=VALUE")
        out[key.strip()] = value
    return out


def parse_env(pairs: list[str]) -> dict[str, str]:
    """``--env`` values: environment values are strings, kept exactly as given
    (``NCCL_DEBUG=off`` stays "off", ``UMASK=0755`` stays "0755", ``X=@file`` stays "@file")."""
    env = parse_pairs(pairs, "--env")
    for name in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(f"--env {name}=...: {name!r} is not an environment variable name (letters, digits, _)")
    return env


def parse_parallel(text: str) -> int | str:
    """'auto' or a positive number of trials at once."""
    if text.strip().lower() == "auto":
        return "auto"
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError(f"--parallel {text!r} must be auto or a number ≥ 1")
    return int(text)


def parse_gpus(text: str | None) -> list[int] | None:
    """'0,1,4,5' or '0-3,6' → NVML indices."""
    if text is None:
        return None
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ConfigError(f"--gpus {text!r}: use NVML indices such as 0,1,4,5 or 0-3")
        out.extend(range(int(low), int(high if sep else low) + 1))
    if not out:
        raise ConfigError("--gpus is empty; name at least one GPU, e.g. --gpus 0")
    return sorted(set(out))


# ------------------------------------------------------------------------ flag values and types
#: What each portable knob takes: (kind, lowest, highest). Kinds: int, float, fraction (0 < x ≤ 1),
#: bool, str. The adapters map the knobs to each dialect's flag.
KNOB_TYPES: dict[str, tuple[str, float | None, float | None]] = {
    "memory_fraction": ("fraction", 0.0, 1.0),
    "max_running": ("int", 1, None),
    "batched_tokens": ("int", 1, None),
    "context_len": ("int", 1, None),
    "cuda_graph_max_bs": ("int", 1, None),
    "block_size": ("int", 1, None),
    "tensor_parallel": ("int", 1, None),
    "pipeline_parallel": ("int", 1, None),
    "prefix_caching": ("bool", None, None),
    "chunked_prefill": ("bool", None, None),
    "enforce_eager": ("bool", None, None),
    "kv_cache_dtype": ("str", None, None),
    "scheduling_policy": ("str", None, None),
}

#: Raw flags of known type that no portable knob maps to (vLLM and SGLang spellings).
FLAG_TYPES: dict[str, tuple[str, float | None, float | None]] = {
    "--data-parallel-size": ("int", 1, None),
    "--dp-size": ("int", 1, None),
    "--cuda-graph-max-bs": ("int", 1, None),
    "--schedule-conservativeness": ("float", 0.0, None),
    "--max-num-partial-prefills": ("int", 1, None),
    "--long-prefill-token-threshold": ("int", 0, None),
}
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


def _knob_flags(kind: str) -> dict[str, str]:
    adapter = ADAPTERS.get(kind)
    return dict(adapter.knobs) if adapter is not None else {}


def flag_type(kind: str, key: str) -> tuple[str, tuple[str, float | None, float | None] | None]:
    """(the engine flag, its (kind, low, high)) for a knob or raw flag name; the type is None when
    nothing is known about it."""
    knobs = _knob_flags(kind)
    flag = knobs.get(key) or canonical_flag(key)
    knob = key if key in knobs else next((k for k, f in knobs.items() if f == flag), None)
    if knob in KNOB_TYPES:
        return flag, KNOB_TYPES[knob]
    return flag, FLAG_TYPES.get(flag)


def _describe(spec: tuple[str, float | None, float | None]) -> str:
    kind, low, high = spec
    if kind == "bool":
        return "true or false (an on/off flag)"
    if kind == "fraction":
        return "a fraction in (0, 1]"
    noun = "an integer" if kind == "int" else "a number" if kind == "float" else "a word"
    if kind == "str":
        return noun
    if low is not None and high is not None:
        return f"{noun} from {low:g} to {high:g}"
    if low is not None:
        return f"{noun} > {low:g}" if kind == "float" and low == 0 else f"{noun} ≥ {low:g}"
    return noun


def checked_value(value: Any, spec: tuple[str, float | None, float | None]) -> Any:
    """``value`` as the flag's type (a string from the command line is converted).

    Raises:
        ValueError: The value is not of the type, or outside its range.
    """
    kind, low, high = spec
    if kind == "str":
        return value
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, str):
        text = value.strip()
        if kind == "int":
            if not re.fullmatch(r"[+-]?\d+", text):
                raise ValueError
            value = int(text)
        else:
            number = float(text)  # ValueError for words
            value = int(number) if re.fullmatch(r"[+-]?\d+", text) else number
    if kind == "int" and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, (int, float)) or (kind == "int" and not isinstance(value, int)):
        raise ValueError
    if math.isnan(value) or math.isinf(value):
        raise ValueError
    if kind == "fraction":
        if not 0 < value <= 1:
            raise ValueError
    elif kind == "float" and low == 0:
        if value <= 0:
            raise ValueError
    elif (low is not None and value < low) or (high is not None and value > high):
        raise ValueError
    return value


def _param_spec(param: Param) -> tuple[str, float | None, float | None] | None:
    """A search-space parameter's own type, for a flag nothing else is known about."""
    if isinstance(param, BoolParam):
        return ("bool", None, None)
    if isinstance(param, IntParam):
        return ("int", None, None)
    if isinstance(param, FloatParam):
        return ("float", None, None)
    choices = [c for c in param.choices if c is not None]
    if choices and all(isinstance(c, bool) for c in choices):
        return ("bool", None, None)
    if choices and all(isinstance(c, int) and not isinstance(c, bool) for c in choices):
        return ("int", None, None)
    if choices and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices):
        return ("float", None, None)
    return None


def _as_written(text: str) -> Any:
    """A value of a flag whose type is unknown: a number or true/false only when it reads back
    exactly as written (``0755`` and ``1e3`` stay text), a JSON object for JSON-valued flags."""
    stripped = text.strip()
    if stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if re.fullmatch(r"-?[1-9]\d*|0", stripped):
        return int(stripped)
    with contextlib.suppress(ValueError):
        if repr(float(stripped)) == stripped:
            return float(stripped)
    if stripped.startswith(("{", "[")):
        with contextlib.suppress(ValueError):
            return json.loads(stripped)
    return text


def typed_fixed(kind: str, raw: dict[str, str], space: SearchSpace) -> dict[str, Any]:
    """``--fixed`` values typed by their flag: the knob's type, else the search space's declared
    type for it, else as written. A value of the wrong type or range is one ConfigError line."""
    out: dict[str, Any] = {}
    for key, text in raw.items():
        flag, spec = flag_type(kind, key)
        if spec is None and key in space.params:
            spec = _param_spec(space.params[key])
        if spec is None:
            out[key] = _as_written(text)
            continue
        try:
            out[key] = checked_value(text, spec)
        except ValueError:
            raise ConfigError(f"--fixed {key}={text}: {flag} takes {_describe(spec)}, not {text!r}") from None
    return out


def check_space_values(kind: str, space: SearchSpace, source: str) -> None:
    """Every value a search space can send (fixed values, ranges, choices) fits its flag's type.

    Raises:
        ConfigError: One line naming the file, the field, the flag, the value and the type.
    """
    for name, value in space.fixed.items():
        flag, spec = flag_type(kind, name)
        if spec is not None and "." not in name:
            try:
                checked_value(value, spec)
            except ValueError:
                raise ConfigError(f"{source}: fixed.{name}: {flag} takes {_describe(spec)}, not {value!r}") from None
    for name, param in space.params.items():
        flag, spec = flag_type(kind, name)
        if spec is None or "." in name:
            continue
        where = f"{source}: params.{name}"
        kind_of = spec[0]
        wrong_bool = isinstance(param, BoolParam) and kind_of != "bool"
        if wrong_bool or (isinstance(param, (IntParam, FloatParam)) and kind_of in ("bool", "str")):
            raise ConfigError(f"{where}: {flag} takes {_describe(spec)}, not type {param.type}; fix its type")
        if isinstance(param, FloatParam) and kind_of == "int":
            raise ConfigError(f"{where}: {flag} takes {_describe(spec)}; use type: int (or categorical choices)")
        if isinstance(param, (IntParam, FloatParam)):
            values = [("low", param.low), ("high", param.high)]
        elif isinstance(param, CategoricalParam):
            values = [(f"choices[{i}]", c) for i, c in enumerate(param.choices) if c is not None]
        else:
            values = []
        for field, value in values:
            try:
                checked_value(value, spec)
            except ValueError:
                raise ConfigError(f"{where}.{field}: {flag} takes {_describe(spec)}, not {value!r}") from None
