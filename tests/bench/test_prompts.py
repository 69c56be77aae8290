"""Exact-length prompts through a fake /tokenize and /detokenize."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from fake_openai import BOS, FakeOpenAI

from autotune.bench.prompts import PromptSet, ServerTokenizer, build_prompts, sample_lengths
from autotune.config import Dataset
from autotune.errors import BenchmarkError

BASE = "http://server"


def build(
    fake: FakeOpenAI, dataset: Dataset, n: int = 20, seed: int = 0, fmt: str = "ids", stream: int = 0
) -> PromptSet:
    async def go() -> PromptSet:
        async with fake.client() as client:
            tok = ServerTokenizer(client, BASE, fake.model)
            return await build_prompts(tok, dataset, n, seed=seed, fmt=fmt, stream=stream)  # type: ignore[arg-type]

    return asyncio.run(go())


def test_sample_lengths_follow_vllm_range_ratio() -> None:
    d = Dataset(input_len=100, output_len=10, range_ratio=0.5)
    ins, outs = sample_lengths(d, 5000, np.random.default_rng(0))
    assert ins.min() == 50 and ins.max() == 150
    assert outs.min() == 5 and outs.max() == 15
    # Same numbers as vLLM's get_sampling_params with default_rng(seed): input, then output.
    rng = np.random.default_rng(0)
    assert np.array_equal(ins, rng.integers(50, 151, size=5000))
    assert np.array_equal(outs, rng.integers(5, 16, size=5000))


def test_sample_lengths_subtract_special_tokens_and_keep_one_output_token() -> None:
    d = Dataset(input_len=64, output_len=1, range_ratio=0.0)
    ins, outs = sample_lengths(d, 3, np.random.default_rng(0), num_special_tokens=1)
    assert ins.tolist() == [63] * 3 and outs.tolist() == [1] * 3


def test_sample_lengths_refuse_an_empty_prompt() -> None:
    with pytest.raises(BenchmarkError, match="no prompt token"):
        sample_lengths(Dataset(input_len=1), 1, np.random.default_rng(0), num_special_tokens=1)


def test_id_prompts_have_exact_lengths_and_no_special_ids(fake: FakeOpenAI) -> None:
    d = Dataset(input_len=300, output_len=20, range_ratio=0.3, prefix_len=0)
    ps = build(fake, d, n=50)
    expected_in, expected_out = sample_lengths(d, 50, np.random.default_rng(0))
    assert [len(p.prompt) for p in ps.prompts] == expected_in.tolist()
    assert [p.prompt_len for p in ps.prompts] == expected_in.tolist()
    assert [p.output_len for p in ps.prompts] == expected_out.tolist()
    assert all(BOS not in p.prompt for p in ps.prompts)
    assert ps.format == "ids" and ps.max_model_len == 4096 and ps.off_target == 0


def test_same_seed_same_prompts_other_seed_or_stream_differs(fake: FakeOpenAI) -> None:
    d = Dataset(input_len=100, output_len=8)
    a, b = build(fake, d, seed=5), build(fake, d, seed=5)
    assert a.prompts == b.prompts
    assert build(fake, d, seed=6).prompts != a.prompts
    assert build(fake, d, seed=5, stream=1).prompts != a.prompts


def test_prompts_share_no_long_prefix_without_prefix_len(fake: FakeOpenAI) -> None:
    ps = build(fake, Dataset(input_len=200, output_len=4), n=100)
    starts = {tuple(p.prompt[:64]) for p in ps.prompts}
    assert len(starts) == 100


def test_shared_prefix_is_prepended_and_shared_with_warmup(fake: FakeOpenAI) -> None:
    d = Dataset(input_len=50, output_len=4, prefix_len=40)
    measured, warm = build(fake, d, n=10), build(fake, d, n=3, stream=1)
    prefix = measured.prompts[0].prompt[:40]
    for p in measured.prompts + warm.prompts:
        assert len(p.prompt) == 90 and p.prompt[:40] == prefix
    assert len({tuple(p.prompt[40:]) for p in measured.prompts}) == 10


def test_text_prompts_retokenize_to_the_target_count(fake: FakeOpenAI) -> None:
    # The merging tokenizer turns decoded ["t","h"] back into ["th"]: alignment must fix the count.
    d = Dataset(input_len=120, output_len=4, range_ratio=0.5, prefix_len=16)
    ps = build(fake, d, n=30, fmt="text")
    assert ps.num_special_tokens == 1 and ps.off_target == 0
    ins, _ = sample_lengths(d, 30, np.random.default_rng(0), num_special_tokens=1)
    for p, k in zip(ps.prompts, ins.tolist(), strict=True):
        assert isinstance(p.prompt, str)
        server_count = len(fake.tok.encode(p.prompt, add_special_tokens=True))
        assert server_count == p.prompt_len == 16 + k + 1
        assert p.on_target


def test_text_prompts_with_sglang_detokenize_shape(fake: FakeOpenAI) -> None:
    fake.dialect = "sglang"
    ps = build(fake, Dataset(input_len=40, output_len=2), n=5, fmt="text")
    assert all(isinstance(p.prompt, str) and p.prompt for p in ps.prompts)


def test_missing_tokenize_route_is_a_one_line_error(fake: FakeOpenAI) -> None:
    fake.has_tokenize = False
    with pytest.raises(BenchmarkError, match=r"/tokenize answered 404; exact-length prompts need"):
        build(fake, Dataset())


def test_unreachable_server_is_a_one_line_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("All connection attempts failed", request=request)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
            await build_prompts(ServerTokenizer(client, BASE, "m"), Dataset(), 1, seed=0)

    with pytest.raises(BenchmarkError, match=r"^cannot reach http://server/tokenize: ConnectError"):
        asyncio.run(go())


def test_long_prompts_repeat_the_corpus(fake: FakeOpenAI) -> None:
    ps = build(fake, Dataset(input_len=20_000, output_len=1), n=2)
    assert [len(p.prompt) for p in ps.prompts] == [20_000, 20_000]


def test_alignment_extends_a_tail_that_merged_on_re_encoding(fake: FakeOpenAI) -> None:
    from autotune.bench.prompts import _align_text

    t, h = fake.tok.ids["t"], fake.tok.ids["h"]
    ids = [t, h] * 10  # decodes to "thth...", which re-encodes to 10 "th" tokens
    reserve = [t, h] * 20

    async def go() -> tuple[str, int]:
        async with fake.client() as client:
            return await _align_text(ServerTokenizer(client, BASE, "m"), ids, reserve, 20)

    text, count = asyncio.run(go())
    assert count == 20 and len(fake.tok.encode(text)) == 20
