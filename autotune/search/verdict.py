"""Did the winner beat the engine's defaults? A paired comparison over the validation rounds.

Each validation round runs the defaults and every finalist one after another with fresh
engines, so round *i* of the defaults and round *i* of the winner saw the same machine. The gain
of each round is one sample; the study calls a winner better only when every round favours it.
"""

from __future__ import annotations

import statistics
from typing import Any

from optuna.trial import FrozenTrial

from autotune.search.objective import is_feasible
from autotune.search.record import trial_record
from autotune.search.storage import primary_value

__all__ = ["paired_gains", "paired_verdict"]


def _value(t: FrozenTrial) -> float | None:
    r = trial_record(t)
    feasible = is_feasible(r.outcome, r.constraints)
    return float(primary_value(t) or 0.0) if feasible and t.values else None


def paired_gains(defaults: list[FrozenTrial], finalist: list[FrozenTrial], sign: float) -> list[float]:
    """Relative gain of the finalist over the defaults, one per validation round (run i of each,
    measured next to each other); rounds where either did not serve within the SLOs are left out."""
    gains = []
    for d, f in zip(sorted(defaults, key=lambda t: t.number), sorted(finalist, key=lambda t: t.number), strict=False):
        dv, fv = _value(d), _value(f)
        if dv and fv is not None:
            gains.append(sign * (fv - dv) / dv)
    return gains


def paired_verdict(number: int, gains: list[float], *, winner_is_defaults: bool = False) -> dict[str, Any]:
    """The study's conclusion about the winner against the defaults, with the words to say it.

    ``beats_defaults`` holds only when every paired round favours the winner (the range of the
    gains excludes zero) and there were at least two rounds: one pair has no measured noise.
    """
    if winner_is_defaults:
        line = "the engine's defaults won: no candidate beat them"
        return {"winner": number, "pairs": len(gains), "beats_defaults": False, "line": line}
    if not gains:
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
    return {"winner": number, "pairs": len(gains), "gain": gain, "low": low, "high": high, "noise": noise,
            "beats_defaults": beats, "line": line}  # fmt: skip
