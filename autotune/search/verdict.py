"""Did the winner beat the engine's defaults? A paired comparison over the validation rounds.

Each validation round runs the defaults and every finalist one after another with fresh
engines, so round *i* of the defaults and round *i* of the winner saw the same machine. The gain
of each round is one sample; the study calls a winner better only when every round favours it.

Under SLOs the rounds also say who met them. A goodput objective prices every missed request
already, so a round counts even where a run missed an aggregate SLO; any other objective counts
only rounds both met, and defaults that missed the SLOs in every round beside a winner that met
them in every round are beaten outright: they do not serve the workload as declared.
"""

from __future__ import annotations

import statistics
from typing import Any

from optuna.trial import FrozenTrial

from autotune.outcomes import SERVED
from autotune.search.objective import is_feasible
from autotune.search.record import trial_record
from autotune.search.storage import primary_value

__all__ = ["paired_gains", "paired_verdict", "slo_misses"]


def _served(t: FrozenTrial) -> bool:
    """The engine served the workload (within its SLOs or not), so the run has measurements."""
    return trial_record(t).outcome in SERVED and bool(t.values)


def _missed_slos(t: FrozenTrial) -> bool:
    r = trial_record(t)
    return _served(t) and not is_feasible(r.outcome, r.constraints)


def _value(t: FrozenTrial, priced: bool) -> float | None:
    """The run's objective value when it counts: it met the SLOs, or (``priced``) it served."""
    counts = _served(t) and (priced or not _missed_slos(t))
    return float(primary_value(t) or 0.0) if counts else None


def _rounds(defaults: list[FrozenTrial], finalist: list[FrozenTrial]) -> list[tuple[FrozenTrial, FrozenTrial]]:
    """Run i of the defaults beside run i of the finalist (measured next to each other)."""
    return list(zip(sorted(defaults, key=lambda t: t.number), sorted(finalist, key=lambda t: t.number), strict=False))


def paired_gains(
    defaults: list[FrozenTrial], finalist: list[FrozenTrial], sign: float, *, priced: bool = False
) -> list[float]:
    """Relative gain of the finalist over the defaults, one per validation round; rounds where
    either did not serve, or (unless the objective ``priced`` SLO misses) missed the SLOs, are left out."""
    gains = []
    for d, f in _rounds(defaults, finalist):
        dv, fv = _value(d, priced), _value(f, priced)
        if dv and fv is not None:
            gains.append(sign * (fv - dv) / dv)
    return gains


def slo_misses(defaults: list[FrozenTrial], finalist: list[FrozenTrial]) -> dict[str, int]:
    """Of the rounds both served: how many the defaults and the finalist each missed the SLOs in."""
    served = [(d, f) for d, f in _rounds(defaults, finalist) if _served(d) and _served(f)]
    return {
        "rounds": len(served),
        "defaults": sum(_missed_slos(d) for d, _ in served),
        "winner": sum(_missed_slos(f) for _, f in served),
    }


def _misses_clause(misses: dict[str, int] | None) -> str:
    if not misses or not (misses["defaults"] or misses["winner"]):
        return ""
    return (
        f"; the defaults missed the SLOs in {misses['defaults']} of {misses['rounds']} rounds, "
        f"the winner in {misses['winner']}"
    )


def _outright(number: int, misses: dict[str, int] | None) -> dict[str, Any] | None:
    """Defaults that missed the SLOs in every round beside a winner that met them in every one."""
    if not misses or not misses["rounds"] or misses["winner"] or misses["defaults"] < misses["rounds"]:
        return None
    n = misses["rounds"]
    rounds = {1: "the one round", 2: "both rounds"}.get(n, f"all {n} rounds")
    line = f"the engine's defaults missed the workload's SLOs in {rounds} beside the winner, which met them"
    if n == 1:
        line += ": one round, so this is not yet a measured result"
    return {"winner": number, "pairs": 0, "slo_misses": misses, "beats_defaults": True if n > 1 else None,
            "line": line}  # fmt: skip


def paired_verdict(
    number: int, gains: list[float], *, winner_is_defaults: bool = False, misses: dict[str, int] | None = None
) -> dict[str, Any]:
    """The study's conclusion about the winner against the defaults, with the words to say it.

    ``beats_defaults`` holds only when every paired round favours the winner (the range of the
    gains excludes zero) and there were at least two rounds: one pair has no measured noise. With
    no paired gain, defaults that missed the SLOs (``misses``, from :func:`slo_misses`) in every
    one of two or more rounds where the winner met them are beaten too.
    """
    if winner_is_defaults:
        line = "the engine's defaults won: no candidate beat them"
        return {"winner": number, "pairs": len(gains), "beats_defaults": False, "line": line}
    if not gains:
        if outright := _outright(number, misses):
            return outright
        line = "no paired runs of the defaults beside the winner: its gain over them is not measured"
        return {"winner": number, "pairs": 0, "beats_defaults": None, "line": line}
    low, high, gain = min(gains), max(gains), statistics.median(gains)
    noise = (high - low) / 2
    if len(gains) < 2:
        line = f"gain over the engine's defaults {gain:+.1%} from one paired run: its noise is not measured"
        beats: bool | None = None
    elif low > 0:
        line = (
            f"gain over the engine's defaults {gain:+.1%} "
            f"(range {low:+.1%} … {high:+.1%} over {len(gains)} paired runs)"
        )
        beats = True
    else:
        line = (
            f"no candidate beat the engine's defaults beyond the measured noise of ±{noise:.1%} "
            f"(winner {gain:+.1%}, range {low:+.1%} … {high:+.1%} over {len(gains)} paired runs)"
        )
        beats = False
    line += _misses_clause(misses)
    return {"winner": number, "pairs": len(gains), "gain": gain, "low": low, "high": high, "noise": noise,
            "beats_defaults": beats, "line": line, **({"slo_misses": misses} if misses else {})}  # fmt: skip
