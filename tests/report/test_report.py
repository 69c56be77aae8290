"""The study report: numbers against the engine defaults, every plot, failures, and a real render.

The studies are synthetic (``optuna.trial.create_trial``) but stored the way ``autotune tune``
stores them: SQLite under ``results/<study>/``, the same user attributes, and ``bench.json`` files
in each trial's folder.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState
from typer.testing import CliRunner

from autotune.cli import app
from autotune.report import summary as summary_module
from autotune.report.html import write_report
from autotune.report.plots import history, pareto
from autotune.report.summary import CDF_POINTS, _empirical, summarize
from autotune.search.record import WITHDRAWN, trial_record
from autotune.search.storage import default_storage_url, load_study

# One xdist group: under `make test` the shared study and its report are built once, not on each worker.
pytestmark = pytest.mark.xdist_group("report")
STUDY = "nightly"
SLOS = {"p95_ttft_ms": 1000.0, "p95_tpot_ms": 50.0}
DISTRIBUTIONS = {
    "memory_fraction": FloatDistribution(0.80, 0.96, step=0.02),
    "max_running": IntDistribution(64, 1024, log=True),
    "batched_tokens": CategoricalDistribution([2048, 4096, 8192, 16384]),
}
FIXED = {"--max-model-len": 4096}
BASELINE_TPS = 1000.0
WINNER_RUNS_TPS = (1500.0, 1450.0, 1550.0)  # finalist, then its two validation re-runs
WINNER_RUNS_TTFT = (700.0, 680.0, 720.0)
WINNER_PARAMS = {"memory_fraction": 0.92, "max_running": 256, "batched_tokens": 8192}
OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
KV_LINE = "ValueError: To serve at least one request with max seq len (4096), 2.1 GiB KV cache is needed"
CRASH_LINE = "RuntimeError: NCCL error in: ../csrc/distributed/c10d/NCCLUtils.hpp:275"
RUNTIME_OOM_LINE = "CUDA out of memory during decode (runtime)"
PLOT_IDS = (
    "plot-history",
    "plot-pareto",
    "plot-memory-edge",
    "plot-cuda-graph",
    "plot-importance",
    "plot-latency-cdf",
    "plot-twin",
)


# -------------------------------------------------------------------------------- study builder
def _flags(params: dict[str, Any]) -> dict[str, Any]:
    names = {"memory_fraction": "--gpu-memory-utilization", "max_running": "--max-num-seqs"}
    names["batched_tokens"] = "--max-num-batched-tokens"
    return {**FIXED, **{names.get(k, k): v for k, v in params.items()}}


def _metrics(tps: float, ttft: float = 400.0) -> dict[str, float]:
    return {
        "output_throughput": tps,
        "request_throughput": tps / 256,
        "request_goodput": tps / 300,
        "median_ttft_ms": ttft * 0.6,
        "p90_ttft_ms": ttft * 0.9,
        "p95_ttft_ms": ttft,
        "p99_ttft_ms": ttft * 1.3,
        "median_tpot_ms": 20.0,
        "p95_tpot_ms": 30.0,
        "median_e2el_ms": 6000.0,
        "p90_e2el_ms": 7000.0,
        "p95_e2el_ms": 7500.0,
        "p99_e2el_ms": 8000.0,
        "error_rate": 0.0,
    }


class _Builder:
    """Adds trials to a study the way the tuning loop records them."""

    def __init__(self, results: Path, name: str, *, simulated: bool = True):
        self.dir = results / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.study = optuna.create_study(
            study_name=name, storage=default_storage_url(results, name), direction="maximize"
        )
        self.study.set_user_attr(
            "config",
            {
                "engine": {"kind": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "simulated": simulated},
                "workload": {"name": "chat", "slos": SLOS, "objective": {"metric": "output_throughput"}},
            },
        )

    def add(
        self,
        stage: str,
        outcome: str,
        *,
        params: dict[str, Any] | None = None,
        flags: dict[str, Any] | None = None,
        tps: float | None = None,
        ttft: float = 400.0,
        reason: str = "",
        facts: dict[str, Any] | None = None,
        bench: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> int:
        number = len(self.study.get_trials(deepcopy=False))
        trial_dir = self.dir / "trials" / str(number)
        trial_dir.mkdir(parents=True)
        (trial_dir / "engine.log").write_text(reason + "\n")
        params = params or {}
        served = outcome in ("ok", "slo_violation")
        metrics = _metrics(tps, ttft) if served and tps is not None else {}
        if bench is not None or served:
            runs = bench if bench is not None else [metrics]
            (trial_dir / "bench.json").write_text(json.dumps({"schema_version": 1, "runs": runs}))
        violated = {"p95_ttft_ms": (ttft - SLOS["p95_ttft_ms"]) / SLOS["p95_ttft_ms"]} if ttft > 1000 else {}
        attrs = {
            "stage": stage,
            "outcome": outcome,
            "params": params,
            "flags": flags if flags is not None else _flags(params),
            "metrics": metrics,
            "spread": {"output_throughput": 0.02} if served else {},
            "constraints": [max(v, -0.1) for v in violated.values()] or [-0.5] if served else [1e6],
            "violations": violated if served else {"outcome": 1e6},
            "facts": facts if facts is not None else ({"kv_tokens": 120_000, "preemptions": 0} if served else {}),
            "timings": {"startup_s": 30.0, "bench_s": 60.0, "total_s": 95.0},
            "reason": reason,
            "log_path": str(trial_dir / "engine.log"),
            "trial_dir": str(trial_dir),
            **extra,
        }
        failed = outcome in ("crash", "startup_timeout", WITHDRAWN)
        self.study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.FAIL if failed else TrialState.COMPLETE,
                value=None if failed else (tps if served else 0.0),
                params=params,
                distributions={k: DISTRIBUTIONS[k] for k in params},
                user_attrs=attrs,
            )
        )
        return number


def _per_request_run(n: int, ttft_s: float, failed: int) -> dict[str, Any]:
    """A bench.json run with vLLM's per-request arrays; failed requests carry zeros and an error."""
    ok = n - failed
    return {
        **_metrics(1500.0),
        "ttfts": [ttft_s * (1 + i / ok) for i in range(ok)] + [0.0] * failed,
        "latencies": [6.0 + i / ok for i in range(ok)] + [0.0] * failed,
        "errors": [""] * ok + ["HTTP 500"] * failed,
    }


