"""The study's sampler models the knobs jointly even though the study also holds runs that set
only some of them (the baseline sets none, a memory probe only the fraction)."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution

from autotune.config import StudySettings
from autotune.search.tune import make_sampler

SEQS = CategoricalDistribution([16, 32, 64, 128])
MEMORY = FloatDistribution(0.80, 0.98, step=0.02)


def _study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = make_sampler(StudySettings(name="t", trials=12, seed=0))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, values=[1.0]))  # the baseline
    study.add_trial(optuna.trial.create_trial(params={"memory": 0.9}, distributions={"memory": MEMORY}, values=[0.5]))
    for seqs in (16, 32, 64, 128):
        study.add_trial(
            optuna.trial.create_trial(
                params={"memory": 0.9, "seqs": seqs},
                distributions={"memory": MEMORY, "seqs": SEQS},
                values=[float(seqs)],
            )
        )
    return study


def test_tpe_models_the_knobs_together_past_a_run_that_set_none() -> None:
    study = _study()
    trial = study.ask()
    space = study.sampler.infer_relative_search_space(study, trial)
    # One joint model over both knobs, not each knob on its own (what an empty common space gives).
    assert set(space) == {"memory", "seqs"}
