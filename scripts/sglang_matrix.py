"""Read SGLang releases' own files into test fixtures: flags, HTTP routes, log formats, metrics.

Usage (``scripts/sglang-matrix.sh`` sets up the interpreter and calls this)::

    python scripts/sglang_matrix.py --python PY --out tests/engines/data/sglang-releases 0.5.9 0.5.23 ...
    python scripts/sglang_matrix.py --table tests/engines/data/sglang-releases   # docs/sglang.md table

Per release the wheel is downloaded with ``pip download --no-deps`` (nothing is installed, no CUDA
is needed) and unpacked. Its ``--help`` comes from its own argparse parser where ``PY`` can build
it (``ServerArgs.add_cli_args`` with the release on ``PYTHONPATH``; ``torchvision`` stubbed, as
only the import chain needs it); otherwise from a static read of the ``add_argument`` calls in
``sglang/srt/server_args.py``. Each fixture says which way it was made. Routes, log format
strings and ``sglang:`` metric names are always read statically from the release's source.

Standard library only: it runs before the project is installed.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SCHEMA_VERSION = 1

# Log lines the adapter reads: fixture key → a phrase every release's format string contains.
LOG_PHRASES = {
    "capture_begin": ("Capture ", " begin."),
    "capture_end": ("Capture ", " end."),
    "capture_bs": ("Capture cuda graph bs",),
    "kv_allocated": ("#tokens: ", " size: "),
    "kv_summary": ("max_total_num_tokens=", "max_running_requests="),
    "max_running_reduced": ("max_running_requests was reduced",),
    "decode_batch": ("Decode batch",),
    "retract": ("KV cache pool is full. Retract",),
    "ready": ("The server is fired up",),
}
# Files that print them (others mention the phrases in comments, docs or parsers of their own).
LOG_DIRS = (
    "srt/model_executor",
    "srt/managers",
    "srt/entrypoints",
    "srt/mem_cache",
    "srt/observability",
    "srt/utils",
)

HELP_BUILDER = r'''
import argparse, importlib.abc, importlib.machinery, importlib.metadata, sys
from unittest import mock

class Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """torchvision is only on the import chain; the parser never uses it."""
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if top == "torchvision" else None
    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__name__ = [], spec, spec.name
        return module
    def exec_module(self, module):
        pass

sys.meta_path.insert(0, Stub())
version = importlib.metadata.version
importlib.metadata.version = lambda name: "0.0.0" if name == "torchvision" else version(name)
import transformers
for auto in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoProcessor):
    register = auto.register  # releases older than the venv's transformers register names it has
    auto.register = staticmethod(lambda *a, _r=register, **k: _r(*a, **{**k, "exist_ok": True}))
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="launch_server")
ServerArgs.add_cli_args(parser)
sys.stdout.write(parser.format_help())
'''


def download(version: str, cache: Path) -> Path:
    """The release's wheel, downloaded once into ``cache``."""
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={version}", "-d", str(cache)]
        subprocess.run(cmd, check=True)
        found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if not found:
        raise SystemExit(f"sglang_matrix: pip downloaded no wheel for sglang=={version}")
    return found[0]


