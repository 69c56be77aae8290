"""The command line over a real (simulated) study, run as a user runs it: `autotune` as a
subprocess. One small study is made per module and read by most tests; the features that need a
run of their own (probe-memory, --time-budget, a study where every launch fails) get a small one.

Each test asserts what the output says and what lands on disk, so it fails when a feature breaks
or a line claims what did not happen; none asserts a duration.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from clirun import run_cli
from rich.console import Console
from typer.testing import CliRunner

import autotune.cli as cli
from autotune.report import console as console_module
from autotune.report import status as status_module
from autotune.report.summary import format_value
from autotune.search.storage import best_trial, default_storage_url, load_study

# Small and quick on the simulator; a TTFT bound far above any run's keeps a busy test machine
# from flagging runs as client-limited (the tolerance is a tenth of the tightest TTFT bound).
QUICK = """name: quick
dataset: {input_len: 64, output_len: 16}
num_prompts: 12
warmup_requests: 0
arrival: {concurrency: 8}
slos: {p95_ttft_ms: 60000}
"""
SPACE = """name: tiny
params:
  memory_fraction: {type: float, low: 0.80, high: 0.96, step: 0.02}
  max_running: {type: int, low: 8, high: 64, log: true}
  batched_tokens: {type: categorical, choices: [2048, 4096]}
