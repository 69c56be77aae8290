"""The simulator's --cudagraph-metrics table: vLLM's format, read back by the vLLM adapter."""

from __future__ import annotations

from autotune.config import EngineSettings
from autotune.engines.vllm import VllmAdapter
from autotune_sim.dialects.vllm import graph_stat, graph_table
from autotune_sim.perf import GraphMode

SIZES = [1, 2, 4, 8, 16, 24, 32]


def test_a_graphed_step_is_padded_to_the_next_captured_size_and_an_eager_one_is_not() -> None:
    assert graph_stat(30, GraphMode.FULL, SIZES) == (30, 32, 2, "FULL")
    assert graph_stat(8, GraphMode.PIECEWISE, SIZES) == (8, 8, 0, "PIECEWISE")
    assert graph_stat(2048, GraphMode.EAGER, SIZES) == (2048, 2048, 0, "NONE")


def test_the_table_reads_back_as_the_steps_it_counted() -> None:
    stats = {graph_stat(30, GraphMode.FULL, SIZES): 870, graph_stat(2078, GraphMode.EAGER, SIZES): 10}
    prefix = "(APIServer pid=7) INFO 12-07 01:13:34 [loggers.py:344] "
    lines = [prefix + part for part in graph_table("FULL_AND_PIECEWISE", SIZES, stats).split("\n")]
    adapter = VllmAdapter(EngineSettings(kind="vllm", model="m", command=["unused"]))
    events = [e for e in map(adapter.parse_log_line, lines) if e is not None]
    facts = adapter.engine_facts(events, {}, {})
    assert facts["graph_steps"] == 880 and facts["eager_min_tokens"] == 2078 and facts["cuda_graph_max_bs"] == 32
    assert facts["cuda_graph_false_share"] == round(10 / 880, 4)