def unpack(wheel: Path, into: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(into, [n for n in zf.namelist() if n.startswith("sglang/")])
    return into


def built_help(python: str | None, root: Path) -> tuple[str | None, str]:
    """The release's real --help from its own parser, or (None, why it could not be built)."""
    if not python:
        return None, "no interpreter given"
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "100"}
    proc = subprocess.run([python, "-c", HELP_BUILDER], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode == 0 and proc.stdout:
        return proc.stdout, ""
    return None, (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]


def static_flags(server_args: Path) -> list[str]:
    """Long options of every ``add_argument`` call with literal names (``--x`` and ``--no-x``)."""
    flags: set[str] = set()
    for node in ast.walk(ast.parse(server_args.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "add_argument":
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        longs = [n for n in names if n.startswith("--")]
        flags.update(longs)
        action = next((ast.unparse(k.value) for k in node.keywords if k.arg == "action"), "")
        if "BooleanOptionalAction" in action:
            flags.update("--no-" + n[2:] for n in longs)
    return sorted(flags)


def routes(http_server: Path) -> list[str]:
    """``METHOD /path`` of every FastAPI route the server declares."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(http_server.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method = node.func.attr
        if method not in ("get", "post", "put", "delete", "api_route", "add_api_route") or not node.args:
            continue
        path = node.args[0]
        if not (isinstance(path, ast.Constant) and isinstance(path.value, str) and path.value.startswith("/")):
            continue
        if method in ("api_route", "add_api_route"):
            methods = next((k.value for k in node.keywords if k.arg == "methods"), None)
            names = [e.value for e in getattr(methods, "elts", []) if isinstance(e, ast.Constant)] or ["GET"]
            out.update(f"{m.upper()} {path.value}" for m in names)
        else:
            out.add(f"{method.upper()} {path.value}")
    return sorted(out)


def _string_source(node: ast.AST) -> str | None:
    """An f-string's or a plain string's source; None for anything else."""
    if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return ast.unparse(node)
    return None


def log_formats(root: Path) -> dict[str, list[dict[str, str]]]:
    """Every format string of the log lines in ``LOG_PHRASES``, as source, with where it is."""
    found: dict[str, list[dict[str, str]]] = {key: [] for key in LOG_PHRASES}
    for folder in LOG_DIRS:
        for path in sorted((root / "sglang" / folder).rglob("*.py")):
            try:
                tree = ast.parse(path.read_text())
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                source = _string_source(node)
                if source is None:
                    continue
                text = source if isinstance(node, ast.JoinedStr) else node.value  # type: ignore[attr-defined]
                for key, phrases in LOG_PHRASES.items():
                    if all(p in text for p in phrases) and not _nested(node, tree):
                        where = f"{path.relative_to(root)}:{node.lineno}"  # type: ignore[attr-defined]
                        found[key].append({"format": source, "at": where})
    return found


def _nested(node: ast.AST, tree: ast.AST) -> bool:
    """A string inside an f-string (its format spec or a literal part) is not a format of its own."""
    return any(isinstance(p, ast.JoinedStr) and p is not node and node in ast.walk(p) for p in _parents(tree, node))


def _parents(tree: ast.AST, target: ast.AST) -> list[ast.AST]:
    for parent in ast.walk(tree):
        if any(child is target for child in ast.iter_child_nodes(parent)):
            return [parent]
    return []


def metric_names(root: Path) -> list[str]:
    """Every ``sglang:`` metric name written as a string in the release."""
    names: set[str] = set()
    for path in (root / "sglang" / "srt").rglob("*.py"):
        if "metrics" not in path.parts and "metrics" not in path.stem:
            continue
        try:
            tree = ast.parse(path.read_text())
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("sglang:"):
                names.add(node.value.split("{")[0])
    return sorted(names)


def fixture(version: str, python: str | None, cache: Path, out: Path) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        root = unpack(download(version, cache), Path(tmp))
        srt = root / "sglang" / "srt"
        text, why = built_help(python, root)
        if text is not None:
            (out / f"{version}-help.txt.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
            help_made = (
                "argparse: ServerArgs.add_cli_args built with the release on PYTHONPATH "
                "(torchvision stubbed; a transformers name it registers again is allowed)"
            )
            flags = None
        else:
            help_made = f"static: add_argument calls in sglang/srt/server_args.py (parser not built: {why})"
            flags = static_flags(srt / "server_args.py")
        data: dict[str, object] = {
            "schema_version": SCHEMA_VERSION,
            "release": version,
            "help_made_by": help_made,
            "routes": routes(srt / "entrypoints" / "http_server.py"),
            "log_formats": log_formats(root),
            "metrics": metric_names(root),
        }
        if flags is not None:
            data["flags"] = flags
    (out / f"{version}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def load(folder: Path) -> list[dict[str, object]]:
    """Every release fixture in ``folder``, oldest first, with its flag set under ``"flags"``."""
    from autotune.engines.base import parse_help_flags  # the table is made where autotune is installed

    out = []
    for path in folder.glob("*.json"):
        data = json.loads(path.read_text())
        help_file = path.with_name(f"{data['release']}-help.txt.gz")
        if help_file.is_file():
            data["flags"] = sorted(parse_help_flags(gzip.decompress(help_file.read_bytes()).decode()))
        out.append(data)
    return sorted(out, key=lambda d: tuple(int(p) for p in str(d["release"]).split(".")))


def _sizes_logged_on(formats: dict[str, list[dict[str, str]]]) -> str:
    # Only the decode capture lines carry "bs=" (the prefill ones list num_tokens).
    if any("bs=" in f["format"] for f in formats["capture_begin"]):
        return "begin line"
    if any("bs=" in f["format"] for f in formats["capture_end"]):
        return "end line"
    return "own line" if formats["capture_bs"] else "not logged"


def table(folder: Path) -> str:
    """The release × feature table of ``docs/sglang.md``, made from the fixtures."""
    releases = load(folder)
    yes = {True: "yes", False: "no"}
    rows: list[tuple[str, list[str]]] = [
        (f"`{flag}` accepted", [yes[flag in d["flags"]] for d in releases])  # type: ignore[operator]
        for flag in ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs", "--attn-dp-size")
    ]
    rows += [
        ("`GET /ready` served", [yes["GET /ready" in d["routes"]] for d in releases]),  # type: ignore[operator]
        ("decode graph sizes logged on", [_sizes_logged_on(d["log_formats"]) for d in releases]),  # type: ignore[arg-type]
        (
            "`max_running_requests was reduced` logged",
            [yes[bool(d["log_formats"]["max_running_reduced"])] for d in releases],  # type: ignore[index]
        ),
    ]
    rows += [
        (f"`{name}`", [yes[name in d["metrics"]] for d in releases])  # type: ignore[operator]
        for name in ("sglang:cuda_graph_passes_total", "sglang:num_retracted_input_tokens_total", "sglang:token_usage")
    ]
    rows.append(("`--help` read from", [str(d["help_made_by"]).split(":")[0] for d in releases]))
    head = "| | " + " | ".join(str(d["release"]) for d in releases) + " |"
    rule = "|---" * (len(releases) + 1) + "|"
    return "\n".join([head, rule, *(f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows)]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("releases", nargs="*", help="SGLang versions, e.g. 0.5.9 0.5.23")
    parser.add_argument("--python", help="an interpreter with CPU torch, orjson, msgspec and IPython")
    parser.add_argument("--out", type=Path, default=Path("tests/engines/data/sglang-releases"))
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache/autotune/sglang-wheels")
    parser.add_argument("--table", type=Path, help="print the docs table made from the fixtures in this folder")
    args = parser.parse_args()
    if args.table:
        sys.stdout.write(table(args.table))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    args.cache.mkdir(parents=True, exist_ok=True)
    for version in args.releases:
        data = fixture(version, args.python, args.cache, args.out)
        print(f"sglang {version}: {len(data['routes'])} routes, {len(data['metrics'])} metrics; {data['help_made_by']}")


if __name__ == "__main__":
    main()
