"""Print the simulator's calibration table: each modelled number next to the published fact.

Run: ``python benchmarks/sim_calibration.py``. Exit code 1 when a check is outside its tolerance
(the same checks ``tests/sim/test_calibration.py`` runs). The numbers are the simulator's model,
not measurements.
"""

from __future__ import annotations

import sys

from autotune_sim.calibration import run_checks


def main() -> int:
    checks = run_checks()
    rows = [("#", "check", "source", "expected", "modelled", "ok")]
    rows += [
        (str(i), c.name, c.source, c.expected, c.modelled, "yes" if c.ok else "NO") for i, c in enumerate(checks, 1)
    ]
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
        if n == 0:
            print("-+-".join("-" * w for w in widths))
    print("\nAll numbers above are modelled by autotune's simulator, not measured on hardware.")
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
