"""Why a trial's measurement or engine failed, in the words the trial records.

Where an engine failed (at start-up, on the first request, mid-benchmark), what was in flight
when it died (from the engine's dump and the client's records), and whether a run measured the
client rather than the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.engines.base import LogEvent
from autotune.engines.rootcause import in_flight

__all__ = ["FIRST_REQUEST", "MID_BENCHMARK", "STARTUP", "WHERE", "client_problem", "failed_at", "in_flight_story",
           "in_flight_text"]  # fmt: skip


def client_problem(run: Mapping[str, Any]) -> str:
    """Why a run measured the client rather than the engine ("" when it measured the engine)."""
    if run.get("client_limited"):
        return str(run.get("client_limited_reason") or "the client's self-check flagged the run")
    lost = int(run.get("failed_client") or 0)
    if lost:
        samples = ", ".join(list(run.get("client_error_samples") or run.get("error_samples") or {})[:2])
        return f"{lost} request(s) failed on the client's side ({samples})"
    return ""


# Where a trial failed: the same cause at the same point in two configurations says the failure
# does not depend on the flags (see StudyRun.stop_if_flag_independent).
STARTUP, FIRST_REQUEST, MID_BENCHMARK = "startup", "first_request", "mid_benchmark"
WHERE = {STARTUP: "at start-up", FIRST_REQUEST: "on the first request", MID_BENCHMARK: "mid-benchmark"}


def failed_at(ready: bool, runs: list[dict[str, Any]]) -> str:
    if not ready:
        return STARTUP
    served = sum(int(r.get("completed") or 0) for r in runs)
    return MID_BENCHMARK if served else FIRST_REQUEST


def in_flight_story(events: list[LogEvent], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What was being served when the engine died: the engine's own dump, and the client's
    count of completed and failed requests with the failed ones' prompt lengths."""
    out = in_flight(events)
    if runs:
        last = runs[-1]
        errors, lens = last.get("errors") or [], last.get("input_lens") or []
        failed = [n for n, err in zip(lens, errors, strict=False) if err]
        out.update(completed=int(last.get("completed") or 0), failed=len(failed))
        if failed:
            out["failed_prompt_lens"] = [min(failed), max(failed)]
    return out


def in_flight_text(facts: Mapping[str, Any]) -> str:
    parts = []
    if "running" in facts:
        parts.append(f"{facts['running']} running, {facts.get('waiting', 0)} waiting")
    if facts.get("new_prompt_lens"):
        parts.append(f"prefilling prompts of {sorted(set(facts['new_prompt_lens']))} tokens")
    if "completed" in facts:
        lens = facts.get("failed_prompt_lens")
        span = ""
        if lens:
            span = f" ({lens[0]}-token prompts)" if lens[0] == lens[1] else f" (prompts of {lens[0]}–{lens[1]} tokens)"
        parts.append(f"client: {facts['completed']} completed, {facts.get('failed', 0)} failed{span}")
    return "; ".join(parts)
