"""Acceptance check of autotune's NVML code (``autotune.runtime.gpu``) on a real NVIDIA GPU.

Run it through ``scripts/gpu-acceptance.sh``. It downloads nothing and installs nothing: a child
process takes GPU memory through the CUDA driver (``libcuda.so.1`` via ctypes; torch or CuPy only
where the driver library cannot be used) and the checks watch autotune see it, then see it go
after a SIGKILL. One PASS/FAIL/SKIP line per check, then a summary line; exit 1 when a check
failed, 2 when this Python lacks autotune's dependencies, 0 otherwise, "no GPU" included.

    GPU_ACCEPTANCE_GIB    memory the child takes, in GiB (default 1)
    GPU_ACCEPTANCE_ALLOC  auto | ctypes | torch | cupy (default auto: ctypes, then torch, then CuPy)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1024**2
GIB = 1024**3
READY_TIMEOUT_S = 120.0  # CUDA initialisation (or importing torch) in the child
SEEN_TIMEOUT_S = 15.0  # NVML may report a new allocation a moment late
RELEASE_TIMEOUT_S = 60.0  # the tuner's own default for both waits
RELEASE_TOLERANCE = 256 * MIB  # used memory may sit this far above the baseline once released
SEEN_FRACTION = 0.95  # the child must show at least this share of what it allocated
CHECKS = ("list_gpus", "memory_used_by_pid", "wait_pids_released", "wait_memory_at_most")


# --------------------------------------------------------------------------- the child


def _alloc_ctypes(nbytes: int) -> Any:
    """Take ``nbytes`` on CUDA device 0 through the driver API; returns what must stay alive."""
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def check(result: int, what: str) -> None:
        if result != 0:
            text = ctypes.c_char_p()
            cuda.cuGetErrorString(result, ctypes.byref(text))
            raise RuntimeError(f"{what} failed: CUDA error {result} ({(text.value or b'?').decode()})")

    check(cuda.cuInit(0), "cuInit")
    device = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    context = ctypes.c_void_p()
    try:
        create = cuda.cuCtxCreate_v2
    except AttributeError:  # a driver without the old entry point: use the primary context
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
        check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    else:
        create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int]
        check(create(ctypes.byref(context), 0, device), "cuCtxCreate_v2")
    pointer = ctypes.c_uint64()
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    check(cuda.cuMemAlloc_v2(ctypes.byref(pointer), nbytes), "cuMemAlloc_v2")
    cuda.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
    check(cuda.cuMemsetD8_v2(pointer, 1, nbytes), "cuMemsetD8_v2")  # touch every page
    check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    return cuda, context, pointer


def _alloc_torch(nbytes: int) -> Any:
    import torch

    block = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    block.fill_(1)
    torch.cuda.synchronize()
    return block


def _alloc_cupy(nbytes: int) -> Any:
    import cupy

    cupy.cuda.Device(0).use()
    block = cupy.empty(nbytes, dtype=cupy.uint8)
    block.fill(1)
    cupy.cuda.Device(0).synchronize()
    return block


ALLOCATORS = {"ctypes": _alloc_ctypes, "torch": _alloc_torch, "cupy": _alloc_cupy}


def child(nbytes: int, method: str) -> int:
    """Take the memory, say ``READY <method>``, then hold it until stdin closes (or a signal)."""
    order = ["ctypes", "torch", "cupy"] if method == "auto" else [method]
    errors = []
    kept = None
    for name in order:
        try:
            kept = ALLOCATORS[name](nbytes)
        except Exception as err:  # each failure is reported, then the next way is tried
            errors.append(f"{name}: {type(err).__name__}: {err}")
            continue
        print(f"READY {name}", flush=True)
        sys.stdin.read()  # until the parent closes our stdin (or kills us)
        del kept
        return 0
    print("ERROR " + "; ".join(errors), flush=True)
    return 1


# --------------------------------------------------------------------------- the checks


class Results:
    def __init__(self) -> None:
        self.counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}

    def add(self, status: str, name: str, detail: str) -> None:
        self.counts[status] += 1
        print(f"{status} {name}: {detail}", flush=True)

    def summary(self) -> int:
        c = self.counts
        print(f"gpu-acceptance: {c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped", flush=True)
        return 1 if c["FAIL"] else 0


def _note(text: str) -> None:
    print(f"  {text}", flush=True)


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:.0f} MiB"


def _nvidia_smi_uuids() -> list[str] | None:
    """UUIDs of the GPUs ``nvidia-smi -L`` lists (its MIG lines left out); None without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=False).stdout
    uuids = []
    for line in out.splitlines():
        if line.startswith("GPU "):
            uuids.append(line.rsplit("UUID:", 1)[-1].strip(" )") if "UUID:" in line else "")
    return uuids


