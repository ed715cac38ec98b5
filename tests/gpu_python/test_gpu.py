"""The Python package on one GPU (run by tests/gpu_python/run.sh, not by CI): bf16 on the CUDA stack.
  - local varlen_attn (the "cuda" backend) against fp32 sdpa per document, forward and backward, D 64 and 128;
    with sliding windows too (causal and not) against sdpa with the window mask;
  - CAD with processes sharing the GPU: 2 and 3 ranks over the "host" communicator (gloo, host-staged), and 2
    with a causal window (a windowed plan);
  - CAD over NCCL with one rank (bootstrapped through the package's callback, no MPI);
  - torch.compile through the custom op on CUDA; bad input raises CadError."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import harness  # noqa: E402
from reference import random_batch, sdpa_varlen, sdpa_varlen_window  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
LENGTHS = [[700, 33, 1, 290], [64, 128, 65, 1000], [1500, 3]]
TOL = dict(rtol=2e-2, atol=2e-2)


def _fwd_bwd(fn, q, k, v, d_o):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = fn(*leaves)
    o.backward(d_o)
    return [o.detach().float()] + [t.grad.float() for t in leaves]


def _compare(q, k, v, cu, causal, plan=None, tag="", window=(-1, -1)):
    import cad
    dev = torch.device("cuda", torch.cuda.current_device())
    qb, kb, vb = (t.to(dev, torch.bfloat16) for t in (q, k, v))
    d_o = torch.randn(q.shape, generator=torch.Generator().manual_seed(7)).to(dev, torch.bfloat16)
    got = _fwd_bwd(lambda a, b, c: cad.varlen_attn(a, b, c, cu.to(dev), plan=plan, causal=causal,
                                                   window_size=window), qb, kb, vb, d_o)
    if window == (-1, -1):
        ref = lambda a, b, c: sdpa_varlen(a, b, c, cu, causal)  # noqa: E731
    else:
        ref = lambda a, b, c: sdpa_varlen_window(a, b, c, cu, causal, window)  # noqa: E731
    want = _fwd_bwd(ref, qb.float().cpu(), kb.float().cpu(), vb.float().cpu(), d_o.float().cpu())
    # A window of one key (left 0, and right 0 or causal): every softmax has a single entry, so dq and dk are
    # exactly zero (sdpa's are); the kernel's are rounding noise (~2e-6), held to an absolute bound (2e-4)
    # instead of an error relative to an all-zero reference.
    one_key = window[0] == 0 and (causal or window[1] == 0)
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        floor = 1e-2 if one_key and name in ("dq", "dk") else 1e-6
        err = ((a.cpu() - b).abs().max() / b.abs().max().clamp_min(floor)).item()
        print(f"{tag} {name}: max error relative to max |ref| {err:.2e}")
        assert err < 2e-2, f"{tag} {name}: {err}"


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
def test_local_bf16_matches_sdpa(head_dim, causal):
    q, k, v, cu = random_batch(LENGTHS[0], 8, 2, head_dim)
    _compare(q, k, v, cu, causal, tag=f"local D={head_dim} causal={causal}")


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal,window", [(True, (0, 0)), (True, (100, 0)), (True, (900, -1)), (False, (30, 5)),
                                           (False, (-1, 64)), (False, (0, 0))])
def test_local_bf16_window_matches_sdpa(head_dim, causal, window):
    q, k, v, cu = random_batch(LENGTHS[0], 8, 2, head_dim)
    _compare(q, k, v, cu, causal, window=window, tag=f"local D={head_dim} causal={causal} window={window}")


def _cad_rank(rank, world, communicator, head_dim, window=(-1, -1)):
    import cad
    torch.cuda.set_device(0)  # every rank shares the one GPU
    cad.init(communicator=communicator, timeout_ms=60000)
    q, k, v, cu = random_batch(LENGTHS[rank], 8, 2, head_dim, seed=rank)
    plan = cad.plan(cu.cuda(), window_size=window)
    for causal in (True,):
        _compare(q, k, v, cu, causal, plan=plan, tag=f"rank {rank}/{world} {communicator} window={window}",
                 window=window)
    print(f"rank {rank} plan stats: imbalance {plan.stats['imbalance']:.3f}")


@pytest.mark.parametrize("world", [2, 3])
def test_cad_host_staged_processes_share_the_gpu(world):
    harness.run(world, _cad_rank, "host", 128, timeout_s=300)


def test_cad_window_host_staged_two_ranks():
    harness.run(2, _cad_rank, "host", 128, (200, 0), timeout_s=300)


def test_cad_nccl_one_rank():
    harness.run(1, _cad_rank, "nccl", 128, timeout_s=300)


def test_torch_compile_on_cuda():
    import cad
    q, k, v, cu = random_batch([100, 28], 4, 4, 64)
    q, k, v, cu = (t.cuda() for t in (q.bfloat16(), k.bfloat16(), v.bfloat16(), cu))
    compiled = torch.compile(lambda q, k, v: cad.varlen_attn(q, k, v, cu) + 1, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), cad.varlen_attn(q, k, v, cu) + 1)


def test_bad_input_on_cuda():
    import cad
    q, k, v, cu = random_batch([10, 6], 4, 4, 64)
    q, k, v, cu = (t.cuda() for t in (q.bfloat16(), k.bfloat16(), v.bfloat16(), cu))
    with pytest.raises(cad.CadError, match="head|dim|D"):
        cad.varlen_attn(q[..., :48].contiguous(), k[..., :48].contiguous(), v[..., :48].contiguous(), cu)
    with pytest.raises(cad.CadError, match="dtype"):
        cad.varlen_attn(q.float(), k.float(), v.float(), cu)