TWIN_PREDICTED = {1200.0: 1260.0, 1300.0: 1170.0}  # measured → predicted tok/s: +5 % and −10 %
TWIN_FIT = {"step_s": 0.004, "seq_s": 2e-4, "token_s": 3e-5, "runs": 3, "residual": 0.05}


def _twin(predicted: float, measured: float) -> dict[str, Any]:
    error = {"output_throughput": (predicted - measured) / measured}
    return {"predicted": {"output_throughput": predicted}, "fit": TWIN_FIT, "from_runs": 3, "error": error,
            "measured": {"output_throughput": measured}}  # fmt: skip


def _full_study(results: Path) -> tuple[optuna.Study, dict[str, int]]:
    """Baseline, a search with served/violating/failed trials, probes, and a validated winner."""
    b = _Builder(results, STUDY)
    ids = {"baseline": b.add("baseline", "ok", tps=BASELINE_TPS, ttft=600.0)}
    # The memory-edge probes run the workload's peak load (a workload of their own).
    peak: dict[str, Any] = {"workload_override": {"name": "chat-peak"}}
    b.add("memory_edge", "ok", flags={**FIXED, "--gpu-memory-utilization": 0.90}, tps=1100.0, **peak)
    b.add("memory_edge", "ok", flags={**FIXED, "--gpu-memory-utilization": 0.92}, tps=1150.0, **peak)
    ids["oom_runtime"] = b.add(
        "memory_edge",
        "oom_runtime",
        flags={**FIXED, "--gpu-memory-utilization": 0.96},
        reason=RUNTIME_OOM_LINE,
        **peak,
    )
    for bs, graph_tps in ((256, 1150.0), (512, 1210.0)):
        b.add("cuda_graph", "ok", flags={**FIXED, "--max-cudagraph-capture-size": bs}, tps=graph_tps)
    b.study.set_user_attr("stage.memory_edge", {"done": True, "edge": 0.92, "mode": "step"})
    b.study.set_user_attr("stage.cuda_graph", {"done": True, "fixed": {"cuda_graph_max_bs": 512}})
    search: list[tuple[dict[str, Any], str, float | None, float, str]] = [
        ({"memory_fraction": 0.86, "max_running": 128, "batched_tokens": 4096}, "ok", 1200.0, 500.0, ""),
        (WINNER_PARAMS, "ok", WINNER_RUNS_TPS[0], WINNER_RUNS_TTFT[0], ""),
        ({"memory_fraction": 0.90, "max_running": 1024, "batched_tokens": 16384}, "slo_violation", 1700.0, 1400.0, ""),
        ({"memory_fraction": 0.96, "max_running": 512, "batched_tokens": 8192}, "oom_startup", None, 0.0, OOM_LINE),
        ({"memory_fraction": 0.80, "max_running": 64, "batched_tokens": 2048}, "ok", 900.0, 300.0, ""),
        ({"memory_fraction": 0.82, "max_running": 700, "batched_tokens": 16384}, "kv_insufficient", None, 0.0, KV_LINE),
        ({"memory_fraction": 0.88, "max_running": 300, "batched_tokens": 4096}, "crash", None, 0.0, CRASH_LINE),
        ({"memory_fraction": 0.84, "max_running": 200, "batched_tokens": 8192}, "ok", 1300.0, 650.0, ""),
    ]
    # A finished trial's attributes cannot change, so the finalist carries its validation summary
    # from the start (the runs themselves follow as validation trials).
    validated: dict[str, Any] = {"validated_values": list(WINNER_RUNS_TPS), "validated_median": 1500.0}
    validated["validated_spread"] = 100.0 / 1500.0
    for params, outcome, tps, ttft, reason in search:
        extra = validated if params is WINNER_PARAMS else {}
        if tps in TWIN_PREDICTED:  # the twin predicted these two before they ran
            extra = {**extra, "twin": _twin(TWIN_PREDICTED[tps], tps)}
        n = b.add("search", outcome, params=params, tps=tps, ttft=ttft, reason=reason, **extra)
        ids.setdefault(outcome, n)
        if params is WINNER_PARAMS:
            ids["winner"] = n
    for run_tps, run_ttft in zip(WINNER_RUNS_TPS[1:], WINNER_RUNS_TTFT[1:], strict=True):
        bench = [_per_request_run(40, 0.3, 2)]
        b.add(
            "validation", "ok", params=WINNER_PARAMS, tps=run_tps, ttft=run_ttft, validates=ids["winner"], bench=bench
        )
    return b.study, ids


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    results = tmp_path_factory.mktemp("results")
    _, ids = _full_study(results)
    html_path, md_path = write_report(load_study(STUDY, default_storage_url(results, STUDY)), results / STUDY)
    return {"results": results, "ids": ids, "html": html_path.read_text(), "md": md_path.read_text(), "path": html_path}


