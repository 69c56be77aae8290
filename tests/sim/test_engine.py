"""The engine core in modelled time: determinism for a seed, OOM under load, injected faults.

The wall clock is frozen and the speed-up huge, so steps run back to back and every number
depends only on the model, the requests and the seed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from autotune_sim.clock import ModelClock
from autotune_sim.engine import Engine, Fatal
from autotune_sim.kvcache import BlockPool
from autotune_sim.memory import GIB, footprint
from autotune_sim.perf import PerfModel
from autotune_sim.presets import GPUS, find_model
from autotune_sim.scheduler import Batch, SimRequest, VllmScheduler
from autotune_sim.settings import FaultPlan
from autotune_sim.stats import EngineStats

LLAMA = find_model("llama-3.1-8b")
assert LLAMA is not None
FP = footprint(LLAMA)


@dataclass
class Recorder:
    """Observer and sink at once: what the engine reported."""

    tokens: int = 0
    finished: int = 0
    failed: list[str] = field(default_factory=list)
    fatal: list[Fatal] = field(default_factory=list)
    steps: int = 0

    def on_step(self, batch: Batch, now: float) -> None:
        self.steps += 1

    def on_fatal(self, fatal: Fatal) -> None:
        self.fatal.append(fatal)

    def on_lag(self, lag_s: float) -> None:
        return None

    def emit(self, req: SimRequest, finished: bool) -> None:
        self.tokens += 1
        self.finished += finished

    def fail(self, req: SimRequest, message: str) -> None:
        self.failed.append(message)


def run(
    n: int,
    *,
    seed: int = 0,
    noise: float = 0.0,
    launch_factor: float = 1.0,
    headroom: float = 100 * GIB,
    faults: FaultPlan | None = None,
    prompt_len: int = 512,
    out: int = 32,
) -> tuple[Recorder, EngineStats, Engine]:
    async def main() -> tuple[Recorder, EngineStats, Engine]:
        rec = Recorder()
        stats = EngineStats(max_model_len=8192)
        sched = VllmScheduler(
            BlockPool(20_000, 16, True),
            stats,
            lambda s, i: 1000 + i % 9,
            max_num_seqs=256,
            max_batched_tokens=8192,
            chunked_prefill=True,
            long_prefill_threshold=0,
            priority_policy=False,
            reserve_full_isl=True,
            graph_mode="FULL_AND_PIECEWISE",
            max_capture=512,
        )
        engine = Engine(
            sched,
            PerfModel(LLAMA, GPUS["H100-80GB"], FP),
            stats,
            fp=FP,
            headroom=headroom,
            noise=noise,
            seed=seed,
            faults=faults or FaultPlan(),
            observer=rec,
            clock=ModelClock(1e9, lambda: 0.0),
            launch_factor=launch_factor,
        )
        task = asyncio.create_task(engine.run())
        for i in range(n):
            ids = [(i * 131 + j) % 20_000 + 300 for j in range(prompt_len)]
            try:
                engine.submit(SimRequest(i, ids, out, "length", out, i, sink=rec))
            except Fatal:
                break
        for _ in range(200):
            await asyncio.sleep(0)
            if rec.finished == n or engine.dead or engine.hung:
                break
        task.cancel()
        return rec, stats, engine

    return asyncio.run(main())


def test_same_seed_same_numbers_other_seed_other_noise() -> None:
    a, sa, _ = run(32, seed=1, noise=0.1)
    b, sb, _ = run(32, seed=1, noise=0.1)
    c, sc, _ = run(32, seed=2, noise=0.1)
    assert a.tokens == b.tokens == c.tokens == 32 * 32
    assert (sa.ttft.sum, sa.itl.sum, sa.e2e.sum) == (sb.ttft.sum, sb.itl.sum, sb.e2e.sum)
    assert sa.itl.sum != sc.itl.sum


def test_a_slower_launch_takes_longer_at_every_step() -> None:
    # Two launches of one configuration on a real box: the slower one is slower throughout.
    _, usual, _ = run(16)
    _, slow, _ = run(16, launch_factor=1.25)
    assert slow.itl.sum == pytest.approx(1.25 * usual.itl.sum, rel=1e-9)
    assert slow.e2e.sum == pytest.approx(1.25 * usual.e2e.sum, rel=1e-9)


def test_without_noise_the_seed_does_not_matter() -> None:
    _, s1, _ = run(16, seed=1)
    _, s2, _ = run(16, seed=2)
    assert s1.e2e.sum == s2.e2e.sum


def test_every_request_gets_exactly_its_tokens_and_counters_agree() -> None:
    rec, stats, _ = run(20, out=17)
    assert rec.tokens == stats.generation_tokens == 20 * 17
    assert stats.finished["length"] == 20 and stats.prompt_tokens == 20 * 512
    assert stats.ttft.count == 20 and stats.itl.count == 20 * 16


def test_a_large_prefill_batch_oom_kills_the_engine_under_load() -> None:
    # Room for a small step but not for an 8192-token prefill batch.
    rec, _, engine = run(32, headroom=0.5 * GIB)
    assert engine.dead and rec.fatal and rec.fatal[0].kind == "oom"
    assert rec.fatal[0].need > rec.fatal[0].free


def test_the_same_room_serves_a_light_load() -> None:
    rec, _, engine = run(1, headroom=0.5 * GIB, prompt_len=64)
    assert not engine.dead and rec.finished == 1


def test_crash_after_requests() -> None:
    rec, _, engine = run(10, faults=FaultPlan(crash_after_requests=3))
    assert engine.dead and rec.fatal[0].kind == "crash"


def test_oom_after_requests() -> None:
    rec, _, engine = run(5, faults=FaultPlan(oom_after_requests=2), prompt_len=16)
    assert engine.dead and rec.fatal[0].kind == "oom"


def test_hang_after_requests_stops_generating() -> None:
    rec, _, engine = run(4, faults=FaultPlan(hang_after_requests=2))
    assert engine.hung and not engine.dead and rec.tokens == 0
