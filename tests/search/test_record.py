"""The study record: trial and study attributes written and read only through typed records,
with a layout version that refuses studies from a newer autotune and opens older ones."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.errors import StudyError
from autotune.search import record
from autotune.search.manifest import write_manifest
from autotune.search.record import StageState, TrialRecord, trial_record, write_trial


def _study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name="s", storage=optuna.storages.InMemoryStorage())


def test_a_misspelt_attribute_fails_where_it_is_written() -> None:
    trial = _study().ask()
    with pytest.raises(TypeError, match="outcom"):
        write_trial(trial, outcom="ok")
    assert trial.user_attrs == {}


def test_a_stored_trial_reads_back_typed_with_defaults_for_what_was_never_written() -> None:
    study = _study()
    trial = study.ask()
    write_trial(trial, stage="search", params={"max_running": 64}, flags={"--max-num-seqs": 64}, attempt=1)
    trial.set_user_attr("metrics", None)  # an older tuner stored None for "nothing measured"
    trial.set_user_attr("from_a_newer_autotune", 1)  # unknown keys are ignored on read
    study.tell(trial, 1.0)
    r = trial_record(study.trials[0])
    assert (r.number, r.stage, r.params, r.attempt) == (0, "search", {"max_running": 64}, 1)
    assert r.metrics == {} and r.facts == {} and r.outcome is None and r.started and not r.is_probe


def test_a_trial_that_never_got_its_start_record_is_not_started() -> None:
    study = _study()
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)
    assert trial_record(study.trials[0]) == TrialRecord(number=0)
    assert not trial_record(study.trials[0]).started


def test_stage_state_round_trips_and_leaves_out_what_a_stage_did_not_decide() -> None:
    study = _study()
    record.set_stage_state(study, "cuda_graph", StageState(done=True, fixed={"cuda_graph_max_bs": 512}, noise=0.03))
    assert study.user_attrs["stage.cuda_graph"] == {"done": True, "fixed": {"cuda_graph_max_bs": 512}, "noise": 0.03}
    state = record.stage_state(study, "cuda_graph")
    assert state is not None and state.done and state.fixed == {"cuda_graph_max_bs": 512}
    assert record.stage_state(study, "memory_edge") is None
    assert set(record.stage_states(study)) == {"cuda_graph"}


def test_a_new_study_is_stamped_and_an_old_one_opens_as_it_is() -> None:
    study = _study()
    record.check_record_version(study)
    assert study.user_attrs["record_version"] == record.RECORD_VERSION
    record.check_record_version(study)  # stamped already: opens


def test_a_study_from_a_newer_layout_is_refused_with_its_version() -> None:
    study = _study()
    study.set_user_attr("record_version", record.RECORD_VERSION + 1)
    with pytest.raises(StudyError, match=rf"record version {record.RECORD_VERSION + 1}.*upgrade autotune"):
        record.check_record_version(study)


def test_validation_and_memory_edges_keep_what_was_stored_before() -> None:
    study = _study()
    record.set_validation(study, {3: {"median": 10.0, "stable": True}})
    record.set_validation(study, {**record.validation(study), 5: {"median": 9.0, "stable": False}})
    assert record.validation(study) == {3: {"median": 10.0, "stable": True}, 5: {"median": 9.0, "stable": False}}
    record.set_memory_edge(study, "context=default,graph=default", 0.9)
    record.set_memory_edge(study, "context=4096,graph=default", None)
    assert record.memory_edges(study) == {"context=default,graph=default": 0.9, "context=4096,graph=default": None}


@pytest.mark.sim
def test_the_manifest_names_the_engine_versions_and_compile_caches_the_trials_reported(tmp_path: Path) -> None:
    study = _study()
    for version in ("0.32.0", "0.32.0", None):
        trial = study.ask()
        startup = {"compile_cache": "/c/torch_compile_cache/ab/rank_0_0/backbone"} if version else {}
        write_trial(trial, facts={"engine_version": version, "startup": startup} if version else {})
        study.tell(trial, 1.0)
    path = write_manifest(tmp_path, study, {"name": "vllm", "simulated": False}, {"workload": {"name": "w"}})
    manifest = json.loads(path.read_text())
    assert manifest["schema_version"] == 1 and manifest["record_version"] == record.RECORD_VERSION
    caches = ["/c/torch_compile_cache/ab/rank_0_0/backbone"]
    assert manifest["engine"] == {"name": "vllm", "simulated": False, "versions": ["0.32.0"], "compile_caches": caches}
    assert manifest["config"] == {"workload": {"name": "w"}}
    assert set(manifest["host"]) >= {"cpu", "memory_bytes", "gpus", "python", "platform"}


def test_a_run_served_its_workload_only_when_it_served_the_studys_own() -> None:
    assert TrialRecord(number=1, outcome="ok").served_its_workload
    assert TrialRecord(number=1, outcome="slo_violation").served_its_workload  # measured, SLO missed
    assert not TrialRecord(number=1, outcome="kv_insufficient").served_its_workload
    assert not TrialRecord(number=1, outcome=None).served_its_workload  # never finished
    probe = TrialRecord(number=1, outcome="ok", workload_override={"num_prompts": 64})
    assert not probe.served_its_workload  # a memory probe's peak shape says nothing of the workload
