"""``manifest.json``: what a study is, in one file beside its storage.

Written when a run of the study starts and again when it ends (the engine's version is known
only once an engine has run): the job (engine without its environment, space, workload, study
settings), the engine's name, version and compile cache, the host (CPU and its instruction sets,
memory, GPUs, Python, platform) and the autotune version. Someone holding only the results folder can tell
what was tuned, where and with what.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import optuna

from autotune import __version__
from autotune.runtime.hostinfo import host_facts
from autotune.search.record import RECORD_VERSION, trial_records

__all__ = ["MANIFEST_FILE", "MANIFEST_VERSION", "write_manifest"]

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1


def write_manifest(folder: Path, study: optuna.Study, engine: dict[str, Any], config: dict[str, Any]) -> Path:
    """Write (or rewrite) the study's manifest in ``folder``; returns its path.

    ``engine``: the adapter's name and whether it is simulated; the version comes from the
    trials that ran (the engine's own log or server)."""
    records = trial_records(study.get_trials(deepcopy=False))
    versions = sorted({str(v) for r in records if (v := r.facts.get("engine_version"))})
    # Where the engine kept its compiled graphs: kept across trials (and studies), so a trial
    # whose compile key an earlier one compiled starts warm. Read from the engine's own log.
    compile_caches = sorted({str(c) for r in records if (c := (r.facts.get("startup") or {}).get("compile_cache"))})
    manifest = {
        "schema_version": MANIFEST_VERSION,
        "record_version": RECORD_VERSION,
        "autotune_version": __version__,
        "written_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "study": study.study_name,
        "engine": {**engine, "versions": versions, "compile_caches": compile_caches},
        "host": host_facts(),
        "config": config,
    }
    path = folder / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    return path
