"""Studies found by name: the one a read-only command means (the only one in the results folder
when none is named), with the closest name when it does not exist."""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune.catalog import closest
from autotune.errors import AutotuneError, ConfigError
from autotune.search.storage import default_storage_url, load_study

__all__ = ["existing_study", "open_existing", "open_named", "studies_in", "study_folder", "study_name"]


def existing_study(name: str, url: str) -> optuna.Study | None:
    """The study when it already exists in its storage (a SQLite file is never created here)."""
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return None
    try:
        return load_study(name, url)
    except AutotuneError:
        return None


def studies_in(results: Path) -> list[str]:
    """Names of the studies in a results folder (folders holding a study.db)."""
    if not results.is_dir():
        return []
    return sorted(d.name for d in results.iterdir() if (d / "study.db").is_file())


def study_name(study: str | None, storage: str | None, results: Path) -> str:
    """The study a read-only command means: the one named, or the only one there is."""
    if study is not None:
        return study
    if storage is not None:
        try:
            names = sorted(optuna.get_all_study_names(storage))
        except Exception:  # SQLAlchemy raises many kinds; load_study words the problem
            names = []
        where = "that storage"
    else:
        names, where = studies_in(results), f"{results}/"
    if len(names) == 1:
        return names[0]
    if not names:
        raise ConfigError(f"no study in {where}; run `autotune tune --study NAME` first (or pass --results)")
    raise ConfigError(f"{where} holds several studies ({', '.join(names)}); name one, e.g. {names[0]}")


def open_existing(study: str, storage: str | None, results: Path) -> optuna.Study:
    url = storage or default_storage_url(results, study)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        names = studies_in(results)
        hint = closest(study, names)
        if hint:
            raise ConfigError(f"no study {study!r} under {results}/; did you mean {hint}?")
        there = f" (studies there: {', '.join(names)})" if names else ""
        raise ConfigError(f"no study {study!r} under {results}/{there}; run `autotune tune --study {study}` first")
    return load_study(study, url)


def open_named(study: str | None, storage: str | None, results: Path) -> optuna.Study:
    return open_existing(study_name(study, storage, results), storage, results)


def study_folder(name: str, storage: str | None, results: Path) -> Path:
    """Where a study's files go on this box: results/<study>/ (for a shared storage without one
    here, the current folder)."""
    folder = results / name
    return folder if folder.is_dir() or storage is None else Path(".")
