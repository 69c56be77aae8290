"""Quality guard for lossy knobs: greedy answers to fixed prompts, compared with the baseline's.

Some knobs can change what the engine answers, not only how fast: an fp8 KV cache, weight
quantization, a speculative-decoding bug. With temperature 0 the engine's answers to the same
prompts are (nearly) a function of its numerics, so the share of each answer that still matches
the baseline's answer is a cheap, model-agnostic regression signal. It is not an accuracy
benchmark: it says "this configuration answers differently", never "it answers worse".

The baseline trial stores its answers as ``greedy.json`` in its trial folder; later trials read
them from there and record :func:`agreement` as the fact ``quality_agreement``.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from autotune.errors import BenchmarkError

__all__ = ["QUALITY_PROMPTS", "agreement", "greedy_outputs", "load_outputs", "prefix_agreement", "save_outputs"]

#: Fixed prompts: varied enough (facts, arithmetic, code, lists, prose) that a numeric change shows
#: up in some answer, short enough that the check costs seconds.
QUALITY_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "Question: What is 17 multiplied by 23? Answer:",
    "def fibonacci(n):\n    ",
    "List three primary colors:\n1.",
    "Translate to French: 'The weather is nice today.' ->",
    "Once upon a time, in a small village by the sea,",
    "The three laws of thermodynamics are",
    "JSON object describing a cat named Tom with age 3:",
)
QUALITY_MAX_TOKENS = 32


def greedy_outputs(
    base_url: str,
    model: str,
    prompts: list[str] | tuple[str, ...] = QUALITY_PROMPTS,
    max_tokens: int = QUALITY_MAX_TOKENS,
    *,
    api_key: str | None = None,
    timeout_s: float = 120.0,
) -> list[str]:
    """The engine's greedy completion of each prompt, one request at a time.

    Requests are sequential on purpose: batching changes kernels and reduction order, so answers
    to a batch can differ from answers to the same prompts alone; one at a time they compare
    like with like across trials.

    Args:
        base_url: The server, e.g. ``http://127.0.0.1:8000``.
        model: The served model id.
        prompts: Fixed prompts (default :data:`QUALITY_PROMPTS`).
        max_tokens: Tokens per answer (the answer may stop earlier at EOS).
        api_key: Sent as a bearer token when set.
        timeout_s: Per request.

    Raises:
        BenchmarkError: The server is unreachable or answers anything but 200 with a completion.
    """
    url = base_url.rstrip("/").removesuffix("/v1") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    outputs = []
    with httpx.Client(timeout=timeout_s) as client:
        for prompt in prompts:
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
            try:
                resp = client.post(url, json=body, headers=headers)
                resp.raise_for_status()
                outputs.append(str(resp.json()["choices"][0]["text"]))
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as err:
                raise BenchmarkError(f"quality check: {url} failed ({type(err).__name__}: {err})") from None
    return outputs


def prefix_agreement(a: str, b: str) -> float:
    """Character-level common-prefix share of two answers: ``len(common prefix) / max(len)``.

    Prefix, not overlap: greedy decoding conditions every token on the ones before, so after the
    first difference the rest of the answer is a different continuation and any later match is
    coincidence. Characters, not tokens: the tokenizer lives in the engine, and a token-level
    comparison would need it. Two empty answers agree fully.
    """
    longest = max(len(a), len(b))
    if longest == 0:
        return 1.0
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same / longest


def agreement(a: list[str], b: list[str]) -> float:
    """Mean :func:`prefix_agreement` over paired answers (1.0 = identical, 0.0 = differ from the start).

    Raises:
        ValueError: The lists differ in length (answers to different prompt sets).
    """
    if len(a) != len(b):
        raise ValueError(f"cannot compare {len(a)} answers with {len(b)}: different prompt sets")
    if not a:
        return 1.0
    return sum(prefix_agreement(x, y) for x, y in zip(a, b, strict=True)) / len(a)


def save_outputs(path: Path, prompts: list[str] | tuple[str, ...], outputs: list[str]) -> None:
    """Write ``greedy.json``: the prompts with their answers, so a later trial can check it asked the same."""
    path.write_text(json.dumps({"prompts": list(prompts), "outputs": outputs}, indent=2) + "\n")


def load_outputs(path: Path, prompts: list[str] | tuple[str, ...]) -> list[str] | None:
    """The answers stored at ``path``, or None when missing, unreadable, or for other prompts."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("prompts") != list(prompts):
        return None
    outputs = data.get("outputs")
    return [str(o) for o in outputs] if isinstance(outputs, list) else None
