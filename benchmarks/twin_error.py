"""How far the twin's predictions are from what the trials measured, on stored studies.

For each trial of a study that the twin predicts (the search and scenario trials, the CUDA-graph
sizes), the product's own twin (``autotune.search.twin.Twin``, which runs ``python -m
autotune_sim twin``) is asked again, twice, from what was recorded before that trial:

* **baseline only**: fitted on the baseline (and noise) runs of the engine's defaults alone;
* **every run before it**: what the live study asked (the record's own prediction).

A run that early stop cut is compared with the same fit's prediction for the requests it served
before the cut, as the study does. Reported per study and over all: the median |error| of output
throughput, mean TTFT and mean TPOT, and the trial the twin was furthest off on.

Usage::

    python benchmarks/twin_error.py results/demo-vllm-cpu [results/other-study ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from autotune.config import EngineSettings, SearchSpace, Workload, as_given
from autotune.search.record import TrialRecord, study_config, trial_records
from autotune.search.stage import Stage
from autotune.search.storage import load_study
from autotune.search.twin import PREDICTED, TWIN_METRICS, Pending, Twin

CALIBRATIONS = ("baseline only", "every run before it")


def _twin(study: Any) -> Twin:
    config = study_config(study)
    engine, space = as_given(EngineSettings, config["engine"]), as_given(SearchSpace, config["space"])
    fixed = {**engine.get("fixed_flags", {}), **space.get("fixed", {})}
    return Twin(Workload.model_validate(as_given(Workload, config["workload"])), fixed)


def _checked(twin: Twin, record: TrialRecord, before: list[TrialRecord]) -> dict[str, Any] | None:
    """The twin's error on ``record`` when fitted on ``before``, checked as the study checks it
    (``Twin.check``: a cut run against the requests it served); None when it cannot say."""
    params = record.params or {}
    answer = twin.predict(params, before)
    if "predicted" not in answer:
        return None
    checked = twin.check(Pending.ready(answer, params, before), record.metrics, True, bool(record.early_stop))
    return checked if "error" in checked else None


def replay(path: Path) -> dict[str, Any]:
    """Every predicted trial of the study in ``path`` (``results/<study>``), fitted both ways."""
    study = load_study(path.name, f"sqlite:///{path / 'study.db'}")
    twin = _twin(study)
    records = sorted(trial_records(study.get_trials(deepcopy=False)), key=lambda r: r.number)
    defaults = [r for r in records if r.stage in (Stage.BASELINE, Stage.NOISE)]
    rows = []
    for i, r in enumerate(records):
        if r.stage not in PREDICTED or not r.served_its_workload:
            continue
        fits = {CALIBRATIONS[0]: defaults, CALIBRATIONS[1]: [b for b in records[:i] if b.outcome]}
        checked = {name: _checked(twin, r, before) for name, before in fits.items()}
        rows.append({"trial": r.number, "params": r.params, "cut": bool(r.early_stop), "checked": checked})
    return {"study": path.name, "rows": rows}


def _median(rows: list[dict[str, Any]], calibration: str, metric: str) -> tuple[float, int] | None:
    errors = [abs(c["error"][metric]) for row in rows if (c := row["checked"][calibration]) and metric in c["error"]]
    return (statistics.median(errors), len(errors)) if errors else None


def print_report(results: list[dict[str, Any]]) -> None:
    for result in results:
        print(f"\n{result['study']}")
        print(f"{'trial':>5}  {'params':<44}  {'measured':>9}  " + "  ".join(f"{c:>21}" for c in CALIBRATIONS))
        for row in result["rows"]:
            cells = []
            measured = None
            for name in CALIBRATIONS:
                c = row["checked"][name]
                if c is None or "output_throughput" not in c["error"]:
                    cells.append(f"{'—':>21}")
                    continue
                measured = c["measured"]["output_throughput"]
                predicted = (c.get("predicted_cut") or c["predicted"])["output_throughput"]
                cells.append(f"{predicted:>11,.1f} ({100 * c['error']['output_throughput']:+6.1f} %)")
            params = " ".join(f"{k}={v}" for k, v in (row["params"] or {}).items()) + (" (cut)" if row["cut"] else "")
            print(f"{row['trial']:>5}  {params:<44}  {measured or 0:>9,.1f}  " + "  ".join(cells))
        _print_medians(result["rows"], f"median |error| over {result['study']}'s predicted trials")
    if len(results) > 1:
        _print_medians([row for result in results for row in result["rows"]], "\nmedian |error| over all of them")


def _print_medians(rows: list[dict[str, Any]], title: str) -> None:
    print(f"{title}:")
    for name in CALIBRATIONS:
        parts = []
        for metric in TWIN_METRICS:
            if (m := _median(rows, name, metric)) is not None:
                parts.append(f"{metric} {100 * m[0]:.1f} % ({m[1]})")
        print(f"  {name}: " + ", ".join(parts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="+", type=Path, help="results/<study> folders")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    for path in args.studies:
        if not (path / "study.db").is_file():
            print(f"twin_error: {path}: no study.db here; give a results/<study> folder", file=sys.stderr)
            return 2
    results = [replay(path) for path in args.studies]
    print_report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