class Holder:
    """The child process that holds GPU memory; its first stdout line says READY or ERROR."""

    def __init__(self, uuid: str, nbytes: int, method: str):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=uuid, CUDA_DEVICE_ORDER="PCI_BUS_ID")
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 -- closed by close()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child", str(nbytes), method],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())
        self._lines.put("EOF")

    def ready(self, timeout_s: float) -> str:
        """The child's allocation method; raises RuntimeError when it failed or took too long."""
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"the child did not allocate within {timeout_s:.0f}s") from None
        if line.startswith("READY "):
            return line.split(" ", 1)[1]
        self.stderr.seek(0)
        tail = self.stderr.read()[-800:].strip()
        raise RuntimeError(f"the child could not allocate: {line.removeprefix('ERROR ')} {tail}".strip())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        self.stderr.close()


def run_checks() -> int:
    os.environ.pop("AUTOTUNE_FAKE_GPUS", None)  # pretend GPUs would replace NVML
    sys.path.insert(0, ROOT)
    print(f"gpu-acceptance: Python {sys.version.split()[0]} at {sys.executable}", flush=True)
    try:
        import pynvml
    except ImportError as err:
        print(f"error: this Python lacks nvidia-ml-py ({err}); set PYTHON to autotune's venv Python", flush=True)
        return 2
    try:
        from autotune.errors import TeardownError
        from autotune.runtime import gpu
    except ImportError as err:
        print(f"error: cannot import autotune.runtime.gpu ({err}); set PYTHON to autotune's venv Python", flush=True)
        return 2

    results = Results()
    try:
        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
        reason = f"NVML lists {count} devices"
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
    except pynvml.NVMLError as err:
        count, reason, driver = 0, f"NVML unavailable: {err}", "?"
    if count == 0:
        if os.path.exists("/dev/nvidia0"):  # a GPU is there, yet autotune would see none
            results.add("FAIL", "list_gpus", f"/dev/nvidia0 exists but {reason}")
            for name in CHECKS[1:]:
                results.add("SKIP", name, "NVML sees no GPU")
            return results.summary()
        print(f"no GPU ({reason}); nothing to check", flush=True)
        for name in CHECKS:
            results.add("SKIP", name, "no GPU")
        return results.summary()
    print(f"gpu-acceptance: NVIDIA driver {driver}, pynvml from {os.path.dirname(pynvml.__file__)}", flush=True)

    # (1) list_gpus: every device with its name and memory, as many as nvidia-smi lists.
    gpus = gpu.list_gpus()
    for g in gpus:
        _note(f"GPU {g.index}: {g.name}, {g.memory_total / GIB:.1f} GiB total, {_mib(g.memory_used)} used, {g.uuid}")
    problems = []
    if len(gpus) != count:
        problems.append(f"{len(gpus)} listed but NVML counts {count}")
    for g in gpus:
        if not g.name or not g.uuid or g.memory_total <= 0 or not 0 <= g.memory_used <= g.memory_total:
            problems.append(f"GPU {g.index} looks wrong: {g}")
    smi = _nvidia_smi_uuids()
    if smi is None:
        versus = "nvidia-smi not found, count not compared"
    elif len(smi) != len(gpus):
        problems.append(f"nvidia-smi -L lists {len(smi)} GPUs, list_gpus {len(gpus)}")
        versus = ""
    elif all(smi) and sorted(smi) != sorted(g.uuid for g in gpus):
        problems.append(f"UUIDs differ from nvidia-smi -L: {smi}")
        versus = ""
    else:
        versus = f"same as nvidia-smi -L ({len(smi)})"
    if problems:
        results.add("FAIL", "list_gpus", "; ".join(problems))
    else:
        results.add("PASS", "list_gpus", f"{len(gpus)} GPU(s), {versus}")

    # (2) a child takes memory; autotune must see it, by PID where NVML reports our PIDs.
    nbytes = int(float(os.environ.get("GPU_ACCEPTANCE_GIB", "1")) * GIB)
    method = os.environ.get("GPU_ACCEPTANCE_ALLOC", "auto")
    if method not in ("auto", *ALLOCATORS):
        print(f"error: GPU_ACCEPTANCE_ALLOC={method!r} is not auto, ctypes, torch or cupy", flush=True)
        return 2
    target = max(gpus, key=lambda g: g.memory_total - g.memory_used)
    if target.memory_total - target.memory_used < nbytes + GIB:
        for name in CHECKS[1:]:
            results.add("SKIP", name, f"no GPU has {_mib(nbytes + GIB)} free")
        return results.summary()
    before_used = target.memory_used
    before_pids = set(gpu.memory_used_by_pid())
    _note(f"GPU {target.index} before: {_mib(before_used)} used; NVML PIDs holding memory: {sorted(before_pids)}")
    holder = Holder(target.uuid, nbytes, method)
    try:
        return _with_child(results, gpu, TeardownError, holder, target, nbytes, before_used, before_pids)
    finally:
        holder.close()


