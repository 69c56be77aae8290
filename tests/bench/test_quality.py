"""The quality guard's comparison: greedy answers agree by their common prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.bench.quality import QUALITY_PROMPTS, agreement, load_outputs, prefix_agreement, save_outputs


def test_identical_answers_agree_fully() -> None:
    assert agreement(["Paris is", "42"], ["Paris is", "42"]) == 1.0


def test_agreement_is_the_common_prefix_share_of_the_longer_answer() -> None:
    assert prefix_agreement("abcdef", "abcxyz") == pytest.approx(0.5)
    assert prefix_agreement("abc", "abcdef") == pytest.approx(0.5)  # a shorter answer is a difference too
    assert prefix_agreement("xbc", "abc") == 0.0  # a later match after a divergence does not count
    assert prefix_agreement("", "") == 1.0


def test_agreement_averages_over_prompts() -> None:
    assert agreement(["aaaa", "bbbb"], ["aaaa", "bbzz"]) == pytest.approx(0.75)


def test_different_prompt_sets_cannot_be_compared() -> None:
    with pytest.raises(ValueError, match="different prompt sets"):
        agreement(["a"], ["a", "b"])


def test_stored_answers_are_read_back_only_for_the_same_prompts(tmp_path: Path) -> None:
    path = tmp_path / "greedy.json"
    outputs = [f"answer {i}" for i in range(len(QUALITY_PROMPTS))]
    save_outputs(path, QUALITY_PROMPTS, outputs)
    assert load_outputs(path, QUALITY_PROMPTS) == outputs
    assert load_outputs(path, ["another prompt"]) is None
    assert load_outputs(tmp_path / "missing.json", QUALITY_PROMPTS) is None
