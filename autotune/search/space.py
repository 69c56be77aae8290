"""Search space (YAML) → Optuna suggestions, honouring conditional parameters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from autotune.config import BoolParam, CategoricalParam, FloatParam, IntParam, Param, SearchSpace
from autotune.engines.base import EngineAdapter, FlagSet

__all__ = [
    "FINITE_LIMIT",
    "active",
    "distribution",
    "draw",
    "finite_points",
    "fits",
    "for_release",
    "suggest",
    "suggest_param",
]


#: Points up to which a discrete space is listed point by point (beyond, it is sampled).
FINITE_LIMIT = 4096


def active(param: Param, chosen: dict[str, Any]) -> bool:
    """A parameter is sampled only when every parameter its condition names has that value."""
    return all(chosen.get(name) == value for name, value in (param.condition or {}).items())


def distribution(param: Param) -> BaseDistribution:
    """The Optuna distribution a parameter samples from (to check a value fits the space)."""
    if isinstance(param, FloatParam):
        return FloatDistribution(param.low, param.high, step=param.step, log=param.log)
    if isinstance(param, IntParam):
        return IntDistribution(param.low, param.high, step=param.step, log=param.log)
    if isinstance(param, CategoricalParam):
        return CategoricalDistribution(param.choices)
    return CategoricalDistribution([False, True])


def fits(dist: BaseDistribution, value: Any) -> bool:
    """Whether ``value`` lies inside ``dist`` (Optuna would record it as that parameter)."""
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False


def suggest_param(trial: optuna.Trial, name: str, param: Param) -> Any:
    """Sample one parameter (or read its enqueued value) and record its distribution."""
    if isinstance(param, FloatParam):
        value = trial.suggest_float(name, param.low, param.high, step=param.step, log=param.log)
        # A stepped float comes back as low + k·step with binary noise (0.8400000000000001): the
        # engine and the launch script should see 0.84.
        return round(value, 10) if param.step else value
    if isinstance(param, IntParam):
        return trial.suggest_int(name, param.low, param.high, step=param.step, log=param.log)
    if isinstance(param, CategoricalParam):
        return trial.suggest_categorical(name, param.choices)
    if isinstance(param, BoolParam):
        return trial.suggest_categorical(name, [False, True])
    raise TypeError(f"unknown parameter type for {name}")  # unreachable: config validates the tag


def suggest(trial: optuna.Trial, space: SearchSpace) -> dict[str, Any]:
    """Sample every active parameter (or read its enqueued value)."""
    return _resolve(space, lambda name, param: suggest_param(trial, name, param))


def draw(space: SearchSpace, sampler: optuna.samplers.RandomSampler, study: optuna.Study) -> dict[str, Any]:
    """The active parameters of one random point of ``space``, without a trial (to look at a
    point before asking for it)."""
    probe = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING)  # the sampler ignores it

    def pick(name: str, param: Param) -> Any:
        value = sampler.sample_independent(study, probe, name, distribution(param))
        return round(value, 10) if isinstance(param, FloatParam) and param.step else value

    return _resolve(space, pick)


def _resolve(space: SearchSpace, pick: Callable[[str, Param], Any]) -> dict[str, Any]:
    """Pick every active parameter. Conditions are resolved in dependency order, so a
    parameter whose condition is off is never picked (and so never sent to the engine)."""
    chosen: dict[str, Any] = {}
    for name, param in space.in_dependency_order():
        if active(param, chosen):
            chosen[name] = pick(name, param)
    return chosen


def _values(param: Param) -> list[Any] | None:
    """Every value of a discrete parameter, or None for a continuous one."""
    if isinstance(param, IntParam):
        return list(range(param.low, param.high + 1, param.step))
    if isinstance(param, FloatParam):
        if not param.step:
            return None
        count = int((param.high - param.low) / param.step + 1e-9) + 1  # Optuna's high rounds down to the grid
        return [round(param.low + k * param.step, 10) for k in range(count)]
    if isinstance(param, CategoricalParam):
        return list(param.choices)
    return [False, True]


def finite_points(space: SearchSpace, limit: int = FINITE_LIMIT) -> list[dict[str, Any]] | None:
    """Every point of ``space`` (active parameters only, as :func:`suggest` picks them), or None
    when a parameter is continuous or there are more than ``limit`` points."""
    values = {name: _values(param) for name, param in space.params.items()}
    if any(v is None for v in values.values()):
        return None
    points: list[dict[str, Any]] = [{}]
    for name, param in space.in_dependency_order():
        grown: list[dict[str, Any]] = []
        for point in points:
            options = values[name] if active(param, point) else None
            grown += [{**point, name: v} for v in options] if options else [point]
            if len(grown) > limit:
                return None
        points = grown
    return points


def for_release(space: SearchSpace, adapter: EngineAdapter, known: FlagSet) -> tuple[SearchSpace, list[str]]:
    """The space as the installed release (its help gave ``known``) can run it, and a note for
    each parameter left out.

    A parameter is left out when the release has no spelling of it and its flag is one the
    adapter dates (``flags_since``: a knob newer than the release), and so is every parameter
    whose condition names one left out. Any other flag the help lacks stays, for the flag check
    to refuse by name (a typo is not a release).
    """
    since, dropped = adapter.flags_since, {}
    for name in space.params:
        flag = adapter.flag_for(name)
        if flag in since and not adapter.offers(name, known):
            release = f"{adapter.title} {known.version}" if known.version else f"the installed {adapter.title}"
            dropped[name] = f"{release} has no {flag} (it arrived in {since[flag]})"
    for name, param in space.in_dependency_order():
        if name not in dropped and (gone := next((c for c in param.condition or {} if c in dropped), None)):
            dropped[name] = f"its condition names {gone}, which is left out"
    if not dropped:
        return space, []
    kept = {name: param for name, param in space.params.items() if name not in dropped}
    notes = [f"space {space.name or '(unnamed)'}: {name} left out: {why}" for name, why in dropped.items()]
    return space.model_copy(update={"params": kept}), notes
