"""Profiling helpers of the trainers: GPU kernel time by family (--profile-step), Python's garbage-collector
pauses, the caching allocator's retries, and CUDA contexts held on GPUs other than a rank's own."""
import ctypes
import gc
import time

import torch


def allocator_retries(device):
    """The caching allocator's count of allocations that failed once and were retried after it released its cache
    (0 off CUDA): each such release synchronises the host (with expandable segments, on every segment's stream)."""
    return torch.cuda.memory_stats(device).get("num_alloc_retries", 0) if device.type == "cuda" else 0


def other_gpus_with_context(device):
    """The CUDA devices other than `device` on which this process holds a primary context ([] off CUDA or
    where the driver cannot be asked). A rank should touch its own GPU only: a context elsewhere costs about
    0.5 GiB of that GPU per process (a plan made on a thread whose current device was 0 once did)."""
    if device.type != "cuda":
        return []
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        if index == device.index:
            continue
        handle, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        if (driver.cuDeviceGet(ctypes.byref(handle), index) == 0 and
                driver.cuDevicePrimaryCtxGetState(handle, ctypes.byref(flags), ctypes.byref(active)) == 0 and
                active.value):
            found.append(index)
    return found


KERNEL_FAMILIES = (  # first match wins; names as the CUDA profiler reports them
    ("attention", ("attention_fwd", "attention_bwd", "bwd_preprocess", "fwd_combine", "flash", "fmha", "cudnn")),
    ("cad data path", ("copy_row_ranges", "copy_row_slices", "copy_strided_rows", "sum_rows", "sum_partials",
                       "fill_uncovered", "f32_to_bf16")),
    ("nccl", ("nccl",)),
    ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "sm90_", "sm80_")),
)


def kernel_family(name):
    lowered = name.lower()
    for family, needles in KERNEL_FAMILIES:
        if any(n in lowered for n in needles):
            return family
    return "other"


def profile_summary(profiler, top=25):
    """GPU time of the profiled step by kernel family and the `top` kernels (ms), from torch.profiler's events.
    The sum is kernel time, not wall time: kernels on different streams (communication, ping-pong) overlap."""
    kernels = {}
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time_total > 0:
            entry = kernels.setdefault(event.name, [0, 0.0])
            entry[0] += 1
            entry[1] += event.device_time_total / 1e3
    families = {}
    for name, (_, ms) in kernels.items():
        family = kernel_family(name)
        families[family] = families.get(family, 0.0) + ms
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]
    return {"families_ms": families,
            "kernels": [{"name": n[:160], "calls": c, "ms": round(ms, 3), "family": kernel_family(n)}
                        for n, (c, ms) in ranked]}


class GcPauses:
    """Python's garbage-collector pauses on this rank (gc.callbacks): milliseconds and generation-2 collections
    since the last take(). On 4 GPUs CAD's ranks reached the first layer's plan make up to 180 ms apart, a
    different rank each step (bench/results/multi_gpu_h200x4_2026-11-26_f1637cc); a collection over the model's and torch's heap is a
    candidate, and this says whether one ran in that step."""

    def __init__(self):
        self.ms, self.full, self._start = 0.0, 0, None
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.ms += (time.perf_counter() - self._start) * 1e3
            self.full += 1 if info.get("generation") == 2 else 0
            self._start = None

    def take(self):
        taken = (self.ms, self.full)
        self.ms, self.full = 0.0, 0
        return taken

    def close(self):
        gc.callbacks.remove(self._callback)
