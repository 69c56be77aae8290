"""The modelled clock's gates: a paced run's modelled time never passes a due request that has not come.

The wall clock is a number the test moves, so every instant is exact.
"""

from __future__ import annotations

import asyncio

import pytest

from autotune_sim.clock import GATE_LIMIT_S, ModelClock

SPEEDUP = 20.0


class Wall:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_clock_stops_at_a_due_arrival_until_it_comes_and_goes_on_from_there() -> None:
    async def main() -> None:
        wall = Wall()
        clock = ModelClock(SPEEDUP, wall)
        base = clock.open_gates(first=1.0)
        wall.t += 2.0  # 40 modelled seconds of wall time: the client's first send is very late
        assert clock.now() == pytest.approx(base + 1.0)
        assert clock.gated(base + 1.0) and not clock.gated(base + 0.9)
        clock.pass_gate(base + 1.0, base + 1.5)
        assert clock.now() == pytest.approx(base + 1.0)  # no jump over the time the client lost
        wall.t += 0.25 / SPEEDUP
        assert clock.now() == pytest.approx(base + 1.25)
        wall.t += 1.0 / SPEEDUP
        assert clock.now() == pytest.approx(base + 1.5)  # stopped at the next due arrival
        clock.pass_gate(base + 1.5, None)
        wall.t += 1.0 / SPEEDUP
        assert clock.now() == pytest.approx(base + 2.5)  # the last one came: free again
        assert not clock.gated(1e9)

    asyncio.run(main())


def test_out_of_order_arrivals_keep_the_earliest_gate() -> None:
    async def main() -> None:
        wall = Wall()
        clock = ModelClock(SPEEDUP, wall)
        base = clock.open_gates(first=0.5)
        clock.pass_gate(base + 0.5, base + 0.6)
        clock.pass_gate(base + 0.7, base + 0.8)  # request 2 came before request 1 (due at 0.6)
        wall.t += 10.0
        assert clock.now() == pytest.approx(base + 0.6)
        clock.pass_gate(base + 0.6, base + 0.7)  # request 1 announces the one that already came
        assert clock.now() == pytest.approx(base + 0.6)
        wall.t += 10.0
        assert clock.now() == pytest.approx(base + 0.8)  # 0.7 is not waited for twice

    asyncio.run(main())


def test_an_early_request_waits_for_its_modelled_time_and_a_lost_one_is_given_up() -> None:
    async def main() -> None:
        clock = ModelClock(SPEEDUP, asyncio.get_running_loop().time)
        base = clock.open_gates(first=0.2)
        assert await clock.until_due(clock.arrival_time(0.2))
        assert clock.now() == pytest.approx(base + 0.2)  # held there: nothing passed the gate yet
        clock.pass_gate(base + 0.2, base + 0.3)
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert not await clock.until_due(base + 0.4)  # 0.3 never comes: the wait gives up
        assert loop.time() - start >= GATE_LIMIT_S
        assert not clock.gated(1e9)

    asyncio.run(main())
