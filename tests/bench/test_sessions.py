"""Multi-turn sessions, custom files, shared prefixes and cache resets, against the fake server."""

from __future__ import annotations

import asyncio
import collections
import itertools
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI

from autotune.bench.loadgen import BenchResult, run_workload
from autotune.config import Workload, parse_model

BASE = "http://server:8000"


def run(fake: FakeOpenAI, spec: dict[str, Any], **kw: Any) -> BenchResult:
    w = parse_model(Workload, {"seed": 3, **spec}, "test")

    async def go() -> BenchResult:
        async with fake.client() as client:
            return await run_workload(BASE, w, client=client, **kw)

    return asyncio.run(go())


MULTI = {
    "endpoint": "chat",
    "num_prompts": 5,
    "warmup_requests": 1,
    "dataset": {"kind": "multi_turn", "turns": 3, "input_len": 20, "output_len": 4, "think_time_s": 0.02},
    "arrival": {"concurrency": 2},
}


def test_each_turn_carries_the_history_with_the_servers_answers(fake: FakeOpenAI) -> None:
    res = run(fake, MULTI)
    measured = fake.bodies[1:]  # the first body is the warm-up
    assert len(measured) == 15 and res.metrics["completed"] == 15
    sessions: dict[str, list[list[dict[str, str]]]] = collections.defaultdict(list)
    for body in measured:
        sessions[body["messages"][0]["content"]].append(body["messages"])
    assert len(sessions) == 5
    for turns in sessions.values():
        assert [len(m) for m in turns] == [1, 3, 5]
        assert [m["role"] for m in turns[2]] == ["user", "assistant", "user", "assistant", "user"]
        assert turns[1][1]["content"] == "xxxx"  # the answer streamed for turn 0
        assert turns[2][:3] == turns[1]  # the history is carried, not rebuilt


def test_records_are_ordered_by_session_and_turn_and_prompts_grow(fake: FakeOpenAI) -> None:
    res = run(fake, MULTI)
    assert [(r.session, r.turn) for r in res.records] == [(s, t) for s in range(5) for t in range(3)]
    for s in range(5):
        turns = res.records[3 * s : 3 * s + 3]
        assert turns[0].prompt_len < turns[1].prompt_len < turns[2].prompt_len
        for before, after in itertools.pairwise(turns):
            assert after.start_time >= before.end_time + 0.02  # the think time passed first
    out = res.to_json(detailed=True)
    assert out["session_ids"][:4] == [0, 0, 0, 1] and out["turn_ids"][:4] == [0, 1, 2, 0]
    assert out["num_requests"] == 15 and out["num_sessions"] == 5 and out["dataset"] == "multi_turn"


def test_a_failed_turn_ends_its_session(fake: FakeOpenAI) -> None:
    fake.fail_every = 2  # the 2nd completion is the first session's 2nd turn (concurrency 1)
    res = run(fake, {**MULTI, "warmup_requests": 0, "num_prompts": 1, "arrival": {"concurrency": 1}})
    assert [r.success for r in res.records] == [True, False, False]
    assert res.records[2].error == "not sent: turn 1 of its session failed"
    assert res.metrics["failed"] == 2 and len(fake.bodies) == 2


def test_multi_turn_completions_join_the_history_as_text(fake: FakeOpenAI) -> None:
    spec = {**MULTI, "endpoint": "completions", "num_prompts": 1, "warmup_requests": 0}
    run(fake, spec)
    first, second, third = (b["prompt"] for b in fake.bodies)
    assert isinstance(first, str) and second.startswith(first + "xxxx\n\n") and third.startswith(second + "xxxx")


def _custom(tmp_path: Path) -> dict[str, Any]:
    lines = [
        '{"prompt": "alpha one", "output_tokens": 3}',
        '{"prompt": "beta two"}',
        '{"turns": ["gamma", {"prompt": "delta", "output_tokens": 2}], "think_time_s": 0.01}',
        '{"prompt": "omega last", "output_tokens": 1}',
    ]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    return {
        "endpoint": "chat",
        "num_prompts": 5,
        "warmup_requests": 1,
        "dataset": {"kind": "custom", "path": str(tmp_path / "p.jsonl"), "output": 7},
        "arrival": {"concurrency": 1},
    }


