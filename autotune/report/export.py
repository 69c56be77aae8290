"""A trial → a launch script (bash) or a machine-readable record (json) that starts the engine
with exactly the trial's argv and environment.

Every value is shell-quoted (``shlex.quote``), so a model name or flag value holding quotes,
spaces, ``$()``, backticks or newlines stays one literal argument. The trial's throwaway port
and bind address become ``$PORT`` / ``$HOST`` (defaults 8000 / the trial's host) in every form
(the json and yaml records carry the same placeholders and say what they stand for), and
secrets are never written: the engine reads them from the environment the script is run in.

The container forms (docker, k8s) run the engine's official image: the GPU image, or for a
study tuned on a CPU build, vLLM's CPU release image without a GPU request. A model that was a
local folder is mounted read-only at the same path.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import yaml

from autotune import __version__
from autotune.engines import ADAPTERS
from autotune.engines.base import EngineAdapter
from autotune.errors import ConfigError
from autotune.report.simband import report_sentence

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
    device: str = "gpu"  # "cpu": tuned on a CPU build (vLLM-CPU): CPU image, no GPU request
    model: str | None = None  # the model as the engine was given it (a hub id or a local path)
    weights_from: str | None = None  # "daemon:<mode>": the trial mapped its weights from the study's daemon
    verdict: str = ""  # the paired verdict against the engine's defaults, when the study judged this trial

    def port_and_host(self) -> tuple[str | None, str | None]:
        return _value_after(self.argv, "--port"), _value_after(self.argv, "--host")

    def model_arg(self) -> str | None:
        """The model the engine is given: the record's, else read from the argv."""
        if self.model:
            return self.model
        args = self.engine_args if self.engine_args is not None else self.argv
        for flag in ("--model", "--model-path"):
            value = _value_after(args, flag)
            if value is not None:
                return value
        return None


#: Where the tuner keeps its own caches (the simulator's compile markers among them): never a
#: deployment's, so an export of a simulated study leaves a variable pointing there out.
TUNER_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "autotune")


def deployable_env(env: dict[str, str], simulated: bool) -> dict[str, str]:
    """The trial's environment as a deployment needs it: a simulated study's simulator settings
    (``AUTOTUNE_SIM_*``, the simulator's cache) are the tuner's, not the engine's."""
    if not simulated:
        return dict(env)
    return {k: v for k, v in env.items() if not k.startswith("AUTOTUNE_SIM_") and not v.startswith(TUNER_CACHE)}


def deployable_argv(rec: LaunchRecord) -> list[str]:
    """The argv a deployment runs: the trial's own, or for a simulated study the real engine's
    module with the flags the simulated engine was tuned with."""
    if not rec.simulated or rec.engine_args is None:
        return list(rec.argv)
    return ["python3", "-m", ADAPTERS[rec.engine].default_module, *rec.engine_args]


SIMULATED_NOTE = (
    "Tuned on autotune's simulated engine: its numbers are modelled, not measured; the flags run the real "
    "engine here (measure them there before relying on them)."
)


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


def _is_secret_ref(name: str, value: str) -> bool:
    """A secret recorded by reference (``${HF_TOKEN}``): it comes from the caller's environment."""
    return value == f"${{{name}}}"


def _placeholder_argv(argv: list[str]) -> list[str]:
    """The argv with the trial's port and bind address as ``$PORT`` / ``$HOST``, as in the bash form."""
    out = list(argv)
    for i in range(1, len(out)):
        if out[i - 1] == "--port":
            out[i] = f"${PORT_VAR}"
        elif out[i - 1] == "--host":
            out[i] = f"${HOST_VAR}"
    return out


def _comment(text: str) -> str:
    # A newline in a comment would end it and run the rest: keep every comment on one line.
    return "# " + " ".join(text.split())


