#!/usr/bin/env bash
# Checks autotune's NVML code (autotune/runtime/gpu.py) against a real NVIDIA GPU, in under a
# minute or two: no model, no engine, no network. A child process takes 1 GiB of GPU memory through
# the CUDA driver (libcuda.so.1 via ctypes; torch or CuPy only if that fails), then:
#   list_gpus            lists every GPU with name and memory, as many as `nvidia-smi -L`
#   memory_used_by_pid   sees the child's memory under its PID (or, where NVML reports host
#                        PIDs or none, as growth of the device's used memory; the line says which)
#   wait_pids_released   returns once the SIGKILLed child's PID holds nothing (time printed)
#   wait_memory_at_most  returns once the device is back at its baseline (time printed)
# One PASS/FAIL/SKIP line per check and a summary line. Exit 0 when nothing failed, and on a
# machine without an NVIDIA GPU or driver (prints "no GPU"); 1 when a check failed; 2 when the
# Python lacks autotune's dependencies.
#
#   PYTHON                Python with autotune's dependencies (default: the repo's .venv/bin/python)
#   GPU_ACCEPTANCE_GIB    memory the child takes, in GiB (default 1)
#   GPU_ACCEPTANCE_ALLOC  auto | ctypes | torch | cupy (default auto)
#
#   bash scripts/gpu-acceptance.sh
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  python="$root/.venv/bin/python"
  if [[ ! -x "$python" ]]; then
    echo "gpu-acceptance: no $python (run 'make install' or set PYTHON); trying python3" >&2
    python=python3
  fi
fi
if ! command -v "$python" >/dev/null 2>&1; then
  echo "gpu-acceptance: no Python at '$python'; set PYTHON to one with autotune's dependencies" >&2
  exit 2
fi

cd "$root" || exit 2
# 5 minutes at most, whatever hangs (the child frees its memory when its stdin closes).
if command -v timeout >/dev/null 2>&1; then
  exec timeout -k 10 300 "$python" -u scripts/gpu_acceptance.py "$@"
fi
exec "$python" -u scripts/gpu_acceptance.py "$@"
