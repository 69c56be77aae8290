"""Simulated numbers carry the simulator's validated error band where they are shown (status,
the report, the live run), read from the simulator's validation set; real numbers do not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial
from rich.console import Console
from typer.testing import CliRunner

from autotune.cli import app
from autotune.report import simband
from autotune.report.html import write_report
from autotune.report.live import LiveProgress
from autotune.search.storage import default_storage_url
from autotune_sim.fidelity import error_band

runner = CliRunner()
METRICS = {"output_throughput": 1500.0, "p95_ttft_ms": 400.0, "p95_tpot_ms": 20.0, "error_rate": 0.0}


def _phrase(category: str) -> str:
    """What the simulator's validation set says of one kind of number, as the tuner words it."""
    band = error_band(category)
    if band.max_abs_error is None:
        return f"{band.label} not validated by any published row"
    rows = f"{band.rows} published row{'s' * (band.rows != 1)}"
    return f"{band.label} ±{100 * band.max_abs_error:.0f} % over {rows}"


def _decode_phrase() -> str:
    # A study's objective here is output throughput, measured under load: that kind's band.
    return _phrase("throughput-load")


def _study(results: Path, name: str, simulated: bool) -> optuna.Study:
    folder = results / name / "trials" / "0"
    folder.mkdir(parents=True)
    (folder / "engine.log").write_text("ready\n")
    (folder / "bench.json").write_text(json.dumps({"schema_version": 1, "runs": [METRICS]}))
    st = optuna.create_study(study_name=name, storage=default_storage_url(results, name), direction="maximize")
    engine = {"kind": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "simulated": simulated}
    st.set_user_attr(
        "config", {"engine": engine, "workload": {"name": "chat", "objective": {"metric": "output_throughput"}}}
    )
    attrs: dict[str, Any] = {
        "stage": "baseline",
        "outcome": "ok",
        "params": {"memory_fraction": 0.9},
        "flags": {"--gpu-memory-utilization": 0.9},
        "metrics": METRICS,
        "constraints": [-0.5],
        "violations": {},
        "facts": {},
        "timings": {"startup_s": 30.0, "bench_s": 60.0, "total_s": 95.0},
        "reason": "",
        "log_path": str(folder / "engine.log"),
        "trial_dir": str(folder),
    }
    st.add_trial(
        create_trial(
            state=TrialState.COMPLETE,
            value=1500.0,
            params={"memory_fraction": 0.9},
            distributions={"memory_fraction": FloatDistribution(0.8, 0.96, step=0.02)},
            user_attrs=attrs,
        )
    )
    return st


@pytest.mark.sim
@pytest.mark.parametrize("simulated", [True, False])
def test_status_names_the_validated_band_only_for_a_simulated_study(tmp_path: Path, simulated: bool) -> None:
    _study(tmp_path, "s", simulated)
    result = runner.invoke(app, ["status", "s", "--results", str(tmp_path)])
    assert result.exit_code == 0, result.output
    best = next(line for line in result.output.splitlines() if line.startswith("best trial"))
    if simulated:
        assert f"modelled by the simulator; against published measurements: {_decode_phrase()}" in best, best
    else:
        assert "modelled" not in result.output and "validated error" not in result.output


@pytest.mark.sim
@pytest.mark.parametrize("simulated", [True, False])
def test_report_banner_carries_every_shown_band_only_when_simulated(tmp_path: Path, simulated: bool) -> None:
    st = _study(tmp_path, "r", simulated)
    html_path, md_path = write_report(st, tmp_path / "r")
    page, md = html_path.read_text(), md_path.read_text()
    for text in (md, page):
        shown = all(_phrase(kind) in text for kind in ("throughput-load", "decode-load", "ttft", "kv"))
        assert shown is simulated, text[:600]


@pytest.mark.sim
def test_live_view_of_a_simulated_run_names_the_band() -> None:
    assert _decode_phrase() in LiveProgress(Console(), simulated=True).modelled
    assert LiveProgress(Console(), simulated=False).modelled == ""


def test_a_failing_band_command_says_so_instead_of_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simband, "bands", lambda: None)
    assert simband.modelled_note("p95_ttft_ms") == "modelled by the simulator; its validated error band is unavailable"
    assert "unavailable" in simband.report_sentence()


@pytest.mark.sim
@pytest.mark.parametrize("simulated", [True, False])
def test_an_exported_script_carries_the_band_only_when_simulated(simulated: bool) -> None:
    from autotune.report.export import LaunchRecord, to_bash

    argv = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000", "--max-num-seqs", "64"]
    script = to_bash(LaunchRecord("s", 3, argv, {}, simulated=simulated))
    assert (_decode_phrase() in script) is simulated, script[:800]


@pytest.mark.sim
def test_no_simulated_number_is_shown_with_the_band_of_another_quantity() -> None:
    # Each metric a study prints, and the one kind of number it is.
    kinds = {
        "output_throughput": "throughput-load",
        "request_throughput": "throughput-load",
        "request_goodput": "throughput-load",
        "mean_ttft_ms": "ttft",
        "p95_ttft_ms": "ttft",
        "mean_tpot_ms": "decode-load",
        "p95_tpot_ms": "decode-load",
        "p99_itl_ms": "decode-load",
        "p95_e2el_ms": "decode-load",
    }
    for metric, kind in kinds.items():
        assert simband.metric_band(metric) == _phrase(kind), metric
    # The batch-1 decode rows never stand for TPOT under a study's load.
    assert all("batch 1" not in (simband.metric_band(m) or "") for m in kinds)