def to_bash(rec: LaunchRecord) -> str:
    port, host = rec.port_and_host()
    lines = [
        "#!/usr/bin/env bash",
        _comment(f"Exported by autotune {__version__} from study {rec.study}, trial {rec.trial}."),
    ]
    lines += _what_it_measured(rec)
    if rec.simulated:
        lines.append(_comment(report_sentence()))
    lines.append(_comment(_daemon_note(rec)))
    lines.append(_comment(f"Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}."))
    lines += [
        "set -euo pipefail",
        f'{PORT_VAR}="${{{PORT_VAR}:-8000}}"',
        f'{HOST_VAR}="${{{HOST_VAR}:-{host or "127.0.0.1"}}}"',
    ]
    for name, value in sorted(deployable_env(rec.env, rec.simulated).items()):
        if _is_secret_ref(name, value):
            lines.append(_comment(f"{name}: read from your environment (a secret: never written here)."))
        else:
            lines.append(f"export {name}={shlex.quote(value)}")
    words = _argv_with_vars(deployable_argv(rec))
    lines.append("exec " + " \\\n  ".join(_pair_flags(words)))
    del port  # the trial's port is throwaway; $PORT replaces it
    return "\n".join(lines) + "\n"


def _what_it_measured(rec: LaunchRecord) -> list[str]:
    """A script's comment lines on what the trial measured: its value, the verdict against the
    defaults, and whether it was the simulator."""
    said = [rec.summary] if rec.summary else []
    said += [f"Against the engine's defaults, side by side: {rec.verdict}."] if rec.verdict else []
    said += [SIMULATED_NOTE] if rec.simulated else []
    return [_comment(text) for text in said]


def _daemon_note(rec: LaunchRecord) -> str:
    """Whether the script needs a weight-cache daemon: never — the flags tuned do not depend on
    where the weights came from, so the engine loads its own; say so when the trial had one."""
    if rec.weights_from and rec.weights_from.startswith("daemon"):
        mode = rec.weights_from.partition(":")[2] or "zero_copy"
        return (
            f"Needs no weight-cache daemon: the trial mapped its weights from the study's ({mode}), and the "
            "engine loads them itself here with the same flags and memory budget."
        )
    return "Needs no weight-cache daemon: the engine loads its weights itself."


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
    _, host = rec.port_and_host()
    return (
        json.dumps(
            {
                "schema_version": 1,
                "autotune_version": __version__,
                "study": rec.study,
                "trial": rec.trial,
                # The trial's port was a throwaway: the same placeholders as the bash script.
                "argv": _placeholder_argv(deployable_argv(rec)),
                "placeholders": {
                    f"${PORT_VAR}": "the port to serve on (the bash export defaults it to 8000)",
                    f"${HOST_VAR}": f"the bind address (the trial used {host or '127.0.0.1'})",
                },
                "env": deployable_env(rec.env, rec.simulated),
                "flags": rec.flags,
                "metrics": rec.metrics,
                "summary": rec.summary,
                "verdict": rec.verdict or None,
                "simulated": rec.simulated,
                **({"simulated_note": SIMULATED_NOTE} if rec.simulated else {}),
            },
            indent=2,
            default=str,
        )
        + "\n"
    )


def to_yaml(rec: LaunchRecord) -> str:
    return yaml.safe_dump(json.loads(to_json(rec)), sort_keys=False, width=1000)


def _adapter(rec: LaunchRecord) -> type[EngineAdapter]:
    """The engine's adapter class: its official images and the command they run the engine with
    (vLLM's image runs `vllm serve` as its entry point; SGLang's needs the launch module)."""
    return ADAPTERS[rec.engine]


def _image(rec: LaunchRecord) -> tuple[str, int, str | None]:
    """(image, port, warning): the engine's official image for the device the study ran on."""
    adapter, warning = _adapter(rec), None
    found = adapter.cpu_image if rec.device == "cpu" else adapter.image
    if found is None:  # SGLang publishes no CPU image
        found = adapter.image
        warning = f"no official {rec.engine} image for CPU is known: this uses the GPU image; build a CPU one"
    assert found is not None, f"{rec.engine} has no container image"
    # A local version suffix (0.32.0+cpu) is no image tag.
    version = (rec.engine_version or "").split("+")[0]
    image = f"{found.repo}:{found.tag.format(version=version)}" if version else f"{found.repo}:latest"
    return image, found.port, warning


def _local_model(rec: LaunchRecord) -> str | None:
    """The absolute path of the model when it was a local folder (it must be mounted), else None."""
    model = rec.model_arg()
    if not model:
        return None
    path = os.path.expanduser(model)
    if model.startswith(("/", "./", "../", "~")) or os.path.isdir(path):
        return os.path.abspath(path)
    return None