"""
ENV = {"NCCL_DEBUG": "off", "UMASK": "0755", "X": "@f", "HF_TOKEN_FILE": "..."}
# One xdist group: under `make test` the module's shared study is built once, not on each worker.
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("cli-study")]


run = run_cli


def tune_args(results: Path, study: str = "s", *extra: str) -> list[str]:
    return [
        "tune",
        "--study",
        study,
        "--results",
        str(results),
        "--workload",
        "quick.yaml",
        "--space",
        "space.yaml",
        "--sim-speedup",
        "100",
        "--seed",
        "0",
        *extra,
    ]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("cli-study")
    (home / "quick.yaml").write_text(QUICK)
    (home / "space.yaml").write_text(SPACE)
    return home


@pytest.fixture(scope="module")
def study(home: Path) -> dict[str, Any]:
    """One finished study: no --engine (so the simulator, said first), odd --env values."""
    results = home / "results"
    args = tune_args(results, "s", "--method", "search", "--trials", "2", "--finalists", "1", "--validation-runs", "1")
    for name, value in ENV.items():
        args += ["--env", f"{name}={value}"]
    proc = run(home, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    st = load_study("s", default_storage_url(results, "s"))
    return {"results": results, "args": args, "out": proc.stdout, "study": st, "trials": st.get_trials()}


# --------------------------------------------------------------------------- what a run says
@pytest.mark.sim
def test_the_simulator_says_so_in_the_first_line(study: dict[str, Any]) -> None:
    first = study["out"].splitlines()[0]
    assert first.startswith("simulated engine: numbers are modelled"), first
    assert "no --engine, --python or --command was given" in first


@pytest.mark.sim
def test_the_opening_line_counts_what_is_stored(study: dict[str, Any], home: Path, tmp_path: Path) -> None:
    assert study["out"].splitlines()[1].startswith("study s: new, in ")
    # --trials 2, 1 finalist, 1 validation run: what the line promises is what ran.
    plan = "2 runs of the engine's defaults (baseline and noise), then up to 2 search trials, then 1 finalist(s) and "
    assert study["out"].splitlines()[1].endswith(plan + "the defaults × 1 fresh-engine re-run(s): at most 6 launches")
    assert len(study["trials"]) <= 6
    copy = tmp_path / "results"
    shutil.copytree(study["results"], copy)
    again = run(home, *[str(copy) if a == str(study["results"]) else a for a in study["args"]])
    assert again.returncode == 0, again.stdout + again.stderr
    opening = again.stdout.splitlines()[1]
    ran = [t for t in study["trials"] if t.user_attrs.get("outcome") != "withdrawn"]
    stages = ", ".join(f"{k} {v}" for k, v in _stages(ran).items())
    assert opening.startswith(f"study s: resuming with {len(ran)} trials ({stages})"), opening
    assert "recorded;" in opening
    assert "already done" not in again.stdout


def _stages(trials: list[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in trials:
        out[t.user_attrs["stage"]] = out.get(t.user_attrs["stage"], 0) + 1
    return out


@pytest.mark.sim
def test_env_values_reach_the_engine_verbatim(study: dict[str, Any]) -> None:
    argv = json.loads((study["results"] / "s" / "trials" / "0" / "argv.json").read_text())
    for name, value in ENV.items():
        assert argv["env"][name] == value


# ----------------------------------------------------------------------- values as they were set
def _params(study: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {t.number: t.user_attrs.get("params") or {} for t in study["trials"]}


@pytest.mark.sim
def test_trials_table_and_csv_show_values_as_set(study: dict[str, Any], home: Path) -> None:
    proc = run(home, "trials", "s", "--results", str(study["results"]), "--csv", "t.csv")
    assert proc.returncode == 0, proc.stderr
    rows = {int(line.split("│")[1]): line for line in proc.stdout.splitlines() if re.match(r"│ \d+ ", line)}
    written = {int(r["trial"]): r for r in csv.DictReader((home / "t.csv").open())}
    sampled = [(n, p) for n, p in _params(study).items() if p]
    assert sampled
    for number, params in sampled:
        cells = [c.strip() for c in rows[number].split("│")]
        for name, value in params.items():
            exact = repr(value) if isinstance(value, float) else str(value)
            assert exact in cells, (name, value, rows[number])  # 0.84, not 0.8; 16, not 16.0
            assert written[number][f"param.{name}"] == exact
    assert "2,048.0" not in proc.stdout and "4,096.0" not in proc.stdout


@pytest.mark.sim
def test_csv_and_parquet_are_both_written(study: dict[str, Any], home: Path, tmp_path: Path) -> None:
    proc = run(home, "trials", "s", "--results", str(study["results"]), "--csv", str(tmp_path / "t.csv"))
    proc = run(
        home,
        "trials",
        "s",
        "--results",
        str(study["results"]),
        "--csv",
        str(tmp_path / "both.csv"),
        "--parquet",
        str(tmp_path / "both.parquet"),
    )
    assert proc.returncode == 0, proc.stderr
    table = pd.read_parquet(tmp_path / "both.parquet")
    text = pd.read_csv(tmp_path / "both.csv")
    assert list(table["trial"]) == list(text["trial"]) == [t.number for t in study["trials"]]
    assert list(table["outcome"]) == [t.user_attrs["outcome"] for t in study["trials"]]
    for number, params in _params(study).items():
        for name, value in params.items():
            assert table.loc[table["trial"] == number, f"param.{name}"].item() == value


@pytest.mark.sim
def test_status_shows_whole_flags_at_80_columns(study: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Console(force_terminal=True, width=80, soft_wrap=True, color_system=None)
    for module in (console_module, status_module):  # the terminal that status prints to
        monkeypatch.setattr(module, "console", terminal)
    with terminal.capture() as captured:
        result = CliRunner().invoke(cli.app, ["status", "s", "--results", str(study["results"])])
    out = captured.get()
    assert result.exit_code == 0, result.output
    assert "…" not in out
    lines = out.splitlines()
    header = lines.index(next(x for x in lines if "flags / reason" in x))
    end = next(i for i in range(header, len(lines)) if not lines[i].strip())  # the table ends at a blank line
    table = lines[header:end]
    assert len(table) > 3
    assert max(len(line) for line in table) <= 80  # the table fits the terminal; its cells wrap
    for params in _params(study).values():
        for name, value in params.items():
            assert f"{name}={format_value(value)}" in out, out  # each knob whole, on one line


# ---------------------------------------------------------------------------------- exports
@pytest.mark.sim
def test_json_and_yaml_exports_use_the_port_placeholder(study: dict[str, Any], home: Path) -> None:
    best = best_trial(study["study"])
    assert best is not None
    trial_port = best.user_attrs["argv"][best.user_attrs["argv"].index("--port") + 1]
    for fmt, load in (("json", json.loads), ("yaml", yaml.safe_load)):
        out = home / f"best.{fmt}"
        proc = run(home, "export", "s", "--results", str(study["results"]), "--format", fmt, "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        data = load(out.read_text())
        argv = data["argv"]
        assert argv[argv.index("--port") + 1] == "$PORT" and trial_port not in argv
        assert "$PORT" in data["placeholders"]
        assert data["flags"] == best.user_attrs["flags"]
        for flag, value in best.user_attrs["flags"].items():
            assert argv[argv.index(flag) + 1] == str(value)


@pytest.mark.sim
def test_docker_export_is_an_executable_script(study: dict[str, Any], home: Path) -> None:
    out = home / "run.docker.sh"
    proc = run(home, "export", "s", "--results", str(study["results"]), "--format", "docker", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert os.access(out, os.X_OK)
    subprocess.run(["bash", "-n", str(out)], check=True)


@pytest.mark.sim
def test_a_copied_results_folder_writes_only_into_the_copy(study: dict[str, Any], home: Path, tmp_path: Path) -> None:
    original = study["results"]
    copy = tmp_path / "copied"
    shutil.copytree(original, copy)
    for script in (original / "s").glob("launch-trial*"):
        script.unlink()
    before = {p: p.stat().st_mtime_ns for p in original.rglob("*")}
    again = run(home, *[str(copy) if a == str(original) else a for a in study["args"]])
    assert again.returncode == 0, again.stdout + again.stderr
    assert str(copy / "s") in again.stdout.splitlines()[-1]  # "launch script: <copy>/s/launch-trialN.sh"
    exported = run(home, "export", "s", "--results", str(copy), "--format", "json")
    assert exported.returncode == 0 and str(copy / "s") in exported.stdout
    assert {p: p.stat().st_mtime_ns for p in original.rglob("*")} == before
    assert list((copy / "s").glob("launch-trial*.sh")) and list((copy / "s").glob("launch-trial*.json"))


# ----------------------------------------------------------------------------------- resuming
@pytest.mark.sim
def test_resume_with_a_changed_workload_says_what_changed(study: dict[str, Any], home: Path) -> None:
    db = study["results"] / "s" / "study.db"
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    (home / "quick2.yaml").write_text(QUICK.replace("num_prompts: 12", "num_prompts: 13"))
    args = ["quick2.yaml" if a == "quick.yaml" else a for a in study["args"]]
    proc = run(home, *args)
    assert proc.returncode == 1
    lines = [x for x in proc.stdout.splitlines() + proc.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    assert "different workload (num_prompts 12 → 13" in lines[0] and "--study" in lines[0]
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest


@pytest.mark.sim
def test_resume_with_a_changed_space_says_what_changed(study: dict[str, Any], home: Path) -> None:
    (home / "space2.yaml").write_text(SPACE.replace("high: 64", "high: 32"))
    args = ["space2.yaml" if a == "space.yaml" else a for a in study["args"]]
    proc = run(home, *args)
    assert proc.returncode == 1
    assert "different space (params.max_running.high 64 → 32" in proc.stderr


# ------------------------------------------------------------------- runs of their own
@pytest.mark.sim
def test_probe_memory_reports_what_its_probes_showed(home: Path) -> None:
    results = home / "probe"
    proc = run(
        home,
        "probe-memory",
        "--engine",
        "sim",
        "--study",
        "m",
        "--results",
        str(results),
        "--space",
        "space.yaml",
        "--workload",
        "quick.yaml",
        "--probes",
        "2",
        "--sim-speedup",
        "100",
    )
    lines = proc.stdout.splitlines()
    edge = [x for x in lines if x.startswith("memory edge: ")][-1]  # the command's answer comes last
    probes = next(x for x in lines if x.startswith("probes: "))
    st = load_study("m", default_storage_url(results, "m"))
    launched = [t for t in st.get_trials() if t.user_attrs.get("stage") == "memory_edge"]
    assert launched and all("memory_fraction" in t.user_attrs["params"] for t in launched)
    state = st.user_attrs["stage.memory_edge"]
    tried = re.findall(r"(\d\.\d+) (ok|too_high|too_low)", probes)
    assert {float(f): r for f, r in tried} == {float(f): r for f, r in state["results"].items()}
    verdicts = {r for _, r in tried}
    if not tried:  # e.g. every probe was client-limited on a busy machine: said, not an edge
        assert edge.startswith("memory edge: not found — no probe gave a memory verdict"), edge
        assert proc.returncode == 1
    elif verdicts == {"ok"}:  # no failure seen: no edge may be claimed
        assert edge.startswith(f"memory edge: not reached — every probe up to {max(tried)[0]} passed"), edge
        assert proc.returncode == 0
    else:
        assert "too_high" not in verdicts or edge.startswith(f"memory edge: {state['edge']:g} (highest passing"), edge


@pytest.mark.sim
def test_time_budget_ends_the_study_and_says_so(home: Path) -> None:
    results = home / "budget"
    proc = run(
        home,
        *tune_args(results, "b", "--engine", "sim", "--method", "search", "--trials", "3"),
        "--time-budget",
        "0.1s",
    )
    st = load_study("b", default_storage_url(results, "b"))
    ran = [t for t in st.get_trials() if t.user_attrs.get("stage") == "search"]
    assert len(ran) < 3
    stop = next(x for x in proc.stdout.splitlines() if x.startswith("time budget 0.1 s used up"))
    assert f"ran {len(ran)} of 3 tuning trials" in stop
    # A loaded host can spend the 0.1 s before the baseline starts: then nothing was measured,
    # and the study says so and fails rather than report a best trial.
    if not [t for t in st.get_trials() if t.user_attrs.get("stage") == "baseline"]:
        assert proc.returncode == 1 and "no launch finished" in proc.stdout, proc.stdout
        return
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "median of 1 runs" not in proc.stdout and "spread 0.0" not in proc.stdout
    assert "best trial 0 (baseline)" in proc.stdout and "one run" in proc.stdout


@pytest.mark.sim
def test_a_study_whose_every_launch_fails_counts_them(home: Path) -> None:
    results = home / "oom"
    # A 70B model on one simulated 80 GB GPU: every start-up runs out of memory.
    args = tune_args(results, "o", "--engine", "sim", "--method", "search", "--trials", "1", "--finalists", "0")
    proc = run(home, *args, "--model", "meta-llama/Llama-3.1-70B-Instruct")
    assert proc.returncode == 1
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("no trial served the workload: 2 launches, all `oom_startup`"), last
    assert "met the SLOs" not in proc.stdout
