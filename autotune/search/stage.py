"""The stages of a study, by name: what each trial was run for, as it is stored with the trial.

A member is its stored string (``Stage.MEMORY_EDGE == "memory_edge"``), so studies written
before the names were members read the same, and a name misspelt in code is an AttributeError
instead of a stage that silently matches nothing.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Stage"]


class Stage(StrEnum):
    BASELINE = "baseline"  # the engine's defaults: every gain is over it
    NOISE = "noise"  # the defaults again on a fresh engine: the study's run-to-run noise
    CONTEXT = "context"  # context length from the workload's longest request
    MEMORY_EDGE = "memory_edge"  # probes of the memory fraction under the workload's peak shape
    CUDA_GRAPH = "cuda_graph"  # the captured max batch, walked up
    SCENARIO = "scenario"  # the staged method's search over the remaining knobs
    SEARCH = "search"  # --method search: one plain search over the whole space
    VALIDATION = "validation"  # finalists and defaults re-run on fresh engines, round by round
