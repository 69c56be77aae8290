"""Exported launch scripts reproduce the trial's argv exactly and cannot be injected into."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.errors import ConfigError
from autotune.report.export import LaunchRecord, render

ARGV = [
    sys.executable,
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    "/m/tiny",
    "--host",
    "127.0.0.1",
    "--port",
    "41234",
    "--max-num-seqs",
    "64",
    "--enforce-eager",
]


def _run_script(tmp_path: Path, text: str, argv0_replacement: list[str]) -> list[str]:
    """Run the exported script with `exec` swapped for a printer of its argv."""
    script = tmp_path / "launch.sh"
    printer = f"{shlex.quote(sys.executable)} -c 'import json,sys; print(json.dumps(sys.argv[1:]))'"
    script.write_text(text.replace("exec ", f"exec {printer} ", 1))
    out = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, check=True, env={**os.environ, "PORT": "9000"}
    )
    return json.loads(out.stdout)


@pytest.mark.sim
def test_bash_round_trips_argv_with_port_variable(tmp_path: Path) -> None:
    rec = LaunchRecord(study="s", trial=3, argv=ARGV, env={"VLLM_NO_USAGE_STATS": "1"})
    _, text = render(rec, "bash")
    got = _run_script(tmp_path, text, [])
    assert got == [*ARGV[:8], "9000", *ARGV[9:]]


def test_json_round_trips(tmp_path: Path) -> None:
    rec = LaunchRecord(study="s", trial=3, argv=ARGV, env={"A": "b c"}, flags={"--max-num-seqs": 64})
    _, text = render(rec, "json")
    data = json.loads(text)
    # The trial's throwaway port and bind address are the bash form's placeholders, said so.
    assert data["argv"] == [*ARGV[:6], "$HOST", ARGV[7], "$PORT", *ARGV[9:]] and data["env"] == {"A": "b c"}
    assert set(data["placeholders"]) == {"$PORT", "$HOST"}


def test_unknown_format() -> None:
    with pytest.raises(ConfigError, match="bash"):
        render(LaunchRecord(study="s", trial=0, argv=ARGV, env={}), "toml")


PAYLOADS = ["$(touch pwned)", "`touch pwned`", "x\ntouch pwned", "'; touch pwned; '", '"; touch pwned; "']
hostile = st.one_of(
    st.sampled_from(PAYLOADS),
    st.text(alphabet=st.sampled_from(list("ab $()`'\"\\;\n|&*?~#!{}<>")), min_size=1, max_size=20),
)


@pytest.mark.sim
@settings(max_examples=40, deadline=None)
@given(model=hostile, value=hostile, env_value=hostile, summary=hostile)
def test_hostile_values_stay_literal(
    tmp_path_factory: pytest.TempPathFactory, model: str, value: str, env_value: str, summary: str
) -> None:
    tmp_path = tmp_path_factory.mktemp("x")
    marker = tmp_path / "pwned"
    argv = ["engine", "--model", model, "--port", "1", "--served-model-name", value]
    rec = LaunchRecord(study="s", trial=0, argv=argv, env={"X": env_value}, summary=summary)
    _, text = render(rec, "bash")
    text = text.replace("set -euo", f"cd {shlex.quote(str(tmp_path))}; set -euo")
    got = _run_script(tmp_path, text, [])
    assert got == ["engine", "--model", model, "--port", "9000", "--served-model-name", value]
    assert not marker.exists()


def _container_args_from_docker(text: str) -> tuple[str, list[str]]:
    """The image and container args of the exported `docker run` line, as the shell sees them."""
    body = text.split("exec ", 1)[1].replace("\\\n", " ")
    words = shlex.split(body)
    image_at = next(i for i, w in enumerate(words) if w.startswith("vllm/") or w.startswith("lmsysorg/"))
    return words[image_at], words[image_at + 1 :]


ENGINE_ARGS = [
    "--model",
    "meta-llama/Llama-3.1-8B-Instruct",
    "--host",
    "127.0.0.1",
    "--port",
    "41234",
    "--max-num-seqs",
    "256",
    "--tensor-parallel-size",
    "2",
]
FLAGS = {"--max-num-seqs": 256, "--tensor-parallel-size": 2}


@pytest.mark.sim
def test_docker_carries_the_trial_flags_on_the_official_image() -> None:
    rec = LaunchRecord(
        study="s",
        trial=1,
        argv=["python", "-m", "x", *ENGINE_ARGS],
        env={"VLLM_X": "1"},
        flags=FLAGS,
        engine="vllm",
        engine_version="0.32.0",
        engine_args=ENGINE_ARGS,
    )
    _, text = render(rec, "docker")
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)  # valid shell
    image, args = _container_args_from_docker(text)
    assert image == "vllm/vllm-openai:v0.32.0"
    assert args[args.index("--max-num-seqs") + 1] == "256"
    assert args[args.index("--host") + 1] == "0.0.0.0" and args[args.index("--port") + 1] == "8000"
    assert "--ipc=host" in text


def test_k8s_is_a_deployment_with_gpus_and_shm() -> None:
    import yaml

    rec = LaunchRecord(
        study="My Study", trial=1, argv=ENGINE_ARGS, env={}, flags=FLAGS, engine="vllm", engine_args=ENGINE_ARGS
    )
    _, text = render(rec, "k8s")
    doc = yaml.safe_load(text)
    assert doc["kind"] == "Deployment"
    pod = doc["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["args"][container["args"].index("--max-num-seqs") + 1] == "256"
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"])
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert doc["metadata"]["name"] == "vllm-my-study"


def test_sglang_container_runs_launch_server() -> None:
    args = ["--model-path", "Qwen/Qwen2.5-72B-Instruct", "--port", "1", "--tp-size", "4"]
    rec = LaunchRecord(study="s", trial=1, argv=args, env={}, flags={"--tp-size": 4}, engine="sglang", engine_args=args)
    import yaml

    container = yaml.safe_load(render(rec, "k8s")[1])["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python3", "-m", "sglang.launch_server"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert container["args"][container["args"].index("--port") + 1] == "30000"
