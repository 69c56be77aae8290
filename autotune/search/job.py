"""What a study runs: the engine, the search space, the workload and the study's settings."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.config import EngineSettings, SearchSpace, StudySettings, Workload
from autotune.search.storage import default_storage_url, study_dir

__all__ = ["TuneJob"]


@dataclass(frozen=True)
class TuneJob:
    engine: EngineSettings
    space: SearchSpace
    workload: Workload
    study: StudySettings

    @property
    def storage_url(self) -> str:
        return self.study.storage or default_storage_url(self.study.results_dir, self.study.name)

    @property
    def dir(self) -> Path:
        return study_dir(self.study.results_dir, self.study.name)

    def fingerprint(self) -> str:
        """What must not change between a study's runs (engine kind/model, space, workload)."""
        blob = json.dumps(
            {
                "engine": [self.engine.kind, self.engine.model],
                "space": self.space.model_dump(mode="json"),
                "workload": self.workload.model_dump(mode="json"),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def config(self) -> dict[str, Any]:
        """The job as stored with its study: everything but the engine's environment (secrets)."""
        return {
            "engine": self.engine.model_dump(mode="json", exclude={"env"}),
            "space": self.space.model_dump(mode="json"),
            "workload": self.workload.model_dump(mode="json"),
            "study": self.study.model_dump(mode="json"),
        }
