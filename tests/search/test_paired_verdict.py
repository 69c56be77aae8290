"""The winner's gain over the engine's defaults is a paired comparison, and the study says when
that gain is within the measured noise."""

from __future__ import annotations

from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.report.status import export_note
from autotune.search.record import set_verdict
from autotune.search.verdict import paired_gains, paired_verdict, slo_misses


def _run(value: float | None, outcome: str = "ok") -> FrozenTrial:
    attrs: dict[str, Any] = {"outcome": outcome, "constraints": {}}
    if value is None:
        return create_trial(state=TrialState.FAIL, user_attrs=attrs)
    return create_trial(value=value, user_attrs=attrs)


def test_gains_pair_run_i_of_the_defaults_with_run_i_of_the_winner() -> None:
    defaults = [_run(100.0), _run(50.0), _run(100.0)]
    winner = [_run(110.0), _run(55.0), _run(None, "crash")]
    assert paired_gains(defaults, winner, 1.0) == pytest.approx([0.10, 0.10])
    # Lower is better (a latency objective): 90 ms against 100 ms is a 10 % gain.
    assert paired_gains([_run(100.0)], [_run(90.0)], -1.0) == pytest.approx([0.10])


def test_a_gain_whose_range_excludes_zero_beats_the_defaults() -> None:
    verdict = paired_verdict(4, [0.05, 0.08, 0.11])
    assert verdict["beats_defaults"] is True
    assert verdict["line"] == "gain over the engine's defaults +8.0% (range +5.0% … +11.0% over 3 paired runs)"


def test_a_gain_within_noise_is_said_to_be_within_noise() -> None:
    verdict = paired_verdict(4, [0.05, -0.02, 0.09])
    assert verdict["beats_defaults"] is False
    assert verdict["line"].startswith("no candidate beat the engine's defaults beyond the measured noise of ±5.5%")


def test_one_pair_has_no_measured_noise_and_the_defaults_winning_is_said() -> None:
    assert paired_verdict(4, [0.3])["beats_defaults"] is None
    assert "noise is not measured" in paired_verdict(4, [0.3])["line"]
    assert paired_verdict(0, [], winner_is_defaults=True)["line"].startswith("the engine's defaults won")
    assert paired_verdict(4, [])["beats_defaults"] is None


def _missed(value: float) -> FrozenTrial:
    """A served run that missed its p95 TTFT SLO by a fifth."""
    return create_trial(value=value, user_attrs={"outcome": "slo_violation", "constraints": {"p95_ttft_ms": 0.2}})


def test_a_goodput_objective_pairs_rounds_where_the_defaults_missed_the_slos() -> None:
    defaults = [_missed(30.0), _missed(32.0), _run(34.0)]
    winner = [_run(36.0), _run(36.0), _run(36.0)]
    # Goodput counts only the requests that met their bounds: a missed SLO is already in the value.
    assert paired_gains(defaults, winner, 1.0, priced=True) == pytest.approx([0.2, 0.125, 36 / 34 - 1])
    # Any other objective compares only rounds that both served within the SLOs.
    assert paired_gains(defaults, winner, 1.0) == pytest.approx([36 / 34 - 1])
    misses = slo_misses(defaults, winner)
    assert misses == {"rounds": 3, "defaults": 2, "winner": 0}
    verdict = paired_verdict(4, paired_gains(defaults, winner, 1.0, priced=True), misses=misses)
    assert verdict["beats_defaults"] is True
    assert verdict["line"].endswith("; the defaults missed the SLOs in 2 of 3 rounds, the winner in 0")


def test_defaults_that_missed_the_slos_in_every_round_are_beaten_outright() -> None:
    defaults = [_missed(3000.0), _missed(3100.0)]
    winner = [_run(2500.0), _run(2600.0)]
    misses = slo_misses(defaults, winner)
    verdict = paired_verdict(4, paired_gains(defaults, winner, 1.0), misses=misses)
    assert verdict["beats_defaults"] is True
    assert verdict["line"] == (
        "the engine's defaults missed the workload's SLOs in both rounds beside the winner, which met them"
    )
    # One round measures no noise; a winner that missed once is not beating them outright.
    one = paired_verdict(4, [], misses=slo_misses(defaults[:1], winner[:1]))
    assert one["beats_defaults"] is None and "one round" in one["line"]
    mixed = slo_misses(defaults, [_run(2500.0), _missed(2600.0)])
    assert paired_verdict(4, [], misses=mixed)["beats_defaults"] is None


def test_the_launch_script_line_never_says_defaults_that_missed_the_slos_serve_as_well() -> None:
    study = optuna.create_study(direction="maximize")
    best = create_trial(value=33.1, user_attrs={"outcome": "ok", "constraints": {}, "params": {"max_running": 47}})
    study.add_trial(best)
    best = study.trials[0]
    misses = {"rounds": 3, "defaults": 2, "winner": 0}
    set_verdict(study, paired_verdict(best.number, [0.48, 0.146, -0.057], misses=misses))
    note = export_note(study, best)
    assert "serve as well" not in note
    assert note.endswith("but the defaults missed the SLOs in 2 of 3 rounds, these flags in 0)")
    set_verdict(study, paired_verdict(best.number, [0.48, 0.146, -0.057]))
    assert "so the defaults serve as well" in export_note(study, best)
