"""The real-engine search benchmark's report: reach against the grid's best within the noise of
the two picks' runs, and the verdict on whether the picks can be told apart."""

from __future__ import annotations

from typing import Any

import pytest
from benchmark_loader import load_benchmark

A, B, C = ({"max_running": s, "batched_tokens": 2048} for s in (16, 64, 128))


@pytest.fixture(scope="module")
def rs() -> Any:
    return load_benchmark("real_search")


def _run(n: int, stage: str, params: dict[str, int], value: float | None, seconds: float = 40.0) -> dict[str, Any]:
    return {"number": n, "stage": stage, "params": params, "outcome": "ok", "value": value, "engine_s": seconds}


def _payload(repeats: dict[str, list[float]]) -> dict[str, Any]:
    return {
        "staged": [_run(0, "baseline", {}, 900.0), _run(1, "scenario", A, 500.0), _run(2, "scenario", C, 1010.0)],
        "grid": [_run(0, "grid", A, 510.0, 30.0), _run(1, "grid", B, 1000.0, 50.0), _run(2, "grid", C, 990.0)],
        "repeats": repeats,
        "host": {"cpu": {"model": "test", "cores": 2, "flags": ["avx2"]}},
    }


def test_reach_counts_trials_and_engine_time_up_to_the_noise_bar(rs: Any) -> None:
    lines = rs.report(_payload({"grid's best": [960.0, 1040.0], "staged's best": [1000.0, 990.0]}))
    text = "\n".join(lines)
    # grid's best 1,000 (runs 1,000, 960, 1,040: 8 % spread) → bar 920: staged's baseline (900)
    # is short of it, its third trial reaches; the grid reaches on its second point.
    assert "noise 8.0%" in text
    staged = next(line for line in lines if line.startswith("| staged |"))
    grid = next(line for line in lines if line.startswith("| grid |"))
    assert staged.split("|")[6].strip() == "3" and staged.split("|")[7].strip() == "120"
    assert grid.split("|")[6].strip() == "2" and grid.split("|")[7].strip() == "80"
    assert "cannot be told apart" in text


def test_a_withdrawn_repeat_is_no_trial(rs: Any) -> None:
    # The sampler proposed A again; it was withdrawn before its engine started (0 s, no value).
    payload = _payload({"grid's best": [960.0, 1040.0], "staged's best": [1000.0, 990.0]})
    payload["staged"].insert(2, {**_run(2, "scenario", A, None, 0.0), "outcome": "withdrawn"})
    payload["staged"][3]["number"] = 3
    staged = next(line for line in rs.report(payload) if line.startswith("| staged |")).split("|")
    assert [c.strip() for c in staged[2:4]] == ["3", "1"]  # 3 trials ran, 1 repeat withdrawn
    assert staged[6].strip() == "3" and staged[7].strip() == "120"


def test_picks_further_apart_than_the_noise_are_told_apart(rs: Any) -> None:
    payload = _payload({"grid's best": [1000.0, 1000.0], "staged's best": [1290.0, 1310.0]})
    payload["staged"][2] = _run(2, "scenario", {"max_running": 96, "batched_tokens": 2048}, 1300.0)
    text = "\n".join(rs.report(payload))
    # grid's best 1,000 three times; staged's 1,290-1,310: 23 % apart against a 1.5 % spread.
    assert "noise 1.5%" in text and "differ by 23.1%, beyond the 1.5% noise" in text
