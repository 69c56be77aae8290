"""The memory-edge probe: step and bisection find the same edge at 0.02 resolution, the edge
keeps a safety step below the first failure, and too-low failures push upward."""

import json
import math
from pathlib import Path

import pytest

from autotune.config import Workload, as_given, load_yaml, parse_model
from autotune.search.stages import (
    MemoryProbe,
    conservativeness_hint,
    peak_requests,
    peak_workload,
    plan_budget,
    scenario_of,
)

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"


def _drive(probe: MemoryProbe, true_edge: float, floor: float = 0.0) -> tuple[float | None, int]:
    """Run the probe against an engine that OOMs above true_edge and lacks KV below floor."""
    results: dict[float, str] = {}
    while (f := probe.next(results)) is not None:
        results[f] = "too_high" if f > true_edge + 1e-9 else ("too_low" if f < floor - 1e-9 else "ok")
        assert len(results) < 50
    return probe.edge(results), len(results)


@pytest.mark.parametrize("true_edge", [0.84, 0.88, 0.90, 0.94])
def test_step_and_bisect_agree(true_edge: float) -> None:
    step_edge, step_n = _drive(MemoryProbe(start=0.80, high=0.98, mode="step"), true_edge)
    bis_edge, bis_n = _drive(MemoryProbe(start=0.80, high=0.98, mode="bisect"), true_edge)
    # last stable value minus one safety step
    assert step_edge == pytest.approx(true_edge - 0.02)
    assert bis_edge == pytest.approx(step_edge)
    assert bis_n <= step_n


def test_bisection_needs_fewer_launches_over_a_wide_range() -> None:
    _, step_n = _drive(MemoryProbe(start=0.50, high=0.98, mode="step"), 0.92)
    _, bis_n = _drive(MemoryProbe(start=0.50, high=0.98, mode="bisect"), 0.92)
    assert bis_n < step_n / 2


def test_no_failure_in_range_keeps_the_top() -> None:
    edge, _ = _drive(MemoryProbe(start=0.80, high=0.90), 0.99)
    assert edge == pytest.approx(0.90)


def test_too_low_start_moves_up() -> None:
    edge, _ = _drive(MemoryProbe(start=0.80, high=0.96, mode="bisect"), 0.92, floor=0.86)
    assert edge == pytest.approx(0.90)


def test_start_already_too_high_steps_down() -> None:
    edge, _ = _drive(MemoryProbe(start=0.80, high=0.96), 0.72)
    assert edge is not None and edge <= 0.72


def test_peak_workload_is_longest_requests_all_at_once() -> None:
    wl = parse_model(
        Workload,
        {
            "dataset": {"input_len": 1000, "output_len": 200, "range_ratio": 0.5},
            "slos": {"p95_ttft_ms": 100},
            "arrival": {"request_rate": 4},
        },
        "t",
    )
    peak = peak_workload(wl, 128)
    assert (peak.dataset.input_dist.low, peak.dataset.input_dist.high) == (1500, 1500)
    assert (peak.dataset.output_dist.low, peak.dataset.output_dist.high) == (300, 300)
    assert peak.arrival.concurrency == 128 and math.isinf(peak.arrival.request_rate)
    assert peak.num_prompts == 128 and not peak.slos


# A 70B model on two 80 GB cards, as vLLM logs it per rank: 67.85 GiB of weights, 160 KiB of KV per token.
SEVENTY_B = {
    "memory_budget": "total",
    "mem_total_gib": 79.19,
    "mem_free_gib": 78.69,
    "weights_gib": 67.85,
    "kv_bytes_per_token": 163840,
}


def test_a_probe_sends_two_rounds_of_the_most_its_pool_could_hold() -> None:
    # 0.92 × 79.19 − 67.85 = 5.0 GiB, all of it KV at most: 32.8k tokens, 14.2 requests of 2304.
    assert peak_requests(SEVENTY_B, 0.92, 2304) == 2 * 15
    assert peak_requests(SEVENTY_B, 0.96, 2304) == 2 * 24  # a higher fraction holds more
    # SGLang's static fraction is of the free memory: 0.92 × 78.69 − 67.85 = 4.55 GiB.
    assert peak_requests({**SEVENTY_B, "memory_budget": "static"}, 0.92, 2304) == 2 * 13
    assert peak_requests(SEVENTY_B, 0.80, 2304) == 2  # the weights do not fit: one request a round
    peak = peak_workload(parse_model(Workload, {"dataset": {"input_len": 2000, "output_len": 300}}, "t"), 1024, 30)
    assert peak.num_prompts == 30 and peak.arrival.concurrency == 1024


@pytest.mark.parametrize("missing", ["memory_budget", "mem_total_gib", "weights_gib", "kv_bytes_per_token"])
def test_a_probe_without_the_start_up_facts_sends_one_request_per_slot(missing: str) -> None:
    facts = {k: v for k, v in SEVENTY_B.items() if k != missing}
    assert peak_requests(facts, 0.92, 2304) is None
    assert peak_workload(parse_model(Workload, {}, "t"), 64, None).num_prompts == 64


def test_peak_of_a_multi_turn_workload_carries_the_whole_history() -> None:
    wl = parse_model(
        Workload,
        {"dataset": {"kind": "multi_turn", "input_len": 200, "output_len": 100, "turns": 4}},
        "t",
    )
    peak = peak_workload(wl, 8)
    # One request as long as the last turn of a session: four prompts and three answers before it.
    assert peak.dataset.kind == "random"
    assert peak.dataset.input_dist.high + peak.dataset.output_dist.high <= wl.longest_request_tokens
    assert peak.dataset.input_dist.high >= 4 * 200 + 3 * 100


@pytest.mark.parametrize(
    ("name", "scenario"),
    [
        ("chat", "online"),
        ("offline-batch", "offline"),
        ("long-context", "long_context"),
        ("rag-prefix", "shared_prefix"),
        ("multi-turn", "online"),
    ],
)
def test_shipped_workloads_map_to_their_scenario(name: str, scenario: str) -> None:
    assert scenario_of(load_yaml(WORKLOADS / f"{name}.yaml", Workload)) == scenario


@pytest.mark.parametrize("name", ["chat", "offline-batch", "long-context", "rag-prefix", "multi-turn", "custom"])
def test_a_peak_workload_survives_the_study_storage(name: str) -> None:
    # A failed probe trial is retried from its stored workload: the dump must rebuild the same one.
    peak = peak_workload(load_yaml(WORKLOADS / f"{name}.yaml", Workload), 16)
    stored = json.loads(json.dumps(peak.model_dump(mode="json")))
    assert Workload.model_validate(as_given(Workload, stored)) == peak


def test_conservativeness_rule() -> None:
    assert conservativeness_hint({"retractions": 3}, 1.0) == 1.3
    assert conservativeness_hint({"token_usage_peak": 0.7, "queue_peak": 40}, 1.0) == 0.6
    assert conservativeness_hint({"token_usage_peak": 0.95, "queue_peak": 40}, 1.0) is None


def test_budget_leaves_room_for_the_search() -> None:
    from autotune.config import SearchSpace

    space = parse_model(
        SearchSpace,
        {
            "params": {
                "memory_fraction": {"type": "float", "low": 0.8, "high": 0.96, "step": 0.02},
                "cuda_graph_max_bs": {"type": "categorical", "choices": [256, 512, 768]},
                "max_running": {"type": "int", "low": 8, "high": 512},
            }
        },
        "t",
    )
    budget = plan_budget(20, space)
    assert budget["memory_edge"] >= 3 and budget["cuda_graph"] == 2
    assert budget["scenario"] >= 7
