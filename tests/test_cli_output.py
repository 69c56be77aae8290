"""What the command line and the report print about a trial's flags: words that read back as the
engine's argv (an on/off flag switched off is shown as ``--no-x``, not hidden)."""

from __future__ import annotations

import json
import shlex

from autotune.engines.base import flags_text


def test_flags_read_back_as_the_engine_argv() -> None:
    flags = {
        "--enforce-eager": True,
        "--enable-prefix-caching": False,
        "--max-num-seqs": 64,
        "--speculative-config": {"method": "ngram", "num_speculative_tokens": 4},
        "--served-model-name": "my model",
    }
    words = shlex.split(flags_text(flags))
    assert words[:4] == ["--enforce-eager", "--no-enable-prefix-caching", "--max-num-seqs", "64"]
    spec = words[words.index("--speculative-config") + 1]
    assert json.loads(spec) == {"method": "ngram", "num_speculative_tokens": 4}
    assert words[-2:] == ["--served-model-name", "my model"]
