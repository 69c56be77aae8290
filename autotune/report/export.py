"""A trial → a launch script (bash) or a machine-readable record (json) that starts the engine
with exactly the trial's argv and environment.

Every value is shell-quoted (``shlex.quote``), so a model name or flag value holding quotes,
spaces, ``$()``, backticks or newlines stays one literal argument. The trial's throwaway port
and bind address become ``$PORT`` / ``$HOST`` (defaults 8000 / the trial's host), and secrets
are never written: the engine reads them from the environment the script is run in.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import yaml

from autotune import __version__
from autotune.errors import ConfigError

__all__ = ["FORMATS", "LaunchRecord", "render"]

PORT_VAR, HOST_VAR = "PORT", "HOST"


@dataclass(frozen=True)
class LaunchRecord:
    """What an export needs from a trial (read from its Optuna user attributes)."""

    study: str
    trial: int
    argv: list[str]
    env: dict[str, str]
    flags: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    summary: str = ""  # one line: outcome, objective value and spread
    simulated: bool = False
    engine: str = "vllm"
    engine_version: str | None = None
    engine_args: list[str] | None = None  # argv after the launch command (model + flags)

    def port_and_host(self) -> tuple[str | None, str | None]:
        return _value_after(self.argv, "--port"), _value_after(self.argv, "--host")


def _value_after(argv: list[str], flag: str) -> str | None:
    for i, token in enumerate(argv[:-1]):
        if token == flag:
            return argv[i + 1]
    return None


def _argv_with_vars(argv: list[str]) -> list[str]:
    """Shell words: quoted literals, except the port/host values which become variables."""
    words: list[str] = []
    for i, token in enumerate(argv):
        prev = argv[i - 1] if i else ""
        if prev == "--port":
            words.append(f'"${PORT_VAR}"')
        elif prev == "--host":
            words.append(f'"${HOST_VAR}"')
        else:
            words.append(shlex.quote(token))
    return words


def _comment(text: str) -> str:
    # A newline in a comment would end it and run the rest: keep every comment on one line.
    return "# " + " ".join(text.split())


def to_bash(rec: LaunchRecord) -> str:
    port, host = rec.port_and_host()
    lines = [
        "#!/usr/bin/env bash",
        _comment(f"Exported by autotune {__version__} from study {rec.study}, trial {rec.trial}."),
    ]
    if rec.summary:
        lines.append(_comment(rec.summary))
    if rec.simulated:
        lines.append(_comment("Tuned on autotune's simulated engine: its numbers are modelled, not measured."))
    lines.append(_comment(f"Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}."))
    lines += [
        "set -euo pipefail",
        f'{PORT_VAR}="${{{PORT_VAR}:-8000}}"',
        f'{HOST_VAR}="${{{HOST_VAR}:-{host or "127.0.0.1"}}}"',
    ]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(rec.env.items())]
    words = _argv_with_vars(rec.argv)
    lines.append("exec " + " \\\n  ".join(_pair_flags(words)))
    del port  # the trial's port is throwaway; $PORT replaces it
    return "\n".join(lines) + "\n"


def _pair_flags(words: list[str]) -> list[str]:
    """One flag (with its values) per line, for a readable script."""
    out: list[str] = []
    for w in words:
        if out and not w.startswith("-") and out[-1].startswith("-"):
            out[-1] += " " + w
        else:
            out.append(w)
    return out


def to_json(rec: LaunchRecord) -> str:
    return (
        json.dumps(
            {
                "schema_version": 1,
                "autotune_version": __version__,
                "study": rec.study,
                "trial": rec.trial,
                "argv": rec.argv,
                "env": rec.env,
                "flags": rec.flags,
                "metrics": rec.metrics,
                "summary": rec.summary,
                "simulated": rec.simulated,
            },
            indent=2,
            default=str,
        )
        + "\n"
    )


def to_yaml(rec: LaunchRecord) -> str:
    return yaml.safe_dump(json.loads(to_json(rec)), sort_keys=False, width=1000)


# The engines' official images run the engine CLI as their entrypoint (vllm: `vllm serve`).
IMAGES = {"vllm": ("vllm/vllm-openai", "v{version}", 8000), "sglang": ("lmsysorg/sglang", "v{version}", 30000)}
SGLANG_ENTRY = ["python3", "-m", "sglang.launch_server"]


def _container(rec: LaunchRecord) -> tuple[str, list[str], int]:
    """(image, container args, port): the trial's engine args, serving on all interfaces."""
    repo, tag, port = IMAGES[rec.engine]
    image = f"{repo}:{tag.format(version=rec.engine_version)}" if rec.engine_version else f"{repo}:latest"
    args = list(rec.engine_args if rec.engine_args is not None else rec.argv)
    for flag, value in (("--host", "0.0.0.0"), ("--port", str(port))):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    if rec.engine == "sglang":
        args = SGLANG_ENTRY + args
    return image, args, port