# ------------------------------------------------------------------------------------ the numbers
@pytest.mark.sim
def test_winner_is_measured_by_the_median_of_its_validation_runs(full: dict[str, Any]) -> None:
    report = summarize(load_study(STUDY, default_storage_url(full["results"], STUDY)))
    assert report.winner is not None and report.winner.number == full["ids"]["winner"]
    assert report.baseline is not None and report.baseline.number == full["ids"]["baseline"]
    assert report.winner_runs == 3
    gain = report.objective_gain
    assert gain is not None
    assert gain.baseline == BASELINE_TPS and gain.winner == 1500.0
    assert gain.change == pytest.approx(0.5)
    assert gain.spread == pytest.approx(100.0 / 1500.0)
    ttft = next(g for g in report.gains if g.key == "p95_ttft_ms")
    assert ttft.winner == 700.0 and ttft.spread == pytest.approx(40.0 / 700.0)
    assert ttft.change == pytest.approx(700.0 / 600.0 - 1) and ttft.improved is False  # slower first token


@pytest.mark.sim
def test_flags_table_puts_the_changed_flags_first(full: dict[str, Any]) -> None:
    report = summarize(load_study(STUDY, default_storage_url(full["results"], STUDY)))
    flags = {r.flag: r for r in report.flags}
    assert flags["--gpu-memory-utilization"].baseline == "(engine default)"
    assert flags["--gpu-memory-utilization"].winner == "0.92"
    assert not flags["--max-model-len"].changed
    assert report.flags[-1].flag == "--max-model-len"


