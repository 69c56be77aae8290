"""Imports flow cli → search → (engines, runtime, bench) → config; never back."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "autotune"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("autotune")}


def _modules(sub: str) -> list[Path]:
    return sorted((PKG / sub).rglob("*.py")) if (PKG / sub).is_dir() else [PKG / sub]


def test_config_imports_only_errors() -> None:
    assert _imports(PKG / "config.py") <= {"autotune.errors"}


def test_lower_layers_never_import_search_or_cli() -> None:
    for sub in ("engines", "runtime", "bench", "sim"):
        for path in _modules(sub):
            bad = {m for m in _imports(path) if m.startswith(("autotune.search", "autotune.cli", "autotune.report"))}
            assert not bad, f"{path.relative_to(PKG)} imports {bad}"


def test_nothing_imports_the_cli() -> None:
    for path in PKG.rglob("*.py"):
        if path.name != "cli.py":
            assert "autotune.cli" not in _imports(path), path


def test_sim_is_independent_of_the_tuner() -> None:
    # The simulator stands in for an engine: it must not lean on the tuner's internals.
    for path in _modules("sim"):
        bad = {m for m in _imports(path) if not m.startswith("autotune.sim")}
        assert not bad, f"{path.relative_to(PKG)} imports {bad}"
