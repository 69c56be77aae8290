"""When the graph stage may stop walking: only on the engine's own step counts."""

from __future__ import annotations

from autotune.search.stages.graphs import _full_coverage


def test_sglang_pass_counter_with_no_eager_pass_stops() -> None:
    why = _full_coverage({"decode_passes": 400, "cuda_graph_false_share": 0}, 512)
    assert why == "every one of 400 decode passes ran in a graph (the engine's pass counter)"
    assert _full_coverage({"decode_passes": 400, "cuda_graph_false_share": 0.1}, 512) is None


def test_vllm_table_with_every_step_graphed_stops() -> None:
    why = _full_coverage({"graph_steps": 1000, "cuda_graph_false_share": 0}, 512)
    assert why == "every one of 1,000 steps ran in a graph (vLLM's --cudagraph-metrics table)"


def test_vllm_eager_steps_above_the_largest_size_stop_and_below_it_go_on() -> None:
    graphs = {"graph_steps": 1000, "cuda_graph_false_share": 0.03, "eager_min_tokens": 2078}
    assert "2,078 tokens or more, above the largest size tried (512)" in str(_full_coverage(graphs, 512))
    # A step of 2,078 tokens is one a captured size of 4,096 would take: the walk goes on.
    assert _full_coverage(graphs, 4096) is None
    assert _full_coverage({**graphs, "eager_min_tokens": 512}, 512) is None


def test_no_step_counts_no_stop() -> None:
    # Sampled gauges are not counts: a running-batch peak alone never stops the walk.
    assert _full_coverage({"cuda_graph_max_bs": 256}, 512) is None
    assert _full_coverage({}, 512) is None
