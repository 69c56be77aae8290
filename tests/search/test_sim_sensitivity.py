"""The sensitivity benchmark's logic: constants patched where the simulator reads them and put
back, a winner and a verdict read from the rows, saved rows printed again. No timings."""

from __future__ import annotations

import json
import math
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
from benchmark_loader import load_benchmark

from autotune_sim import memory
from autotune_sim.dialects import vllm as vllm_dialect
from autotune_sim.memory import footprint, step_bytes
from autotune_sim.presets import find_model


@pytest.fixture(scope="module")
def ss() -> Any:
    return load_benchmark("sim_sensitivity")


def test_a_patched_constant_reaches_every_module_that_reads_it_and_is_put_back(ss: Any) -> None:
    model = find_model("meta-llama/Llama-3.1-8B-Instruct")
    assert model is not None
    fp = footprint(model)
    nominal, frag = step_bytes(fp, 8192, 256), memory.FRAGMENTATION
    with ss.patched(ss.BY_NAME["FRAGMENTATION"], 0.5):
        assert memory.FRAGMENTATION == 0.5 and vllm_dialect.FRAGMENTATION == 0.5  # bound by name there
        assert step_bytes(fp, 8192, 256) == pytest.approx(nominal / (1 + frag) * 1.5)
    assert frag == memory.FRAGMENTATION and frag == vllm_dialect.FRAGMENTATION
    assert step_bytes(fp, 8192, 256) == nominal


def test_every_range_brackets_the_nominal_value_and_says_why(ss: Any) -> None:
    for a in ss.ASSUMPTIONS:
        assert a.low <= a.value("nominal") <= a.high and a.low < a.high, a.name
        assert "vllm#" in a.why, a.name  # each range cites a published source


def _row(ss: Any, assumption: str, level: str, methods: dict[str, tuple[int, int, float]]) -> Any:
    return ss.Row(assumption, level, None if not assumption else 0.1, "c", 1000.0, 0.9, "ok", methods)


def test_the_winner_reaches_most_often_then_costs_least(ss: Any) -> None:
    row = _row(ss, "", "nominal", {"staged": (5, 5, 900.0), "tpe": (5, 5, 400.0), "grid": (0, 5, math.inf)})
    assert ss.winner(row) == "tpe"
    row = _row(ss, "", "nominal", {"staged": (5, 5, 900.0), "tpe": (4, 5, 400.0)})
    assert ss.winner(row) == "staged"
    assert ss.winner(_row(ss, "", "nominal", {"grid": (0, 5, math.inf)})) is None


def test_verdict_says_when_a_conclusion_holds_at_one_value_only(ss: Any) -> None:
    nominal = {"staged": (5, 5, 900.0), "tpe": (2, 5, math.inf), "grid": (0, 5, math.inf)}
    rows = [
        _row(ss, "", "nominal", nominal),
        _row(ss, "X", "low", {"staged": (5, 5, 900.0), "tpe": (5, 5, 300.0), "grid": (5, 5, 700.0)}),
        _row(ss, "X", "high", nominal),
    ]
    (line,) = ss.verdicts(rows)
    assert "winner staged only at some settings (X low: tpe)" in line
    assert "grid reaches 97 % on a number of seeds that depends on the setting" in line and "X low: 5" in line
    (steady,) = ss.verdicts([rows[0], rows[2]])
    assert "winner staged at every setting; grid reaches 97 % on 0/5 seeds at every setting" in steady


def test_saved_rows_print_the_same_table(ss: Any, tmp_path: Path) -> None:
    rows = [_row(ss, "", "nominal", {"staged": (5, 5, 900.0), "grid": (0, 5, math.inf)})]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([ss.asdict(r) for r in rows]))
    assert ss.load_rows([str(path)]) == rows
    text = ss.table(rows, ["staged", "grid"])
    assert "| c | nominal | 1,000 | 90 % | 5/5, 900 s | 0/5, – |" in text
    with pytest.raises(SystemExit, match="cannot read"):
        ss.load_rows([str(tmp_path / "missing.json")])


def test_each_assumption_runs_at_both_ends_after_the_nominal_model(ss: Any) -> None:
    se = ss.load_search_efficiency()
    case = se.CASES[0]
    calls: list[tuple[str, str]] = []

    class Fake:
        CASES = se.CASES

        @staticmethod
        def evaluate_case(c: Any, *a: Any) -> Any:
            calls.append((c.name, str(memory.FRAGMENTATION)))
            return [Namespace(case=c.name, optimum=1.0, default_share=1.0, default_outcome="ok", methods={})]

    args = Namespace(seeds=1, budget=1, methods=[], noise=0.0)
    fragmentation = ss.BY_NAME["FRAGMENTATION"]
    rows = ss.run_rows(Fake, [fragmentation], ["low", "nominal", "high"], [case], args, lambda m: None)
    assert [(r.case, r.level) for r in rows] == [(case.name, "nominal"), (case.name, "low"), (case.name, "high")]
    # The evaluation saw the patched value, and the nominal one again afterwards.
    assert calls == [(case.name, str(memory.FRAGMENTATION)), (case.name, "0.05"), (case.name, "0.5")]
    assert memory.FRAGMENTATION not in (fragmentation.low, fragmentation.high)
