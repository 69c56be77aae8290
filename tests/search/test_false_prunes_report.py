"""The false-prune benchmark's judgement: a cut configuration whose full re-runs come within the
noise of the winner's is a false prune, and the engine time each early decision saved."""

from __future__ import annotations

from typing import Any

import pytest
from benchmark_loader import load_benchmark

WINNER = {"max_running": 64, "batched_tokens": 2048}


@pytest.fixture(scope="module")
def fp() -> Any:
    return load_benchmark("false_prunes")


def _cut(fp: Any, seqs: int, reruns: list[float], cut_s: float = 10.0) -> Any:
    return fp.Cut(
        params={"max_running": seqs, "batched_tokens": 512},
        trial=seqs,
        cut_value=500.0,
        evidence="",
        engine_s=cut_s,
        reruns=reruns,
        rerun_engine_s=[40.0] * len(reruns),
    )


def _study(fp: Any, cuts: list[Any], *, stalled: str | None = None, search_trials: int = 10) -> Any:
    return fp.StudyResult(
        label="seed0",
        winner=WINNER,
        winner_value=1050.0,
        winner_reruns=[1000.0, 980.0, 1020.0],
        cuts=cuts,
        noise=0.10,
        noise_source="",
        study_noise="",
        spent_s=400.0,
        search_trials=search_trials,
        budget=16,
        full_trial_s=40.0,
        stalled=stalled,
        modelled=False,
    )


def test_a_cut_within_the_noise_of_the_winner_is_a_false_prune(fp: Any) -> None:
    winner = [1000.0, 980.0, 1020.0]  # median 1,000; noise 10 % → the bar is 900
    assert fp.false_prune(_cut(fp, 16, [910.0, 890.0, 905.0]), winner, 0.10) is True
    assert fp.false_prune(_cut(fp, 16, [880.0, 890.0, 870.0]), winner, 0.10) is False
    assert fp.false_prune(_cut(fp, 16, [1100.0, 1200.0, 1150.0]), winner, 0.10) is True  # better: surely false
    assert fp.false_prune(_cut(fp, 16, []), winner, 0.10) is None  # never served in full: not judged


def test_savings_count_each_cut_against_its_full_run_and_the_trials_a_stop_left(fp: Any) -> None:
    cuts = [_cut(fp, 16, [800.0], cut_s=10.0), _cut(fp, 32, [850.0], cut_s=25.0)]
    # Early stop: (40 − 10) + (40 − 25); no stop: nothing for stop-when-done.
    assert fp.savings(_study(fp, cuts)) == (45.0, 0.0)
    # Stopped after 12 of 16 search trials: 4 trials at the median full search trial's 40 s.
    assert fp.savings(_study(fp, cuts, stalled="no gain", search_trials=12)) == (45.0, 160.0)


def test_the_report_counts_false_prunes_over_every_judged_cut(fp: Any) -> None:
    cuts = [_cut(fp, 16, [910.0, 905.0]), _cut(fp, 32, [600.0, 610.0]), _cut(fp, 128, [])]
    study = fp.asdict(_study(fp, cuts))
    lines = fp.report({"studies": [study], "host": {"cpu": {"model": "test", "cores": 2, "flags": ["avx2"]}}})
    text = "\n".join(lines)
    assert "false prunes: 1 of 2 cut configurations" in text
    assert "early stop saved 60" in text  # 2 re-run cuts × (40 − 10); one never re-run saves nothing known
