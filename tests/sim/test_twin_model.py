"""The twin's step model: its waves, its fit, and the request it reads."""

from __future__ import annotations

import math

import pytest

from autotune_sim.twin import Fit, Shape, TwinInputError, answer, fit, predict

BOX = Fit(step_s=0.006, seq_s=2e-4, token_s=25e-6, runs=0, residual=0.0)


def _shape(**kw: object) -> Shape:
    fields: dict[str, object] = {
        "concurrency": 16,
        "requests": 24,
        "input_len": 256,
        "output_len": 32,
        "lockstep": True,
    }
    return Shape(**{**fields, **kw})  # type: ignore[arg-type]


def test_a_lockstep_wave_is_its_prefill_then_its_decode_steps() -> None:
    # One wave of 4: the prompts (4 × 100 tokens) in one step, then 9 decode steps of 4 tokens.
    shape = _shape(concurrency=4, requests=4, input_len=100, output_len=10)
    out = predict(BOX, shape)
    prefill, decode = 0.006 + 400 * 25e-6, 0.006 + 4 * 2e-4
    assert out["mean_ttft_ms"] == pytest.approx(1000 * prefill)
    assert out["mean_tpot_ms"] == pytest.approx(1000 * decode)
    assert out["output_throughput"] == pytest.approx(4 * 10 / (prefill + 9 * decode))


def test_a_token_budget_splits_the_prefill_and_a_cap_queues_the_rest() -> None:
    # 4 streams, at most 2 running: two waves; the second wave's requests were sent at once, so
    # they wait the whole first wave. A budget of 100 tokens prefills 2 × 100 tokens in 2 steps.
    shape = _shape(concurrency=4, requests=4, input_len=100, output_len=10, max_running=2, batched_tokens=100)
    prefill = 2 * 0.006 + 200 * 25e-6
    wave = prefill + 9 * (0.006 + 2 * 2e-4)
    out = predict(BOX, shape)
    assert shape.batch == 2
    assert out["mean_ttft_ms"] == pytest.approx(1000 * (0.75 * prefill + wave / 2))
    assert out["output_throughput"] == pytest.approx(40 / (2 * wave))


def test_a_pool_too_small_for_one_request_is_predicted_to_fail() -> None:
    assert predict(BOX, _shape(kv_tokens=100))["failure"] == "kv_insufficient"
    # 2,000 tokens hold 7 requests of 256 + 32/2: the pool caps the batch below the concurrency.
    assert _shape(kv_tokens=2000).batch == 7


@pytest.mark.parametrize("lockstep", [True, False])
def test_runs_at_three_batch_sizes_fit_a_box_that_predicts_a_fourth(lockstep: bool) -> None:
    shapes = [
        _shape(lockstep=lockstep, max_running=m, batched_tokens=t) for m, t in ((None, None), (8, 512), (4, None))
    ]
    got = fit([(s, predict(BOX, s)) for s in shapes])
    assert got.runs == 3 and got.residual < 0.05
    unseen = _shape(lockstep=lockstep, max_running=12, batched_tokens=1024)
    for metric, value in predict(got, unseen).items():
        if metric in ("mean_ttft_ms", "mean_tpot_ms", "output_throughput"):
            assert value == pytest.approx(predict(BOX, unseen)[metric], rel=0.1), metric


def test_one_batch_size_splits_its_decode_step_by_the_prior() -> None:
    # Runs at one batch size fit the decode step, not how it divides: the prior halves it.
    shape = _shape()
    got = fit([(shape, predict(BOX, shape))])
    step = got.step_s + shape.batch * got.seq_s
    assert step == pytest.approx(BOX.step_s + shape.batch * BOX.seq_s, rel=0.1)
    assert got.step_s == pytest.approx(shape.batch * got.seq_s, rel=0.35)


def test_a_fit_that_would_need_a_negative_cost_keeps_both_non_negative() -> None:
    # TTFT below TPOT cannot come from a step model: the fit falls back to one constant.
    got = fit([(_shape(), {"mean_ttft_ms": 1.0, "mean_tpot_ms": 10.0})])
    assert got.step_s >= 0 and got.token_s >= 0 and got.residual > 0


def test_the_request_is_checked_field_by_field() -> None:
    good = {"concurrency": 4, "requests": 8, "input_len": 64, "output_len": 8}
    with pytest.raises(TwinInputError, match=r"observations\[0\]: missing field requests"):
        answer(
            {"observations": [{"concurrency": 4, "input_len": 1, "output_len": 1, "measured": {}}], "candidate": good}
        )
    with pytest.raises(TwinInputError, match=r"observations\[0\].measured"):
        answer({"observations": [good], "candidate": good})
    with pytest.raises(TwinInputError, match="no run with a positive"):
        answer({"observations": [{**good, "measured": {"mean_ttft_ms": 0}}], "candidate": good})
    with pytest.raises(TwinInputError, match="candidate: concurrency, requests and output_len must be"):
        answer({"observations": [{**good, "measured": {"mean_tpot_ms": 5}}], "candidate": {**good, "requests": 0}})
    reply = answer({"observations": [{**good, "measured": {"mean_tpot_ms": 5}}], "candidate": good})
    assert math.isfinite(reply["predicted"]["output_throughput"]) and reply["fit"]["runs"] == 1
