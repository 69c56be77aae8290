"""What ending a search that stopped paying costs and saves, on the search-efficiency cases.

Run: ``python benchmarks/stop_when_done.py [--seeds 10] [--budget 40] [--cases NAME ...]
[--methods staged tpe] [--noise 0.10]``.

Each seed of a method runs twice through the product's own study code on the in-process
simulator of ``benchmarks/search_efficiency.py`` (same cases, modelled costs and noise): once with
``stop_when_done`` (the default: ``autotune.search.stopping.stall_reason`` on the noise the study
measured) and once without. Both runs share the seed, so they make the same trials until the stop.
Printed per case and method:

* *stopped*: seeds whose search the rule ended before its budget (fewer runs than without it);
* *lost the target*: seeds that reached 97 % of the optimum without the rule but not with it
  (the rule's false stops);
* *engine-s saved*: the median share of the run's engine-seconds the stop saved;
* *pick kept*: the median of (the product's pick with the stop / its pick without), noise-free.

All numbers are modelled by autotune's simulator, not measured on hardware.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search_efficiency import CASES, NOISE_LEVELS, PRODUCT, TARGET, Ledger, SimObjective, exhaustive, run_ledger


@dataclass(frozen=True)
class Stop:
    """One seed's pair of runs: with the rule (``stopped``) against without it."""

    stopped: bool
    lost_target: bool
    saved_share: float
    pick_kept: float


def _reached(ledger: Ledger, optimum: float) -> bool:
    return any(t.result.truly_feasible and (t.result.true_value or 0.0) >= TARGET * optimum for t in ledger.trials)


def _picked(ledger: Ledger) -> float:
    chosen = ledger.pick
    return (chosen.result.true_value or 0.0) if chosen and chosen.result.truly_feasible else 0.0


def _cost(ledger: Ledger) -> float:
    return sum(t.result.cost_s for t in ledger.trials)


def compare(stopped: Ledger, full: Ledger, optimum: float) -> Stop:
    """What the rule changed in one seed's study."""
    full_pick = _picked(full)
    return Stop(
        len(stopped.trials) < len(full.trials),
        _reached(full, optimum) and not _reached(stopped, optimum),
        1.0 - _cost(stopped) / (_cost(full) or 1.0),
        _picked(stopped) / full_pick if full_pick else 1.0,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=40, help="search trials per study")
    ap.add_argument("--cases", nargs="*", default=[c.name for c in CASES], choices=[c.name for c in CASES])
    ap.add_argument("--methods", nargs="*", default=["staged", "tpe"], choices=list(PRODUCT))
    ap.add_argument("--noise", type=float, default=NOISE_LEVELS["cpu-class"], help="relative sd of a run's throughput")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print("| case | method | stopped | lost the target | engine-s saved (median) | pick kept (median) |")
    print("|---|---|---|---|---|---|")
    for case in (c for c in CASES if c.name in args.cases):
        obj = SimObjective(case, args.noise)
        optimum, _ = exhaustive(obj)
        for method in args.methods:
            stops = [
                compare(
                    run_ledger(obj, method, seed, args.budget),
                    run_ledger(obj, method, seed, args.budget, stop_when_done=False),
                    optimum,
                )
                for seed in range(args.seeds)
            ]
            stopped = sum(s.stopped for s in stops)
            lost = sum(s.lost_target for s in stops)
            saved = statistics.median(s.saved_share for s in stops)
            kept = statistics.median(s.pick_kept for s in stops)
            print(
                f"| {case.name} | {method} | {stopped}/{args.seeds} | {lost}/{args.seeds} | {saved:.0%} | {kept:.1%} |",
                flush=True,
            )
    print(f"\n{args.seeds} seeds, budget {args.budget}, noise {args.noise:g}. Modelled by the simulator, not measured.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
