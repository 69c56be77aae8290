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
server's own CPU time between the two does not become a gap the speed-up multiplies.

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

__all__ = ["CLOCK_HEADER", "STAMP_PREFIX", "SUCCESSOR_HEADER", "SimClock", "parse_stamp", "probe_sim_clock"]

CLOCK_HEADER = "x-autotune-clock"
CLOCK_VALUE = "modelled"
NOW_HEADER = "x-autotune-modelled-now"
SPEEDUP_HEADER = "x-autotune-speedup"
STAMP_PREFIX = b": modelled "
SUCCESSOR_HEADER = "x-autotune-successor"


@dataclass(frozen=True)
class SimClock:
    """The simulator's clock as one probe saw it: modelled ``anchor_m`` at monotonic ``anchor_wall``;
    ``held``: the probe asked it to hold for a first wave of requests, so it stands at ``anchor_m``
    until they arrive."""

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


def parse_stamp(line: bytes) -> tuple[float, float]:
    """``(arrival, t)`` from a ``: modelled <arrival> <t>`` line.

    Raises:
        ValueError: The line does not hold two numbers.
    """
    arrival, t = line[len(STAMP_PREFIX) :].split()
    return float(arrival), float(t)


async def probe_sim_clock(
    client: httpx.AsyncClient, base: str, headers: dict[str, str], hold: int = 0
) -> SimClock | None:
    """Ask the server at ``base`` for its modelled clock; None for a real engine (or no answer).
    ``hold``: that many requests are sent at once next (a closed-loop run's first wave): the
    simulator holds its clock until they have all arrived."""
    sent = monotonic()
    ask = {**headers, CLOCK_HEADER: CLOCK_VALUE}
    if hold:
        ask[SUCCESSOR_HEADER] = str(hold)
    try:
        resp = await client.get(f"{base}/v1/models", headers=ask)
    except httpx.HTTPError:
        return None
    now, speedup = resp.headers.get(NOW_HEADER), resp.headers.get(SPEEDUP_HEADER)
    if resp.status_code != 200 or now is None or speedup is None:
        return None
    try:
        # The stamp was taken while the answer was on its way: mid-way is the best guess.
        return SimClock(float(speedup), float(now), (sent + monotonic()) / 2, held=hold > 0)
    except ValueError:
        return None