@pytest.mark.sim
def test_latency_cdfs_pool_successful_requests_and_fall_back_to_percentiles(full: dict[str, Any]) -> None:
    report = summarize(load_study(STUDY, default_storage_url(full["results"], STUDY)))
    winner, baseline = report.cdfs["winner"], report.cdfs["baseline"]
    # Two validation runs of 40 requests, 2 failed each; the finalist's bench.json has no arrays.
    assert winner.per_request and winner.runs == 2 and len(winner.ttft[0]) == 76
    assert min(winner.ttft[0]) == pytest.approx(300.0) and winner.ttft[1][-1] == 1.0
    assert not baseline.per_request
    assert baseline.ttft == ([360.0, 540.0, 600.0, 780.0], [0.5, 0.9, 0.95, 0.99])


@pytest.mark.sim
def test_probes_under_their_own_load_stay_off_the_pareto_plot(full: dict[str, Any]) -> None:
    report = summarize(load_study(STUDY, default_storage_url(full["results"], STUDY)))
    figure = pareto(report).figure
    assert figure is not None
    names = {trace.name for trace in figure.data}
    assert "memory_edge" not in names and {"search", "cuda_graph", "Pareto front"} <= names
    front = next(trace for trace in figure.data if trace.name == "Pareto front")
    # Each point beats every point with a lower p95 TTFT on throughput (1,150 at 400 ms does not).
    assert list(front.x) == [300.0, 400.0, 650.0, 680.0, 700.0, 720.0, 1400.0]
    assert list(front.y) == [900.0, 1210.0, 1300.0, 1450.0, 1500.0, 1550.0, 1700.0]


# --------------------------------------------------------------------------------------- the page
@pytest.mark.sim
def test_html_has_every_plot_once_and_opens_offline(full: dict[str, Any]) -> None:
    page = full["html"]
    for plot_id in PLOT_IDS:
        assert page.count(f'id="{plot_id}"') == 1, plot_id
        assert f'Plotly.newPlot(                        "{plot_id}"' in page or f'"{plot_id}",' in page
    assert page.count("plotly.js v") == 1  # the library is inlined exactly once
    assert not re.search(r"<script[^>]+src=", page)  # nothing fetched from a CDN
    assert 'id="simulated-banner"' in page and "numbers are modelled" in page
    assert "Kept: 512" in page  # the CUDA-graph stage's decision
    assert "edge kept = winner" in page  # the memory edge the stage kept, which the winner uses


def _rows_by_trial(table: str) -> dict[int, str]:
    """Body rows of an HTML table keyed by the trial number in their first cell."""
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table)[1:]:
        number = re.search(r'<td class="num">(\d+)</td>', row)
        assert number is not None, row
        rows[int(number.group(1))] = row
    return rows


