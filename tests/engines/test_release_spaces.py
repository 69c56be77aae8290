"""The shipped search spaces as each release can run them: rendered against the saved help texts
of five vLLM and nine SGLang releases, a space offers exactly the knobs the release has — a knob
newer than the release is left out with a line saying so, never sent to an engine that refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from releases import SGLANG, VLLM, release

from autotune.config import EngineSettings, SearchSpace
from autotune.engines.base import EngineAdapter, FlagSet
from autotune.engines.sglang import SglangAdapter
from autotune.engines.vllm import VllmAdapter
from autotune.errors import InvalidFlags
from autotune.search.space import for_release

ROOT = Path(__file__).parents[2]


def _adapter(engine: str, known: FlagSet | None = None) -> EngineAdapter:
    """An adapter whose installed help is ``known`` (a saved release's)."""
    cls = VllmAdapter if engine == "vllm" else SglangAdapter
    adapter = cls(EngineSettings(kind=engine, model="m", command=["true"]))  # type: ignore[arg-type]
    adapter._flagset = known  # what discover_flags would read from that release's --help
    return adapter


def _has(adapter: EngineAdapter, name: str, known: FlagSet) -> bool:
    """Whether the release can be given the parameter: the flags ``to_flags`` renders for it (its
    spelling on that release) are all in the help — an error rendering it means it has none."""
    value = 1
    try:
        flags = adapter.to_flags({name: value})
    except InvalidFlags:
        return False
    return all(flag in known for flag in flags)


def _shipped(engine: str) -> list[SearchSpace]:
    spaces = [
        SearchSpace.model_validate(yaml.safe_load(p.read_text())) for p in sorted(ROOT.glob("search_spaces/*.yaml"))
    ]
    return [s for s in spaces if s.engine in (engine, "any")]


CASES = [("vllm", v) for v in VLLM] + [("sglang", v) for v in SGLANG]


def test_the_saved_releases_are_three_of_vllm_and_three_or_more_of_sglang() -> None:
    assert len(VLLM) >= 3 and len(SGLANG) >= 3, (VLLM, SGLANG)


@pytest.mark.parametrize(("engine", "version"), CASES, ids=[f"{e}-{v}" for e, v in CASES])
def test_each_shipped_space_offers_exactly_the_knobs_the_release_has(engine: str, version: str) -> None:
    known = release(engine, version)
    adapter = _adapter(engine, known)
    for space in _shipped(engine):
        offered, notes = for_release(space, adapter, known)
        has = {name for name in space.params if _has(adapter, name, known)}
        assert set(offered.params) == has, (space.name, version, sorted(set(space.params) - has))
        assert len(notes) == len(space.params) - len(has)
        for note in notes:
            assert note.startswith(f"space {space.name}: ") and f"{adapter.title} {version} has no --" in note


def test_a_knob_newer_than_the_release_is_left_out_with_what_depends_on_it() -> None:
    space = SearchSpace.model_validate(
        {
            "name": "graphs",
            "params": {
                "memory_fraction": {"type": "float", "low": 0.8, "high": 0.9, "step": 0.02},
                "cuda_graph_backend_prefill": {"type": "categorical", "choices": ["full", "disabled"]},
                "cuda_graph_max_bs_prefill": {
                    "type": "categorical",
                    "choices": [8, 16],
                    "condition": {"cuda_graph_backend_prefill": "full"},
                },
            },
        }
    )
    adapter = _adapter("sglang")
    old, notes = for_release(space, adapter, release("sglang", "0.5.12"))
    assert list(old.params) == ["memory_fraction"]
    assert notes == [
        "space graphs: cuda_graph_backend_prefill left out: SGLang 0.5.12 has no --cuda-graph-backend-prefill "
        "(it arrived in 0.5.15)",
        "space graphs: cuda_graph_max_bs_prefill left out: its condition names cuda_graph_backend_prefill, "
        "which is left out",
    ]
    new, none = for_release(space, adapter, release("sglang", "0.5.23"))
    assert new == space and none == []


def test_an_undated_flag_the_release_lacks_stays_for_the_flag_check_to_refuse() -> None:
    space = SearchSpace.model_validate({"params": {"max_num_seqz": {"type": "categorical", "choices": [8]}}})
    adapter = _adapter("vllm")
    kept, notes = for_release(space, adapter, release("vllm", "0.32.0"))
    assert kept == space and notes == []  # a typo is not a release: validate_flags names the closest flag