def _container(rec: LaunchRecord) -> tuple[str, list[str], int]:
    """(image, container args, port): the trial's engine args, serving on all interfaces; a local
    model is given by its absolute path (where it is mounted)."""
    image, port, _ = _image(rec)
    args = list(rec.engine_args if rec.engine_args is not None else rec.argv)
    local, model = _local_model(rec), rec.model_arg()
    if local and model:
        args = [local if a == model else a for a in args]
    for flag, value in (("--host", "0.0.0.0"), ("--port", str(port))):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return image, [*_adapter(rec).container_command, *args], port


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
    _, _, warning = _image(rec)
    env = [
        f"-e {name}" if _is_secret_ref(name, value) else f"-e {shlex.quote(f'{name}={value}')}"
        for name, value in sorted(deployable_env(rec.env, rec.simulated).items())
    ]
    local = _local_model(rec)
    mounts = [f"-v {shlex.quote(f'{local}:{local}:ro')}"] if local else []
    words = [
        "docker run --rm --ipc=host" if rec.device == "cpu" else "docker run --rm --gpus all --ipc=host",
        f'-p "${{{PORT_VAR}:-{port}}}:{port}"',
        '-v "$HOME/.cache/huggingface:/root/.cache/huggingface"',
        *mounts,
        "-e HF_TOKEN",
        *env,
        shlex.quote(image),
        *(shlex.quote(a) for a in args),
    ]
    head = [
        "#!/usr/bin/env bash",
        _comment(f"Exported by autotune {__version__} from study {rec.study}, trial {rec.trial} ({rec.engine} image)."),
    ]
    head += _what_it_measured(rec)
    if rec.device == "cpu":
        head.append(_comment(f"Tuned on a CPU build: {image} is vLLM's CPU release image (x86_64); no GPU is used."))
    if warning:
        head.append(_comment(f"warning: {warning}."))
    if local:
        head.append(_comment(f"The model is the local folder {local}, mounted read-only at the same path."))
    head += [
        _comment("--ipc=host gives the engine the shared memory it needs (or use --shm-size)."),
        "set -euo pipefail",
    ]
    return "\n".join(head) + "\nexec " + " \\\n  ".join(_pair_flags(words)) + "\n"


def to_k8s(rec: LaunchRecord) -> str:
    image, args, port = _container(rec)
    name = re.sub(r"[^a-z0-9-]", "-", f"{rec.engine}-{rec.study}".lower())[:50].strip("-")
    _, _, warning = _image(rec)
    local = _local_model(rec)
    env: list[dict[str, Any]] = []
    for k, v in sorted(deployable_env(rec.env, rec.simulated).items()):
        if _is_secret_ref(k, v):  # a secret: from a Kubernetes Secret, never written here
            env.append({"name": k, "valueFrom": {"secretKeyRef": {"name": f"{name}-secrets", "key": k}}})
        else:
            env.append({"name": k, "value": v})
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    # The engines share tensors between processes through /dev/shm: give it RAM.
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    if local:
        mounts.append({"name": "model", "mountPath": local, "readOnly": True})
        volumes.append({"name": "model", "hostPath": {"path": local, "type": "Directory"}})
    container: dict[str, Any] = {
        "name": rec.engine,
        "image": image,
        "args": args,
        "ports": [{"containerPort": port, "name": "http"}],
        "env": env,
        "resources": {} if rec.device == "cpu" else {"limits": {"nvidia.com/gpu": _gpu_count(rec)}},
        "volumeMounts": mounts,
        "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 10, "failureThreshold": 60},
    }
    command = len(_adapter(rec).container_command)
    if command:
        container["command"], container["args"] = args[:command], args[command:]
    annotations = {"autotune/study": rec.study, "autotune/trial": str(rec.trial)}
    if rec.simulated:
        annotations["autotune/simulated"] = SIMULATED_NOTE
    if rec.verdict:
        annotations["autotune/verdict"] = rec.verdict
    if rec.device == "cpu":
        annotations["autotune/device"] = f"cpu: tuned on a CPU build; {image} is vLLM's CPU release image, no GPU"
    if warning:
        annotations["autotune/warning"] = warning
    if local:
        annotations["autotune/model"] = f"local folder {local} (hostPath): the node must hold it"
    doc = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [container], "volumes": volumes},
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