@pytest.mark.sim
def test_html_failure_table_explains_each_failure_with_its_log(full: dict[str, Any]) -> None:
    page = full["html"]
    table = page[page.index('id="failure-table"') :]
    table = table[: table.index("</table>")]
    by_trial = _rows_by_trial(table)
    ids = full["ids"]
    for outcome, line in (
        ("oom_startup", OOM_LINE),
        ("kv_insufficient", KV_LINE),
        ("crash", CRASH_LINE),
        ("oom_runtime", RUNTIME_OOM_LINE),
    ):
        row = by_trial[ids[outcome]]
        assert f"<td>{outcome}</td>" in row
        assert html.escape(line) in row
        assert f'href="trials/{ids[outcome]}/engine.log"' in row
    assert "p95_ttft_ms +40% over its bound" in by_trial[ids["slo_violation"]]
    assert ids["winner"] not in by_trial and ids["baseline"] not in by_trial


@pytest.mark.sim
def test_html_lists_engine_facts_per_trial(full: dict[str, Any]) -> None:
    page = full["html"]
    facts = page[page.index('id="facts-table"') :]
    facts = facts[: facts.index("</table>")]
    assert "<th>KV tokens</th>" in facts and "<th>preemptions</th>" in facts
    assert facts.count("120,000") >= 5


@pytest.mark.sim
def test_the_twin_is_said_with_its_median_error_and_plotted(full: dict[str, Any]) -> None:
    line = "median |error| over the 2 measured: output tok/s 7.5 %"
    assert line in full["md"] and line in html.unescape(full["html"])
    assert "predicted against measured" in full["html"]


@pytest.mark.sim
def test_markdown_has_the_gain_table_flags_and_failures(full: dict[str, Any]) -> None:
    md = full["md"]
    assert "> **Simulated engine: numbers are modelled**" in md
    assert f"## Winner: trial #{full['ids']['winner']}" in md
    assert "| output throughput (tok/s) | 1,000 | 1,500 | 6.7% | +50.0% ✓ |" in md
    assert "| p95 TTFT (ms) | 600 | 700 | 5.7% | +16.7% ✗ |" in md
    assert "| `--gpu-memory-utilization` | (engine default) | **0.92** |" in md
    assert re.search(r"\| oom_startup \| 1 \| \d+ \| `torch\.OutOfMemoryError", md)
    assert "| slo_violation | 1 |" in md
    # The noise every decision allowed for: the winner's three launches spread the widest.
    assert "Decisions allowed for the run-to-run noise ±6.7% (widest of" in md
    assert "Decisions allowed for the run-to-run noise ±6.7% (widest of" in full["html"]


# ------------------------------------------------------------------------------- sparse studies
def test_small_real_study_leaves_out_probes_and_explains_missing_importance(tmp_path: Path) -> None:
    b = _Builder(tmp_path, "small", simulated=False)
    b.add("baseline", "ok", tps=BASELINE_TPS)
    b.add("search", "ok", params=WINNER_PARAMS, tps=1200.0)
    b.study.set_user_attr("stage.memory_edge", {"done": True, "skipped": "the CPU build sizes its KV cache itself"})
    html_path, md_path = write_report(b.study, tmp_path / "small")
    page = html_path.read_text()
    assert 'id="plot-memory-edge"' not in page and "skipped: the CPU build sizes its KV cache itself" in page
    assert "plot-cuda-graph" not in page  # a stage that never ran gets no section at all
    assert 'id="plot-importance"' not in page
    assert "needs at least 3 served search trials and 2 varied parameters (have 1 and 0)" in page
    assert "simulated-banner" not in page and "modelled" not in md_path.read_text()
    assert "for engine defaults and winner: those lines join the recorded percentiles" in page


@pytest.mark.sim
def test_a_withdrawn_trial_and_an_early_end_of_the_search_are_said(tmp_path: Path) -> None:
    b = _Builder(tmp_path, "withdrawn")
    b.add("baseline", "ok", tps=BASELINE_TPS)
    b.add("search", "ok", params=WINNER_PARAMS, tps=1200.0)
    b.add("search", WITHDRAWN, params=WINNER_PARAMS, reason="withdrawn before its engine started: trial 1 ...")
    b.study.set_user_attr(
        "stage.search", {"done": True, "stalled": "every configuration of the search space was measured"}
    )
    html_path, md_path = write_report(b.study, tmp_path / "withdrawn")
    md, page = md_path.read_text(), html_path.read_text()
    header = "2 trials (baseline 1, search 1); 1 more withdrawn before launch"
    assert header in md and header in page
    assert "| withdrawn |" not in md  # it never ran: no failure to explain
    assert "**Search ended early:** every configuration of the search space was measured." in md
    assert "Search ended early: every configuration of the search space was measured.</p>" in page


