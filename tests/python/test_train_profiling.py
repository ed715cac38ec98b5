"""cad.train.profiling: kernel names by family (--profile-step's summary), the profiler summary's sums and
ranking, and the garbage collector's pauses as the step records count them."""
import gc
import types

import torch

from cad.train.profiling import GcPauses, allocator_retries, kernel_family, other_gpus_with_context, profile_summary


def test_kernel_families():
    assert kernel_family("void cad::kernels::detail::attention_bwd_sm90_ws_kernel<128, 2>(BwdParams)") == "attention"
    assert kernel_family("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert kernel_family("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == "nccl"
    assert kernel_family("void cad::kernels::copy_row_ranges_kernel(RowCopy const*, long)") == "cad data path"
    assert kernel_family("void cad::kernels::(anonymous namespace)::copy_row_slices_kernel<uint4>(...)") == \
        "cad data path"  # every call's pack and unpack
    assert kernel_family("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "gemm"
    assert kernel_family("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT") == "gemm"
    assert kernel_family("void at::native::vectorized_elementwise_kernel<4, ...>") == "other"


def _event(name, us, device=True):
    kind = torch.autograd.DeviceType.CUDA if device else torch.autograd.DeviceType.CPU
    return types.SimpleNamespace(name=name, device_type=kind, device_time_total=us)


def test_profile_summary_sums_by_family_and_ranks_kernels():
    events = [_event("ncclDevKernel_SendRecv", 3000), _event("attention_fwd_kernel", 5000),
              _event("attention_fwd_kernel", 1000), _event("sm90_xmma_gemm_bf16", 2000),
              _event("host_only_op", 9000, device=False), _event("idle_marker", 0)]
    summary = profile_summary(types.SimpleNamespace(events=lambda: events), top=2)
    assert summary["families_ms"] == {"nccl": 3.0, "attention": 6.0, "gemm": 2.0}
    assert summary["kernels"] == [{"name": "attention_fwd_kernel", "calls": 2, "ms": 6.0, "family": "attention"},
                                  {"name": "ncclDevKernel_SendRecv", "calls": 1, "ms": 3.0, "family": "nccl"}]


def test_gc_pauses_count_collections_until_taken():
    pauses = GcPauses()
    try:
        pauses.take()
        gc.collect()
        ms, full = pauses.take()
        assert ms > 0 and full == 1  # gc.collect() is a generation-2 collection
        assert pauses.take() == (0.0, 0)
    finally:
        pauses.close()
    assert pauses._callback not in gc.callbacks


def test_cpu_has_no_allocator_retries_or_stray_contexts():
    cpu = torch.device("cpu")
    assert allocator_retries(cpu) == 0 and other_gpus_with_context(cpu) == []
