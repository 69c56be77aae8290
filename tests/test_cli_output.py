"""What the command line prints about a trial's flags: exactly what the engine is given."""

from __future__ import annotations

import json
import shlex

from autotune.cli import _flags_text


def test_flags_read_back_as_the_engine_argv() -> None:
    flags = {
        "--enforce-eager": True,
        "--enable-prefix-caching": False,
        "--max-num-seqs": 64,
        "--speculative-config": {"method": "ngram", "num_speculative_tokens": 4},
        "--served-model-name": "my model",
    }
    words = shlex.split(_flags_text(flags))
    assert words[:3] == ["--enforce-eager", "--max-num-seqs", "64"]
    spec = words[words.index("--speculative-config") + 1]
    assert json.loads(spec) == {"method": "ngram", "num_speculative_tokens": 4}
    assert words[-2:] == ["--served-model-name", "my model"]
    assert "--enable-prefix-caching" not in words
