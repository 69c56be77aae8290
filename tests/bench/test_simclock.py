"""The client's side of modelled time: stamps, the clock mapping and the self-check of a simulated run."""

from __future__ import annotations

import pytest

from autotune.bench.selfcheck import SimTiming, assess_modelled_client
from autotune.bench.simclock import SimClock, parse_stamp


def test_a_stamp_gives_the_arrival_and_the_chunk_time() -> None:
    assert parse_stamp(b": modelled 12.500000 13.250000") == (12.5, 13.25)
    with pytest.raises(ValueError):
        parse_stamp(b": modelled 12.5")


def test_the_clock_maps_wall_seconds_to_modelled_ones_at_its_speedup() -> None:
    clock = SimClock(speedup=20.0, anchor_m=100.0, anchor_wall=5.0)
    assert clock.modelled(5.0) == 100.0
    assert clock.modelled(5.5) == pytest.approx(110.0)
    # Held for a closed-loop run's first wave: it stands still until that wave has arrived.
    assert SimClock(speedup=20.0, anchor_m=100.0, anchor_wall=5.0, held=True).modelled(5.5) == 100.0


def test_a_paced_run_whose_simulator_fell_behind_is_marked_but_a_held_one_is_not() -> None:
    behind = assess_modelled_client(0.1, [0.0], [0.001], True, 0.05, SimTiming(20.0, 12.0))
    assert behind.limited and behind.kind == "sim_behind" and "12.0x of the asked 20x" in behind.reason
    held = assess_modelled_client(0.1, [0.0], [0.001], True, 0.05, SimTiming(20.0, 12.0, held=True))
    assert not held.limited


def test_a_late_send_counts_times_the_speedup_and_a_late_wakeup_alone_does_not() -> None:
    # 4 ms late on the wall is 80 modelled ms at 20x: over a 50 ms tolerance.
    late = assess_modelled_client(0.1, [0.004] * 10, [0.0], True, 0.05, SimTiming(20.0, 20.0))
    assert late.limited and late.kind == "schedule_behind"
    # A closed-loop run's timestamps are the simulator's: a late loop moves none of them.
    woke_late = assess_modelled_client(0.1, [], [0.2] * 10, False, 0.05, SimTiming(20.0, 20.0, held=True))
    assert not woke_late.limited


def test_a_gated_run_is_judged_only_by_a_send_later_than_the_simulator_waits() -> None:
    # 40 ms late on the wall would be 800 modelled ms at 20x, but the gates admitted it on time.
    gated = SimTiming(20.0, 12.0, gated=True)
    on_time = assess_modelled_client(0.1, [0.04] * 10, [0.0], True, 0.05, gated)
    assert not on_time.limited and on_time.p99_schedule_lag_ms == pytest.approx(40.0)
    lost = assess_modelled_client(0.1, [0.04] * 9 + [2.5] * 2, [0.0], True, 0.05, gated)
    assert lost.limited and lost.kind == "schedule_behind" and "the simulator waits" in lost.reason
