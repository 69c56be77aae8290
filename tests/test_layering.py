"""Imports flow cli → search → (engines, runtime, bench) → config; never back. The simulator
(``autotune_sim``) is a product of its own: the tuner reaches it only as a command and over
HTTP, and it imports nothing of the tuner."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "autotune"
SIM = ROOT / "autotune_sim"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("autotune")}  # autotune_sim included


def _modules(sub: str) -> list[Path]:
    return sorted((PKG / sub).rglob("*.py")) if (PKG / sub).is_dir() else [PKG / sub]


def test_config_imports_only_errors() -> None:
    assert _imports(PKG / "config.py") <= {"autotune.errors"}


def test_lower_layers_never_import_search_or_cli() -> None:
    for sub in ("engines", "runtime", "bench"):
        for path in _modules(sub):
            bad = {m for m in _imports(path) if m.startswith(("autotune.search", "autotune.cli", "autotune.report"))}
            assert not bad, f"{path.relative_to(PKG)} imports {bad}"


def test_nothing_imports_the_cli() -> None:
    for path in PKG.rglob("*.py"):
        if path.name != "cli.py":
            assert "autotune.cli" not in _imports(path), path


def test_sim_is_independent_of_the_tuner() -> None:
    # The simulator stands in for an engine: it must not lean on the tuner's internals.
    for path in sorted(SIM.rglob("*.py")):
        bad = {m for m in _imports(path) if m != "autotune_sim" and not m.startswith("autotune_sim.")}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_tuner_never_imports_the_simulator() -> None:
    # It starts `python -m autotune_sim` like any engine command, and talks to it over HTTP.
    for path in sorted(PKG.rglob("*.py")):
        bad = {m for m in _imports(path) if m.startswith("autotune_sim")}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_engine_knowledge_stays_behind_the_adapters() -> None:
    # Outside autotune/engines nothing branches on an engine's name: what differs is adapter data.
    names = {"vllm", "sglang"}
    for path in sorted(PKG.rglob("*.py")):
        if "engines" in path.relative_to(PKG).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            for side in [node.left, *node.comparators]:
                elements = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                named = {e.value for e in elements if isinstance(e, ast.Constant) and e.value in names}
                assert not named, f"{path.relative_to(ROOT)}:{node.lineno} compares with {named}"


def test_trial_and_study_attributes_are_read_only_through_the_record() -> None:
    # search/record.py types what Optuna stores; everything else reads TrialRecord / StageState.
    for path in sorted(PKG.rglob("*.py")):
        if path.relative_to(PKG).as_posix() == "search/record.py":
            continue
        assert "user_attrs" not in path.read_text(), f"{path.relative_to(ROOT)} reads Optuna's attributes directly"


def test_the_command_line_stays_thin() -> None:
    # Commands parse, build a job, call one library function and print; the work lives in the library.
    # Ten commands, most of the lines their options (400 held nine).
    assert len((PKG / "cli.py").read_text().splitlines()) < 430
