"""The small public API a notebook uses: its names are pinned, each resolves to the library's
own function, and together they run a study, read it back as a table and export its winner."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import autotune
from autotune.config import EngineSettings, SearchSpace, StudySettings, Workload, parse_model

pytestmark = pytest.mark.slow


def test_the_public_names_are_pinned() -> None:
    assert autotune.__all__ == ["TuneJob", "__version__", "export_trial", "load_study", "load_trials", "run_study"]
    for name in autotune.__all__:
        assert getattr(autotune, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'tune'"):
        autotune.tune  # noqa: B018


@pytest.mark.sim
def test_importing_autotune_loads_neither_optuna_nor_pandas() -> None:
    code = "import autotune, sys; print(sorted(m for m in ('optuna', 'pandas') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.sim
def test_a_study_run_read_back_and_exported_from_python(tmp_path: Path) -> None:
    engine = {
        "kind": "vllm",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "command": [sys.executable, "-m", "autotune_sim", "vllm"],
        "env": {"AUTOTUNE_SIM_SPEEDUP": "50", "AUTOTUNE_SIM_SEED": "0"},
        "simulated": True,
    }
    job = autotune.TuneJob(
        engine=parse_model(EngineSettings, engine, "engine"),
        space=parse_model(SearchSpace, {"params": {"max_running": {"type": "categorical", "choices": [64]}}}, "s"),
        workload=parse_model(Workload, {"dataset": {"input_len": 128, "output_len": 16}, "num_prompts": 16}, "w"),
        study=parse_model(
            StudySettings,
            {"name": "nb", "results_dir": tmp_path, "method": "search", "trials": 1, "finalists": 0, "baseline": False},
            "study",
        ),
    )
    best = autotune.run_study(job)
    assert best is not None
    frame = autotune.load_trials("nb", results=tmp_path)
    assert list(frame["trial"]) == [best.number] and frame["outcome"].iloc[0] == "ok"
    study = autotune.load_study("nb", job.storage_url)
    script = autotune.export_trial(study, best, "bash", folder=tmp_path)
    assert script.read_text().startswith("#!") and "--max-num-seqs 64" in script.read_text()
