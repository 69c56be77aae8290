"""The flag report of ``autotune recheck`` over the engines' own saved help texts: a launch tuned on
one release, checked against another (renamed, deprecated, removed, variables no longer read)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
from releases import help_text, release

from autotune.engines.base import EngineAdapter, deprecation_notes
from autotune.engines.drift import EnvChange, FlagReport, check_launch, engine_install
from autotune.engines.sglang import SglangAdapter
from autotune.engines.vllm import VllmAdapter

Reads = Callable[[str], bool] | None


def _check(
    adapter: type[EngineAdapter],
    version: str,
    flags: dict[str, Any],
    env: dict[str, str] | None = None,
    reads: Callable[[str], bool] | None = None,
) -> FlagReport:
    """A launch checked against a saved release with the adapter's own tables."""
    return check_launch(
        flags,
        env or {},
        engine=adapter.title,
        known=release(adapter.name, version),
        version=version,
        changes=adapter.flag_changes,
        env_changes=adapter.env_changes,
        env_prefixes=adapter.env_prefixes,
        reads=reads,
    )


def sglang_check(
    version: str, flags: dict[str, Any], env: dict[str, str] | None = None, reads: Reads = None
) -> FlagReport:
    return _check(SglangAdapter, version, flags, env, reads)


def vllm_check(
    version: str, flags: dict[str, Any], env: dict[str, str] | None = None, reads: Reads = None
) -> FlagReport:
    return _check(VllmAdapter, version, flags, env, reads)


#: A launch tuned on SGLang 0.5.12, before the per-phase graph flags.
TUNED_ON_0_5_12 = {
    "--mem-fraction-static": 0.85,
    "--cuda-graph-max-bs": 256,
    "--disable-piecewise-cuda-graph": True,
    "--enable-dp-attention": True,
}


def test_a_launch_of_0_5_12_on_0_5_23_is_respelt_where_flags_were_renamed() -> None:
    report = sglang_check("0.5.23", TUNED_ON_0_5_12)
    verdicts = {f.subject: f.verdict for f in report.findings}
    assert verdicts == {
        "--mem-fraction-static": "kept",
        "--cuda-graph-max-bs": "renamed",  # removed in 0.5.20
        "--disable-piecewise-cuda-graph": "renamed",  # an alias of the prefill backend, removed in 0.5.20
        "--enable-dp-attention": "deprecated",  # still accepted; its help says what replaces it
    }
    assert report.flags == {
        "--mem-fraction-static": 0.85,
        "--cuda-graph-max-bs-decode": 256,
        "--cuda-graph-backend-prefill": "disabled",
        "--enable-dp-attention": True,
    }
    lines = "\n".join(report.lines())
    assert (
        "renamed in SGLang 0.5.15, the old spelling removed in 0.5.20; written as --cuda-graph-max-bs-decode 256"
        in lines
    )
    assert "--enable-dp-attention: deprecated in SGLang 0.5.23: Deprecated. Use --attn-dp-size" in lines
    assert report.lines()[0] == "SGLang 0.5.23: 1 of 4 flags and variables unchanged"


def test_in_the_deprecation_window_both_spellings_work_and_the_new_one_is_written() -> None:
    report = sglang_check("0.5.15", {"--cuda-graph-max-bs": 256, "--disable-cuda-graph": True})
    assert [f.verdict for f in report.findings] == ["deprecated", "deprecated"]
    assert report.flags == {
        "--cuda-graph-max-bs-decode": 256,
        "--cuda-graph-backend-decode": "disabled",
        "--cuda-graph-backend-prefill": "disabled",
    }


def test_a_flag_the_new_release_does_not_list_is_removed_and_left_out() -> None:
    # --cuda-graph-backend-prefill exists from 0.5.15: "back" on 0.5.12 it is not there at all.
    report = sglang_check("0.5.12", {"--cuda-graph-backend-prefill": "full", "--mem-fraction-static": 0.8})
    removed = report.findings[0]
    assert removed.verdict == "removed" and report.flags == {"--mem-fraction-static": 0.8}
    assert removed.line.startswith("--cuda-graph-backend-prefill: not in SGLang 0.5.12's --help, so it was removed")


def test_a_switched_off_alias_translates_to_nothing() -> None:
    report = sglang_check("0.5.23", {"--disable-piecewise-cuda-graph": False})
    assert report.findings[0].verdict == "renamed" and report.flags == {}


def test_variables_the_release_no_longer_names_are_left_out_and_others_kept() -> None:
    read = {"SGLANG_ENABLE_TORCH_COMPILE"}
    env = {"SGLANG_ENABLE_TORCH_COMPILE": "1", "SGLANG_OLD_KNOB": "2", "HF_HOME": "/models"}
    report = sglang_check("0.5.23", {}, env, reads=lambda name: name in read)
    assert {f.subject: f.verdict for f in report.findings} == {
        "SGLANG_ENABLE_TORCH_COMPILE": "kept",
        "SGLANG_OLD_KNOB": "removed",
        "HF_HOME": "kept",  # not the engine's: never judged
    }
    assert report.env == {"SGLANG_ENABLE_TORCH_COMPILE": "1", "HF_HOME": "/models"}