def _gpu_count(rec: LaunchRecord) -> int:
    """GPUs one replica needs: tensor × pipeline × data parallel sizes from the flags."""
    sizes = {"tp": 1, "pp": 1, "dp": 1}
    for flag, value in rec.flags.items():
        name = flag.lstrip("-").replace("_", "-")
        for key, names in (
            ("tp", ("tensor-parallel-size", "tp-size", "tp")),
            ("pp", ("pipeline-parallel-size", "pp-size", "pp")),
            ("dp", ("data-parallel-size", "dp-size", "dp")),
        ):
            if name in names:
                sizes[key] = int(value)
    return sizes["tp"] * sizes["pp"] * sizes["dp"]


def to_docker(rec: LaunchRecord) -> str:
    image, args, port = _container(rec)
    env = [f"-e {shlex.quote(f'{k}={v}')}" for k, v in sorted(rec.env.items())]
    words = [
        "docker run --rm --gpus all --ipc=host",
        f'-p "${{{PORT_VAR}:-{port}}}:{port}"',
        '-v "$HOME/.cache/huggingface:/root/.cache/huggingface"',
        "-e HF_TOKEN",
        *env,
        shlex.quote(image),
        *(shlex.quote(a) for a in args),
    ]
    head = [
        "#!/usr/bin/env bash",
        _comment(f"Exported by autotune {__version__} from study {rec.study}, trial {rec.trial} ({rec.engine} image)."),
        _comment("--ipc=host gives the engine the shared memory it needs (or use --shm-size)."),
        "set -euo pipefail",
    ]
    return "\n".join(head) + "\nexec " + " \\\n  ".join(_pair_flags(words)) + "\n"


def to_k8s(rec: LaunchRecord) -> str:
    image, args, port = _container(rec)
    name = re.sub(r"[^a-z0-9-]", "-", f"{rec.engine}-{rec.study}".lower())[:50].strip("-")
    container: dict[str, Any] = {
        "name": rec.engine,
        "image": image,
        "args": args,
        "ports": [{"containerPort": port, "name": "http"}],
        "env": [{"name": k, "value": v} for k, v in sorted(rec.env.items())],
        "resources": {"limits": {"nvidia.com/gpu": _gpu_count(rec)}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 10, "failureThreshold": 60},
    }
    if rec.engine == "sglang":
        container["command"], container["args"] = args[:3], args[3:]
    doc = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "annotations": {"autotune/study": rec.study, "autotune/trial": str(rec.trial)}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [container],
                    # The engines share tensors between processes through /dev/shm: give it RAM.
                    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
                },
            },
        },
    }
    return yaml.safe_dump(doc, sort_keys=False, width=1000)


FORMATS: dict[str, tuple[str, Callable[[LaunchRecord], str]]] = {
    "bash": (".sh", to_bash),
    "json": (".json", to_json),
    "yaml": (".yaml", to_yaml),
    "docker": (".docker.sh", to_docker),
    "k8s": (".k8s.yaml", to_k8s),
}


def render(rec: LaunchRecord, fmt: str) -> tuple[str, str]:
    """(file suffix, text) for a format name; unknown names list the valid ones."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r} is not known; use one of {', '.join(FORMATS)}")
    suffix, fn = FORMATS[fmt]
    return suffix, fn(rec)