def test_custom_file_is_sent_in_order_and_repeats(fake: FakeOpenAI, tmp_path: Path) -> None:
    res = run(fake, _custom(tmp_path))
    sent = [(b["messages"][-1]["content"], b["max_completion_tokens"]) for b in fake.bodies]
    assert sent[0] == ("omega last", 1)  # warm-up: from the end of the file
    # "delta" is gamma's 2nd turn: it waits for the think time while the next session starts.
    assert [x for x in sent[1:] if x[0] != "delta"] == [
        ("alpha one", 3),
        ("beta two", 7),  # no output_tokens: drawn from `output`
        ("gamma", 7),
        ("omega last", 1),
        ("alpha one", 3),  # the 5th session wraps around
    ]
    assert ("delta", 2) in sent
    delta = next(b for b in fake.bodies if b["messages"][-1]["content"] == "delta")
    assert [m["content"] for m in delta["messages"]] == ["gamma", "x" * 7, "delta"]
    assert res.num_sessions == 5 and res.metrics["completed"] == 6
    assert res.prompt_format == "text" and res.prompt_len_mismatches == 0


def test_custom_runs_without_a_tokenizer(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.has_tokenize = False
    res = run(fake, _custom(tmp_path))
    assert res.metrics["failed"] == 0


RAG = {
    "num_prompts": 40,
    "warmup_requests": 4,
    "dataset": {"prefix_len": 32, "num_prefixes": 4, "input_len": 16, "output_len": 2},
}


def test_shared_prefixes_get_an_even_share_and_warm_up_covers_them(fake: FakeOpenAI) -> None:
    run(fake, RAG, salt=0)
    warm = [tuple(b["prompt"][:32]) for b in fake.bodies[:4]]
    measured = collections.Counter(tuple(b["prompt"][:32]) for b in fake.bodies[4:])
    assert len(set(warm)) == 4 and set(warm) == set(measured)
    assert sorted(measured.values()) == [10, 10, 10, 10]
    assert len({tuple(b["prompt"][32:]) for b in fake.bodies}) == 44  # suffixes are unique


def test_a_new_run_draws_new_prefixes(fake: FakeOpenAI) -> None:
    run(fake, RAG)
    first = {tuple(b["prompt"][:32]) for b in fake.bodies}
    fake.bodies.clear()
    run(fake, RAG)
    assert not first & {tuple(b["prompt"][:32]) for b in fake.bodies}


@pytest.mark.parametrize("route", ["/reset_prefix_cache", "/flush_cache", None])
def test_prefix_cache_is_reset_before_each_run_where_possible(fake: FakeOpenAI, route: str | None) -> None:
    fake.reset_route = route
    res = run(fake, {"num_prompts": 2, "warmup_requests": 0, "dataset": {"input_len": 8, "output_len": 2}})
    assert res.prefix_cache_reset == (route or "unsupported")
    assert fake.resets == (1 if route else 0)
    assert res.to_json()["prefix_cache_reset"] == res.prefix_cache_reset
    run(fake, {"num_prompts": 2, "reset_prefix_cache": False, "dataset": {"input_len": 8, "output_len": 2}})
    assert fake.resets == (1 if route else 0)


def test_ramp_up_runs_and_reports_vllms_ramp_keys(fake: FakeOpenAI) -> None:
    spec = {
        "num_prompts": 30,
        "warmup_requests": 0,
        "dataset": {"input_len": 8, "output_len": 2},
        "arrival": {"ramp_up": {"strategy": "linear", "start_rps": 200, "end_rps": 2000}},
    }
    out = run(fake, spec).to_json()
    assert out["completed"] == 30
    assert (out["ramp_up_strategy"], out["ramp_up_start_rps"], out["ramp_up_end_rps"]) == ("linear", 200, 2000)