def test_a_variable_ignored_since_a_release_becomes_its_flag() -> None:
    changes = (EnvChange("VLLM_SOME_BACKEND", "--attention-backend", since="0.32.0"),)
    known = release("vllm", "0.32.0")
    kwargs = {"engine": "vLLM", "known": known, "env_changes": changes, "env_prefixes": ("VLLM_",)}
    env = {"VLLM_SOME_BACKEND": "FLASH_ATTN"}
    on_new = check_launch({"--max-num-seqs": 64}, env, version="0.32.0", **kwargs)  # type: ignore[arg-type]
    assert on_new.flags == {"--max-num-seqs": 64, "--attention-backend": "FLASH_ATTN"} and on_new.env == {}
    assert on_new.findings[1].verdict == "ignored"
    on_old = check_launch({}, env, version="0.31.0", **kwargs)  # type: ignore[arg-type]
    assert on_old.env == env and on_old.findings[0].verdict == "kept"


@pytest.mark.parametrize("version", ["0.5.9", "0.5.12", "0.5.15", "0.5.19", "0.5.20", "0.5.23"])
def test_every_flag_change_is_said_once_its_release_has_the_new_spelling(version: str) -> None:
    known = release("sglang", version)
    for change in SglangAdapter.flag_changes:
        report = sglang_check(version, {change.old: True})
        verdict = report.findings[0].verdict
        if change.new not in known:
            assert verdict in ("kept", "removed"), (change.old, version)  # before the change: nothing to say
            assert (verdict == "kept") is (change.old in known)
        elif change.old in known:
            assert verdict == "deprecated", (change.old, version)
        else:
            assert verdict == "renamed", (change.old, version)


def test_help_prose_marks_deprecated_flags_and_nothing_else() -> None:
    notes = deprecation_notes(help_text("sglang", "0.5.15"))
    assert notes["--cuda-graph-max-bs"] == "Deprecated alias for --cuda-graph-max-bs-decode."
    assert notes["--stream-output"].startswith("[Deprecated] Use --incremental-streaming-output")
    assert "--cuda-graph-max-bs-decode" not in notes and "--mem-fraction-static" not in notes
    vllm_notes = deprecation_notes(help_text("vllm", "0.32.0"))
    assert "--allow-deprecated-quantization" not in vllm_notes  # a flag about deprecated things


def test_the_adapters_date_their_changes() -> None:
    for adapter in (VllmAdapter, SglangAdapter):
        for change in adapter.flag_changes:
            assert change.old != change.new and change.since, change


@pytest.mark.sim
def test_the_installed_release_and_its_variables_are_read_without_importing_it() -> None:
    install = engine_install(sys.executable, "optuna")
    import optuna

    assert install.version == optuna.__version__ and install.package_dir is not None
    assert install.reads("TPESampler") is True  # a name its sources hold
    assert install.reads("AUTOTUNE_NEVER_A_VARIABLE_ANYWHERE") is False
    missing = engine_install(sys.executable, "no_such_engine_package")
    assert missing.version is None and missing.reads("ANYTHING")  # no package: never "unread"


def test_vllm_launches_across_five_releases() -> None:
    # 0.31.0 renamed the Mamba prefix-cache switch without an alias.
    renamed = vllm_check("0.31.0", {"--enable-mamba-fine-grained-prefix-cache": True, "--max-num-seqs": 64})
    assert renamed.flags == {"--enable-mamba-shared-prefix-checkpoint": True, "--max-num-seqs": 64}
    assert [f.verdict for f in renamed.findings] == ["renamed", "kept"]
    # 0.34.0's help deprecates the graph-size flag (a sentence of its own); 0.33.0's does not.
    graphs = {"--max-cudagraph-capture-size": 256, "--enable-prefix-caching": False}
    assert [f.verdict for f in vllm_check("0.33.0", graphs).findings] == ["kept", "kept"]
    on_0_34 = vllm_check("0.34.0", graphs)
    assert [f.verdict for f in on_0_34.findings] == ["deprecated", "kept"] and on_0_34.flags == graphs
    assert "deprecated in vLLM 0.34.0: Deprecated with model runner V2" in on_0_34.findings[0].line


def test_the_attention_backend_variable_becomes_its_flag_where_no_file_reads_it() -> None:
    env = {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN", "VLLM_CPU_KVCACHE_SPACE": "1"}
    report = vllm_check("0.32.0", {}, env, reads=lambda name: name != "VLLM_ATTENTION_BACKEND")
    assert report.flags == {"--attention-backend": "FLASH_ATTN"} and report.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert report.findings[0].line == (
        "VLLM_ATTENTION_BACKEND: ignored by vLLM 0.32.0; written as --attention-backend FLASH_ATTN"
    )
    still_read = vllm_check("0.32.0", {}, env, reads=lambda name: True)
    assert still_read.env == env and still_read.flags == {}
