"""Runs against the simulator measured in modelled time, from the simulator's own stamps.

The simulator compresses time by its speed-up (``AUTOTUNE_SIM_SPEEDUP``) and the host's CPU time
does not compress with it, so a simulated server measured with the wall clock is neither the
modelled server nor a constant multiple of it. When asked (the request header ``x-autotune-clock:
modelled``, which no real engine reads or answers), the simulator says so and sends its clock:

* ``GET /v1/models`` answers with ``x-autotune-modelled-now`` (modelled seconds) and
  ``x-autotune-speedup``; a server that does not is a real engine, measured with the wall clock;
* each streamed chunk is preceded by the SSE comment ``: modelled <arrival> <t>``: the request's
  modelled arrival and the modelled time of the chunk's last token.

A request also says whether another one will take its place the moment it ends
(``x-autotune-successor: 1``: a full slot's worth of requests waits for the concurrency cap);
the simulator then holds its modelled clock until that request arrives, so the client's and the
server's own CPU time between the two does not become a gap the speed-up multiplies. A paced
run (a request rate, no concurrency cap) says when each of its requests is due instead: the probe
that starts it carries the first due time (``x-autotune-next-arrival``, modelled seconds after
the run's start), each request its own (``x-autotune-arrival``) and the next one's. The
simulator's clock does not pass a due request that has not come, so a send the host delayed
still arrives on its modelled schedule (up to ``GATE_LIMIT_S`` of wall time late).

Every metric of a simulated run is then computed from those stamps (:mod:`autotune.bench.stream`):
TTFT from the arrival to the first chunk, ITL between chunks, the run's duration from its
modelled start to its last token. The client still paces its sends on the wall clock, with the
schedule and think times compressed by the speed-up, and keeps the wall-clock duration beside the
modelled one: their ratio is the speed-up the simulator achieved (it falls behind its clock on
a host that cannot run it at the asked speed).
"""

from __future__ import annotations

from dataclasses import dataclass
from time import monotonic

import httpx

__all__ = [
    "CLOCK_HEADER",
    "GATE_LIMIT_S",
    "STAMP_PREFIX",
    "SUCCESSOR_HEADER",
    "SimClock",
    "arrival_headers",
    "due_times",
    "parse_stamp",
    "probe_sim_clock",
]

CLOCK_HEADER = "x-autotune-clock"
CLOCK_VALUE = "modelled"
NOW_HEADER = "x-autotune-modelled-now"
SPEEDUP_HEADER = "x-autotune-speedup"
STAMP_PREFIX = b": modelled "
SUCCESSOR_HEADER = "x-autotune-successor"
ARRIVAL_HEADER = "x-autotune-arrival"
NEXT_ARRIVAL_HEADER = "x-autotune-next-arrival"
# How long (wall seconds) the simulator waits for a paced request past its due time before it
# stops gating (autotune_sim.clock.GATE_LIMIT_S): a send later than that does move the arrival.
GATE_LIMIT_S = 2.0


@dataclass(frozen=True)
class SimClock:
    """The simulator's clock as one probe saw it: modelled ``anchor_m`` at monotonic ``anchor_wall``;
    ``held``: the probe asked it to hold for a first wave of requests, or to gate a paced run's
    arrivals, so the run starts at ``anchor_m`` whenever its first request leaves."""

    speedup: float
    anchor_m: float
    anchor_wall: float
    held: bool = False

    def modelled(self, wall: float) -> float:
        """The modelled time of monotonic instant ``wall`` (exact while the simulator keeps its clock;
        a held clock stands still until the run's first requests have arrived)."""
        if self.held:
            return self.anchor_m
        return self.anchor_m + (wall - self.anchor_wall) * self.speedup


def due_times(offsets: list[float]) -> list[tuple[float, float | None]]:
    """Each paced arrival's modelled due time and the next one's (None after the last)."""
    return [(t, offsets[i + 1] if i + 1 < len(offsets) else None) for i, t in enumerate(offsets)]


def arrival_headers(due: float, next_due: float | None) -> dict[str, str]:
    """The headers that tell the simulator when a paced request is due, and when the next one is."""
    headers = {ARRIVAL_HEADER: f"{due:.6f}"}
    if next_due is not None:
        headers[NEXT_ARRIVAL_HEADER] = f"{next_due:.6f}"
    return headers


def parse_stamp(line: bytes) -> tuple[float, float]:
    """``(arrival, t)`` from a ``: modelled <arrival> <t>`` line.

    Raises:
        ValueError: The line does not hold two numbers.
    """
    arrival, t = line[len(STAMP_PREFIX) :].split()
    return float(arrival), float(t)


async def probe_sim_clock(
    client: httpx.AsyncClient, base: str, headers: dict[str, str], hold: int = 0, first_due: float | None = None
) -> SimClock | None:
    """Ask the server at ``base`` for its modelled clock; None for a real engine (or no answer).
    ``hold``: that many requests are sent at once next (a closed-loop run's first wave): the
    simulator holds its clock until they have all arrived. ``first_due``: a paced run starts,
    its first request due that many modelled seconds later: the simulator gates its arrivals."""
    sent = monotonic()
    ask = {**headers, CLOCK_HEADER: CLOCK_VALUE}
    if hold:
        ask[SUCCESSOR_HEADER] = str(hold)
    elif first_due is not None:
        ask[NEXT_ARRIVAL_HEADER] = f"{first_due:.6f}"
    try:
        resp = await client.get(f"{base}/v1/models", headers=ask)
    except httpx.HTTPError:
        return None
    now, speedup = resp.headers.get(NOW_HEADER), resp.headers.get(SPEEDUP_HEADER)
    if resp.status_code != 200 or now is None or speedup is None:
        return None
    try:
        # The stamp was taken while the answer was on its way: mid-way is the best guess.
        held = hold > 0 or first_due is not None
        return SimClock(float(speedup), float(now), (sent + monotonic()) / 2, held=held)
    except ValueError:
        return None