@pytest.mark.sim
def test_study_with_no_feasible_trial_still_reports_its_failures(tmp_path: Path) -> None:
    b = _Builder(tmp_path, "broken")
    b.add("baseline", "oom_startup", reason=OOM_LINE)
    b.add("search", "invalid_flags", params=WINNER_PARAMS, reason="error: unrecognized arguments: --max-num-seq")
    html_path, md_path = write_report(b.study, tmp_path / "broken")
    page, md = html_path.read_text(), md_path.read_text()
    # Nothing served, so nothing "missed the SLOs": the page counts the launches by outcome.
    assert "No trial served the workload: 2 launches: invalid_flags 1, oom_startup 1" in page
    assert "No trial served the workload: 2 launches: invalid_flags 1, oom_startup 1" in md
    assert "met the SLOs" not in page and "met the SLOs" not in md
    assert "unrecognized arguments: --max-num-seq" in page
    assert "| invalid_flags | 1 | 1 |" in md and "| oom_startup | 1 | 0 |" in md


# --------------------------------------------------------------------------------------- the CLI
@pytest.mark.sim
def test_cli_report_writes_both_files(full: dict[str, Any], tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(full["results"], results)
    result = CliRunner().invoke(app, ["report", STUDY, "--results", str(results)])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [str(results / STUDY / "report.html"), str(results / STUDY / "report.md")]
    assert (results / STUDY / "report.md").read_text().startswith(f"# autotune report: {STUDY}")


def test_cli_report_on_a_missing_study_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", "nope", "--results", str(tmp_path)])
    assert result.exit_code == 2
    assert "no study 'nope'" in result.output and "Traceback" not in result.output


# ------------------------------------------------------------------------------ a real browser
@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium; the test is skipped without it unless AUTOTUNE_REQUIRE_BROWSER is set."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("AUTOTUNE_REQUIRE_BROWSER"):
            pytest.fail("AUTOTUNE_REQUIRE_BROWSER is set but chromium is not installed (make browser)")
        pytest.skip("chromium is not installed (make browser installs it)")
    return found


def _headless(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.sim
@pytest.mark.slow
def test_report_renders_every_plot_in_a_headless_browser(chromium: str, full: dict[str, Any], tmp_path: Path) -> None:
    done = _headless(chromium, tmp_path / "profile", "--dump-dom", full["path"].resolve().as_uri())
    dom = done.stdout
    assert done.returncode == 0 and "</html>" in dom, done.stderr[-2000:]
    starts = sorted((dom.index(f'id="{p}"'), p) for p in PLOT_IDS)
    for (start, plot_id), (end, _) in zip(starts, [*starts[1:], (len(dom), "")], strict=True):
        # plotly draws each figure into <svg class="main-svg"> inside its div once it has run.
        assert 'class="main-svg"' in dom[start:end], f"{plot_id} did not render"


def test_long_runs_are_thinned_to_a_bounded_cdf() -> None:
    xs, shares = _empirical([float(i % 977) for i in range(20_000)])
    assert len(xs) <= CDF_POINTS and shares[-1] == 1.0 and xs[-1] == 976.0
    assert xs == sorted(xs) and shares == sorted(shares)


def test_a_flag_the_engine_lowered_is_shown_and_read_as_the_value_it_used() -> None:
    def trial(flags: dict[str, Any], facts: dict[str, Any]) -> optuna.trial.FrozenTrial:
        attrs = {"flags": flags, "params": {"max_running": flags.get("--max-running-requests")}, "facts": facts}
        return optuna.trial.create_trial(state=TrialState.COMPLETE, value=1.0, user_attrs=attrs)

    reduced = {"reduced_flags": {"--max-running-requests": {"requested": 128, "used": 40}}}
    winner = trial({"--max-running-requests": 128, "--chunked-prefill-size": 4096}, reduced)
    baseline = trial({}, {})
    rows = {r.flag: r for r in summary_module._flag_rows(baseline, winner)}
    assert rows["--max-running-requests"].winner == "128 (engine used 40)"
    assert rows["--chunked-prefill-size"].winner == "4096"
    assert summary_module.knob_value(trial_record(winner), "max_running") == 40


@pytest.mark.sim
def test_the_headline_states_the_paired_verdict_and_marks_only_beyond_the_noise(tmp_path: Path) -> None:
    # As demo-vllm-cpu ended: the winner's median beat the baseline's single run, but side by side
    # with the defaults no round told them apart.
    study, ids = _full_study(tmp_path)
    line = (
        "no candidate beat the engine's defaults beyond the measured noise of ±2.0% "
        "(winner +0.4%, range −1.5% … +2.5% over 3 paired runs)"
    )
    said = {"winner": ids["winner"], "pairs": 3, "gain": 0.004, "noise": 0.02, "beats_defaults": False, "line": line}
    study.set_user_attr("verdict", said)
    html_path, md_path = write_report(load_study(STUDY, default_storage_url(tmp_path, STUDY)), tmp_path / STUDY)
    page = html.unescape(html_path.read_text())
    headline = re.search(r'<p class="headline">Winner: .*?</p>', page, re.S)
    assert headline is not None and line in headline.group(0)
    assert "+50.0%" not in headline.group(0) and 'class="good"' not in headline.group(0)
    assert f"side by side with the defaults: **{line}**" in md_path.read_text()
    # No metric is marked better or worse where nothing was measured twice to tell it apart.
    report = summarize(load_study(STUDY, default_storage_url(tmp_path, STUDY)))
    assert report.beats_defaults is False
    within = [
        g for g in report.gains if g.change is not None and abs(g.change) <= max(g.noise or 0, (g.spread or 0) / 2)
    ]
    assert within and all(g.improved is None for g in within)
    report_gain = report.objective_gain
    assert report_gain is not None and report_gain.noise is not None  # the winner's runs measured it
    assert report_gain.improved is True  # +50% against the baseline's run: beyond it, still marked


@pytest.mark.sim
def test_an_early_stopped_trial_is_drawn_and_listed_as_stopped_at_its_partial_value(tmp_path: Path) -> None:
    study, _ = _full_study(tmp_path)
    stopped = {"reason": "cannot_win", "at_requests": 40, "evidence": "upper bound 1,990.2 tok/s below the incumbent"}
    attrs = {
        "stage": "search",
        "outcome": "ok",
        "params": {},
        "flags": {},
        "metrics": _metrics(1943.1),
        "early_stop": stopped,
        "facts": {"kv_tokens": 120_000},
    }
    study.add_trial(
        optuna.trial.create_trial(state=TrialState.PRUNED, user_attrs=attrs, intermediate_values={0: 1943.1})
    )
    number = len(study.trials) - 1
    report = summarize(load_study(STUDY, default_storage_url(tmp_path, STUDY)))
    figure = history(report).figure
    assert figure is not None
    traces = {trace.name: trace for trace in figure.data}
    assert list(traces["stopped early"].x) == [number] and list(traces["stopped early"].y) == [1943.1]
    assert "ok" not in traces  # not a cross in the lane of trials that did not serve
    # The memory probes ran the peak shape: off the workload's axis.
    assert "memory_edge" not in traces and {"baseline", "search", "cuda_graph", "validation"} <= set(traces)
    html_path, _ = write_report(load_study(STUDY, default_storage_url(tmp_path, STUDY)), tmp_path / STUDY)
    assert "ok (stopped early: cannot_win)" in html.unescape(html_path.read_text())
