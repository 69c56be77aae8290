"""vLLM's torch.compile cache directory, as a simulated engine reads and writes it.

vLLM 0.34 (``compilation/backends.py``) names the cache directory after a hash of the factors that
change the compiled graph and keeps one sub-directory per rank:
``$VLLM_CACHE_ROOT/torch_compile_cache/<hash[:10]>/rank_<rank>_<dp>/backbone``. A start whose
directory already holds artifacts loads them instead of compiling.

Which flags are factors follows each config class's ``compile_factors`` in 0.34: SchedulerConfig
keeps ``max_num_seqs`` and ``max_num_batched_tokens`` (chunked prefill, policy, queue limits are
ignored); CacheConfig keeps the KV dtype and block size but ignores ``gpu_memory_utilization``,
``kv_cache_memory_bytes``, prefix caching and the extensible cache; the whole compilation config
(mode, CUDA-graph mode, capture sizes) counts; ModelConfig keeps the checkpoint, dtype,
quantization and max model len but ignores the seed, tokenizer and served names. The simulator
writes one marker file per key: the artifacts themselves are not modelled.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CompileCache", "cache_root"]

MARKER = "autotune_sim_compiled.json"


def cache_root(engine_env: Mapping[str, str]) -> Path:
    """``VLLM_CACHE_ROOT``, else ``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm`` (``vllm/envs.py``)."""
    root = engine_env.get("VLLM_CACHE_ROOT")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "vllm"


class CompileCache:
    """One engine's compile-cache directory and whether it already holds this key's artifacts."""

    def __init__(self, engine_env: Mapping[str, str], factors: Mapping[str, Any], rank: int = 0, dp_rank: int = 0):
        self.factors = dict(factors)
        digest = hashlib.sha256(json.dumps(self.factors, sort_keys=True, default=str).encode()).hexdigest()
        self.hash_key = digest[:10]
        self.enabled = engine_env.get("VLLM_DISABLE_COMPILE_CACHE", "0") not in ("1", "true", "True")
        self.local_dir = cache_root(engine_env) / "torch_compile_cache" / self.hash_key / f"rank_{rank}_{dp_rank}"
        self.local_dir = self.local_dir / "backbone"

    @property
    def warm(self) -> bool:
        """A previous start with the same factors finished compiling here."""
        return self.enabled and (self.local_dir / MARKER).is_file()

    def store(self) -> None:
        """Record the compiled artifacts, so the next start with this key is warm.

        An unwritable directory only costs the next start its warm compile, as in vLLM.
        """
        if not self.enabled:
            return
        try:
            self.local_dir.mkdir(parents=True, exist_ok=True)
            (self.local_dir / MARKER).write_text(json.dumps(self.factors, sort_keys=True, default=str))
        except OSError:
            pass