def _with_child(
    results: Results,
    gpu: Any,
    teardown_error: type[Exception],
    holder: Holder,
    target: Any,
    nbytes: int,
    before_used: int,
    before_pids: set[int],
) -> int:
    pid = holder.proc.pid
    try:
        how = holder.ready(READY_TIMEOUT_S)
    except RuntimeError as err:
        results.add("FAIL", "memory_used_by_pid", f"GPU {target.index}: {err}")
        for name in CHECKS[2:]:
            results.add("SKIP", name, "no child holds memory")
        return results.summary()
    _note(f"child PID {pid} took {_mib(nbytes)} on GPU {target.index} through {how}")

    # Wait for NVML to show the allocation, by the child's PID if it ever shows up there.
    seen_by = None  # "pid" or "device"
    watch_pid = pid  # the PID to hand to wait_pids_released: NVML's, when it reports host PIDs
    deadline = time.monotonic() + SEEN_TIMEOUT_S
    while True:
        by_pid = gpu.memory_used_by_pid()
        growth = gpu.list_gpus()[target.index].memory_used - before_used
        if by_pid.get(pid, 0) >= SEEN_FRACTION * nbytes:
            seen_by = "pid"
            break
        if time.monotonic() >= deadline:
            if growth >= SEEN_FRACTION * nbytes:
                seen_by = "device"
            break
        time.sleep(0.2)
    new_pids = {p: used for p, used in by_pid.items() if p not in before_pids}
    if seen_by == "pid":
        results.add(
            "PASS",
            "memory_used_by_pid",
            f"PID {pid} holds {_mib(by_pid[pid])} (allocated {_mib(nbytes)}, the rest is its CUDA context); "
            f"GPU {target.index} used grew by {_mib(growth)}; checked by PID",
        )
    elif seen_by == "device":
        if len(new_pids) == 1 and next(iter(new_pids.values())) >= SEEN_FRACTION * nbytes:
            watch_pid = next(iter(new_pids))  # most likely the child, under its host PID
        if by_pid:
            listed = f"NVML lists PIDs {sorted(by_pid)}, not the child's PID {pid} (a PID namespace: host PIDs)"
        else:
            listed = f"NVML attributes memory to no process at all (child PID {pid})"
        results.add(
            "PASS",
            "memory_used_by_pid",
            f"GPU {target.index} used grew by {_mib(growth)} (allocated {_mib(nbytes)}); checked by device "
            f"memory growth: {listed}",
        )
    else:
        results.add(
            "FAIL",
            "memory_used_by_pid",
            f"after {SEEN_TIMEOUT_S:.0f}s NVML shows PID {pid} with {_mib(by_pid.get(pid, 0))} and "
            f"GPU {target.index} grown by only {_mib(growth)} (allocated {_mib(nbytes)}); NVML PIDs: {by_pid}",
        )
        for name in CHECKS[2:]:
            results.add("SKIP", name, "the allocation was not seen")
        return results.summary()

    limits = {target.index: before_used + RELEASE_TOLERANCE}
    # While the child lives, both waits must time out with TeardownError, not return.
    pid_visible = watch_pid in gpu.memory_used_by_pid()
    holds_pid = holds_mem = "not checked"
    if pid_visible:
        try:
            gpu.wait_pids_released([watch_pid], timeout_s=1.0, poll_s=0.2)
            holds_pid = "RETURNED while the child still held memory"
        except teardown_error as err:
            holds_pid = "ok" if str(watch_pid) in str(err) else f"raised without naming the PID: {err}"
    try:
        gpu.wait_memory_at_most(limits, timeout_s=1.0, poll_s=0.2)
        holds_mem = "RETURNED while the child still held memory"
    except teardown_error as err:
        holds_mem = "ok" if f"GPU {target.index}" in str(err) else f"raised without naming the GPU: {err}"

    killed = time.monotonic()
    holder.kill()

    # (3) after SIGKILL: wait_pids_released returns once the PID holds nothing.
    if not pid_visible:
        gpu.wait_pids_released([pid], timeout_s=RELEASE_TIMEOUT_S, poll_s=0.05)
        results.add(
            "SKIP",
            "wait_pids_released",
            f"NVML does not attribute memory to any PID of the child here, so it returned at once "
            f"({time.monotonic() - killed:.2f}s); release checked by wait_memory_at_most below",
        )
    else:
        try:
            gpu.wait_pids_released([watch_pid], timeout_s=RELEASE_TIMEOUT_S, poll_s=0.05)
        except teardown_error as err:
            results.add("FAIL", "wait_pids_released", f"{err}")
        else:
            took = time.monotonic() - killed
            left = gpu.list_gpus()[target.index].memory_used - before_used
            still = gpu.memory_used_by_pid().get(watch_pid)
            which = "the child's PID" if watch_pid == pid else f"NVML's PID {watch_pid} for child {pid}"
            detail = (
                f"returned {took:.2f}s after SIGKILL ({which}); device used then {_mib(left)} above the "
                f"baseline; before the kill it raised TeardownError after 1s: {holds_pid}"
            )
            bad = still is not None or holds_pid != "ok"
            results.add("FAIL" if bad else "PASS", "wait_pids_released", detail)

    # ... and wait_memory_at_most returns once the device is back at its baseline.
    try:
        gpu.wait_memory_at_most(limits, timeout_s=RELEASE_TIMEOUT_S, poll_s=0.05)
    except teardown_error as err:
        results.add("FAIL", "wait_memory_at_most", f"{err}")
    else:
        took = time.monotonic() - killed
        now = gpu.list_gpus()[target.index].memory_used
        detail = (
            f"GPU {target.index} back to {_mib(now)} used (baseline {_mib(before_used)}, limit +"
            f"{_mib(RELEASE_TOLERANCE)}) {took:.2f}s after SIGKILL; before the kill it raised TeardownError "
            f"after 1s: {holds_mem}"
        )
        results.add("PASS" if holds_mem == "ok" else "FAIL", "wait_memory_at_most", detail)
    return results.summary()


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "--child":
        return child(int(argv[1]), argv[2])
    return run_checks()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
