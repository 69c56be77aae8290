"""Modelled time against the wall clock, held for a closed-loop client and gated for a paced one.

``t = t0 + (wall − wall0) × speedup``: the simulator runs ``speedup`` times faster than the time
it models, and re-anchors the mapping when an engine falls behind it (``anchor``).

The client's own CPU time does not compress with the speed-up, so a request that leaves a few
wall milliseconds late would arrive twenty times as many modelled milliseconds late. Two
hand-offs keep the client's pace out of modelled time:

* **Hold** (closed loop): a request that promised a successor holds the clock when it ends: no
  engine steps and modelled time stands still until the next client request arrives, the client
  says none will come, or ``HOLD_LIMIT_S`` of wall time passes.
* **Gates** (paced): the client tells the simulator when, in modelled time, each request is due
  (an offset from the run's start) and when the next one is. Modelled time never passes a due
  arrival that has not come: the clock stops at the earliest open gate, an engine does not start
  a step past it, and a request that comes early waits for its time. Every paced arrival then
  lands on its modelled schedule however late the client sent it — within ``GATE_LIMIT_S`` of
  wall time, after which the gates are dropped (the client stopped or failed).
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable

__all__ = ["GATE_LIMIT_S", "HOLD_LIMIT_S", "ModelClock"]

HOLD_LIMIT_S = 0.5  # the longest the clock waits for a promised successor (wall seconds)
GATE_LIMIT_S = 2.0  # the longest it waits for a paced request past its due time (wall seconds)


class ModelClock:
    """The modelled clock of one simulator process (every engine core shares it)."""

    def __init__(self, speedup: float, clock: Callable[[], float]) -> None:
        self.speedup, self.wall = speedup, clock
        self.t0, self.wall0 = 0.0, clock()
        self.owed = 0  # successors promised and not yet arrived
        self._held_at = 0.0
        self.settled = asyncio.Event()
        self.settled.set()
        self.base = 0.0  # modelled start of the paced run whose arrivals are gated
        self._gates: list[float] = []  # due arrivals not yet come (a heap)
        self._came: list[float] = []  # arrivals that came before the one announcing them
        self._moved = asyncio.Event()

    def now(self) -> float:
        """The modelled time of this wall instant."""
        if self.owed:
            return self._held_at
        free = self.t0 + (self.wall() - self.wall0) * self.speedup
        return min(free, self._gates[0]) if self._gates else free

    # ------------------------------------------------------------------ closed loop: the hold
    def hold(self, t: float) -> None:
        """A request that promised a successor ended at modelled ``t``."""
        if not self.owed:
            self._held_at = t
            self.settled.clear()
        self.owed += 1

    def settle(self, all_owed: bool = False) -> None:
        """A successor arrived (or, ``all_owed``, the client will send none): resume from the held time."""
        if not self.owed:
            return
        self.owed = 0 if all_owed else self.owed - 1
        if not self.owed:
            self.anchor(self._held_at)
            self.settled.set()

    # ---------------------------------------------------------------------- paced: the gates
    def open_gates(self, first: float) -> float:
        """A paced run starts now, its first arrival due ``first`` modelled seconds later; returns
        the run's modelled start (the gates of an earlier run are dropped)."""
        self.drop_gates()
        self.base = self.now()
        self._gates = [self.base + first]
        return self.base

    def arrival_time(self, offset: float) -> float:
        """The modelled time of an arrival due ``offset`` seconds after the gated run's start."""
        return self.base + offset

    def gated(self, t: float) -> bool:
        """Whether an arrival due at or before modelled ``t`` has not come (no step may start at ``t``)."""
        return bool(self._gates) and self._gates[0] <= t

    async def until_due(self, at: float) -> bool:
        """Wait until modelled time reaches ``at`` (an arrival's due time); False when the wait
        ran ``GATE_LIMIT_S`` past it and the gates were dropped."""
        limit = self.wall() + max(0.0, at - self.now()) / self.speedup + GATE_LIMIT_S
        while self.now() < at:
            left = limit - self.wall()
            if left <= 0:
                self.drop_gates()
                return False
            wait = self.due(at) - self.wall()
            if wait > 0:  # running towards it
                await asyncio.sleep(min(wait, left))
            else:  # stopped at an earlier gate: an earlier arrival is late
                await self.gate_moved(left)
        return True

    def pass_gate(self, at: float, next_at: float | None) -> None:
        """The arrival due at ``at`` came (it announces the one due at ``next_at``)."""
        cur = self.now()
        if at in self._gates:
            self._gates.remove(at)
            heapq.heapify(self._gates)
        else:
            self._came.append(at)
        if next_at in self._came:
            self._came.remove(next_at)
        elif next_at is not None:
            heapq.heappush(self._gates, next_at)
        self._resume(cur)

    def drop_gates(self) -> None:
        """No more gated arrivals (a new run, or the client stopped sending)."""
        self._came.clear()
        if self._gates:
            cur = self.now()
            self._gates.clear()
            self._resume(cur)

    async def gate_moved(self, timeout: float) -> bool:
        """Wait until a gate opens or closes; False after ``timeout`` wall seconds."""
        try:
            async with asyncio.timeout(timeout):
                await self._moved.wait()
        except TimeoutError:
            return False
        return True

    def _resume(self, cur: float) -> None:
        """Go on from ``cur`` (the time the clock stood at), not from where the wall has got to."""
        if not self.owed:
            self.anchor(cur)
        self._moved.set()
        self._moved = asyncio.Event()

    # ------------------------------------------------------------------------- wall mapping
    def due(self, t: float) -> float:
        """The wall instant of modelled time ``t``."""
        return self.wall0 + (t - self.t0) / self.speedup

    def anchor(self, t: float) -> None:
        """Modelled time ``t`` is now: the time lost to a host that could not keep up is dropped."""
        self.t0, self.wall0 = t, self.wall()
