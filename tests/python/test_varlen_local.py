"""cad.varlen_attn without a plan (the local backend) against torch sdpa per document, forward and backward."""
import pytest
import torch

import cad
from reference import random_batch, sdpa_varlen

CASES = [  # (document lengths, Hq, Hkv, D)
    ([7, 1, 13, 4], 4, 4, 16),      # odd lengths and a one-token document
    ([33, 17, 9], 8, 2, 32),        # GQA
    ([64], 2, 1, 64),
]


def _grads(fn, q, k, v, d_o):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    o.backward(d_o)
    return o.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths,hq,hkv,d", CASES)
def test_forward_backward_match_sdpa(lengths, hq, hkv, d, causal):
    q, k, v, cu = random_batch(lengths, hq, hkv, d)
    d_o = torch.randn_like(q)
    got = _grads(lambda q, k, v: cad.varlen_attn(q, k, v, cu, causal=causal), q, k, v, d_o)
    want = _grads(lambda q, k, v: sdpa_varlen(q, k, v, cu, causal), q, k, v, d_o)
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5, msg=lambda m: f"{name}: {m}")


def test_lse_is_logsumexp_of_scores():
    q, k, v, cu = random_batch([5, 11], 2, 2, 8)
    _, lse = cad.varlen_attn(q, k, v, cu, causal=False, softmax_scale=0.5, return_lse=True)
    assert lse.shape == (2, 16) and lse.dtype == torch.float32
    for a, b in ((0, 5), (5, 16)):
        scores = torch.einsum("qhd,khd->hqk", q[a:b], k[a:b]) * 0.5
        torch.testing.assert_close(lse[:, a:b], torch.logsumexp(scores, dim=-1), rtol=1e-5, atol=1e-5)


def test_bf16_on_cpu_within_tolerance():
    q, k, v, cu = random_batch([9, 20], 4, 2, 32)
    got = cad.varlen_attn(q.bfloat16(), k.bfloat16(), v.bfloat16(), cu)
    want = sdpa_varlen(q, k, v, cu, True)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def test_torch_compile_traces_the_custom_op():
    q, k, v, cu = random_batch([6, 10], 2, 2, 16)
    compiled = torch.compile(lambda q, k, v: cad.varlen_attn(q, k, v, cu) * 2, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), sdpa_varlen(q, k, v, cu, True) * 2, rtol=1e-5, atol=2e-5)


def test_opcheck_fake_implementation():
    q, k, v, cu = random_batch([3, 4], 2, 1, 16)
    torch.library.opcheck(torch.ops.cad.varlen_fwd.default, (q, k, v, cu, -1, -1, True, 0.25, False, -1, -1, -1),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("bad,expected", [
    (lambda q, k, v, cu: (q.double(), k.double(), v.double(), cu), "dtype"),
    (lambda q, k, v, cu: (q.transpose(0, 1).contiguous().transpose(0, 1), k, v, cu), "q"),
    (lambda q, k, v, cu: (q, k, v, torch.tensor([0, 5, 9], dtype=torch.int32)), "cu_seqlens"),
])
def test_bad_input_raises_cad_error(bad, expected):
    q, k, v, cu = random_batch([5, 7], 2, 2, 16)
    with pytest.raises(cad.CadError, match=expected):
        cad.varlen_attn(*bad(q, k, v, cu))


def test_torch_compile_with_a_new_plan_per_micro_batch():
    # One process: CAD over the "host" communicator with a world of one. A plan per micro-batch must not
    # recompile every time (the plan id turns symbolic after the first change), and autograd runs through it.
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    compiled = torch.compile(lambda q, k, v, cu, plan: cad.varlen_attn(q, k, v, cu, plan=plan) * 2,
                             backend="aot_eager")
    for i in range(4):
        q, k, v, cu = random_batch([5 + i, 7], 2, 2, 16, seed=i)
        q.requires_grad_()
        o = compiled(q, k, v, cu, cad.plan(cu))
        o.sum().backward()
        torch.testing.assert_close(o, sdpa_varlen(q, k, v, cu, True) * 2, rtol=1e-5, atol=2e-5)
        assert q.grad is not None
    assert dynamo_utils.counters["stats"]["unique_graphs"] <= 2


def test_cu_seqlens_changed_in_place_is_read_again():
    # The local path keeps each cu_seqlens tensor's segment table (one read-back per tensor, not per layer);
    # an in-place change to the tensor must not reuse the stale table.
    q, k, v, cu = random_batch([6, 10], 2, 2, 16)
    first = cad.varlen_attn(q, k, v, cu)
    torch.testing.assert_close(cad.varlen_attn(q, k, v, cu), first)
    cu[1] = 9  # documents of 9 and 7 tokens now
    torch.testing.assert_close(cad.varlen_attn(q, k, v, cu), sdpa_varlen(q, k, v, cu, True), rtol=1e-5, atol=2e-5)
