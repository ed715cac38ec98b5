"""cad.varlen.varlen_attn: torch.nn.attention.varlen.varlen_attn's signature (plus plan) on CAD, one process,
against torch sdpa per document; local (plan=None) and CAD over a world of one."""
import inspect
import os
import subprocess
import sys

import pytest
import torch

import cad
from cad.varlen import AuxRequest, varlen_attn
from reference import random_batch, sdpa_varlen

CAUSAL, FULL = (-1, 0), (-1, -1)
CASES = [  # (document lengths, Hq, Hkv, D)
    ([7, 1, 13, 4], 4, 4, 16),      # odd lengths and a one-token document
    ([33, 17, 9], 8, 2, 32),        # GQA
    ([24], 4, 1, 16),               # GQA, one KV head
]

try:
    import torch.nn.attention.varlen as torch_varlen
except ImportError:
    torch_varlen = None


def _grads(fn, q, k, v, d_o):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    o.backward(d_o)
    return o.detach(), q.grad, k.grad, v.grad


def _longest(cu):
    return int((cu[1:] - cu[:-1]).max())


def _assert_matches(got, want):
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5, msg=lambda m: f"{name}: {m}")


# ---- the signature ---------------------------------------------------------------------------------------------
@pytest.mark.skipif(torch_varlen is None, reason=f"torch {torch.__version__} has no torch.nn.attention.varlen")
def test_signature_is_torchs_plus_plan():
    ours = inspect.signature(varlen_attn).parameters
    theirs = inspect.signature(torch_varlen.varlen_attn).parameters
    # Every parameter of the installed torch's, in its order, of its kind and default.
    assert [n for n in ours if n in theirs] == list(theirs)
    for name, p in theirs.items():
        assert (ours[name].kind, ours[name].default) == (p.kind, p.default), name
    # Ours beyond torch's: plan, and the keywords that a newer torch (2.15) has and an older one (2.11) lacks.
    extra = [n for n in ours if n not in theirs]
    assert set(extra) <= {"plan", "enable_gqa", "seqused_k", "block_table", "num_splits"}, extra
    assert "plan" in extra and ours["plan"].kind is inspect.Parameter.KEYWORD_ONLY and ours["plan"].default is None
    assert list(ours)[-1] == "plan"


def test_signature_without_torch_varlen():
    # The torch 2.11 names at least, and a module that still imports where torch has no varlen (degraded: its
    # own AuxRequest). Run in a fresh interpreter with torch.nn.attention.varlen made unimportable.
    names = list(inspect.signature(varlen_attn).parameters)
    assert names[:7] == ["query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k"]
    assert {"return_aux", "scale", "window_size", "plan"} <= set(names[7:])
    code = ("import sys; sys.modules['torch.nn.attention.varlen'] = None\n"
            "import torch, cad\n"
            "from cad.varlen import AuxRequest, varlen_attn, torch_varlen_attn\n"
            "assert torch_varlen_attn() is None and AuxRequest().lse is False\n"
            "cu = torch.tensor([0, 3, 8], dtype=torch.int32); q = torch.randn(8, 2, 8)\n"
            "o, lse = varlen_attn(q, q, q, cu, cu, 5, 5, return_aux=AuxRequest(lse=True))\n"
            "assert o.shape == (8, 2, 8) and lse.shape == (2, 8)\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ.copy(), timeout=120)


@pytest.mark.skipif(torch_varlen is None, reason=f"torch {torch.__version__} has no torch.nn.attention.varlen")
def test_aux_request_is_torchs():
    assert AuxRequest is torch_varlen.AuxRequest


# ---- results ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [CAUSAL, FULL], ids=["causal", "full"])
@pytest.mark.parametrize("lengths,hq,hkv,d", CASES)
def test_local_forward_backward_match_sdpa(lengths, hq, hkv, d, window):
    q, k, v, cu = random_batch(lengths, hq, hkv, d)
    d_o = torch.randn_like(q)
    m = _longest(cu)
    got = _grads(lambda q, k, v: varlen_attn(q, k, v, cu, cu, m, m, window_size=window), q, k, v, d_o)
    want = _grads(lambda q, k, v: sdpa_varlen(q, k, v, cu, window == CAUSAL), q, k, v, d_o)
    _assert_matches(got, want)


def test_default_window_is_full_attention_and_lists_are_taken():
    q, k, v, cu = random_batch([6, 10], 2, 2, 16)
    torch.testing.assert_close(varlen_attn(q, k, v, cu, cu, 10, 10), sdpa_varlen(q, k, v, cu, False),
                               rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(varlen_attn(q, k, v, cu, cu, 10, 10, window_size=[-1, 0]),
                               sdpa_varlen(q, k, v, cu, True), rtol=1e-5, atol=2e-5)


def test_scale():
    q, k, v, cu = random_batch([5, 11], 2, 2, 8)
    torch.testing.assert_close(varlen_attn(q, k, v, cu, cu, 11, 11, scale=0.3, window_size=CAUSAL),
                               sdpa_varlen(q, k, v, cu, True, scale=0.3), rtol=1e-5, atol=2e-5)


def test_gqa_is_not_expanded(monkeypatch):
    seen = []
    inner = cad.varlen._cad_varlen_attn

    def spy(q, k, v, *args, **kwargs):
        seen.append((tuple(k.shape), tuple(v.shape), k.data_ptr()))
        return inner(q, k, v, *args, **kwargs)

    monkeypatch.setattr(cad.varlen, "_cad_varlen_attn", spy)
    q, k, v, cu = random_batch([9, 7], 8, 2, 16)
    o = varlen_attn(q, k, v, cu, cu, 9, 9, window_size=CAUSAL, enable_gqa=True)
    assert seen == [((16, 2, 16), (16, 2, 16), k.data_ptr())]
    torch.testing.assert_close(o, sdpa_varlen(q, k, v, cu, True), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("window", [CAUSAL, FULL], ids=["causal", "full"])
def test_return_aux_lse(window):
    q, k, v, cu = random_batch([5, 11], 4, 2, 8)
    o, lse = varlen_attn(q, k, v, cu, cu, 11, 11, window_size=window, scale=0.5, return_aux=AuxRequest(lse=True))
    want_o, want_lse = cad.varlen_attn(q, k, v, cu, causal=window == CAUSAL, softmax_scale=0.5, return_lse=True)
    assert lse.shape == (4, 16) and lse.dtype == torch.float32  # [Hq, Tq], as PyTorch's
    torch.testing.assert_close(o, want_o)
    torch.testing.assert_close(lse, want_lse)
    if window == FULL:  # the natural log of the sum of exp(scores) over the document
        kk = k.repeat_interleave(2, dim=1)
        for a, b in ((0, 5), (5, 16)):
            scores = torch.einsum("qhd,khd->hqk", q[a:b], kk[a:b]) * 0.5
            torch.testing.assert_close(lse[:, a:b], torch.logsumexp(scores, dim=-1), rtol=1e-5, atol=1e-5)
    for aux in (None, AuxRequest(), AuxRequest(lse=False)):
        assert isinstance(varlen_attn(q, k, v, cu, cu, 11, 11, window_size=window, return_aux=aux), torch.Tensor)


def test_equal_offsets_in_another_tensor_are_accepted():
    q, k, v, cu = random_batch([6, 10], 2, 2, 16)
    torch.testing.assert_close(varlen_attn(q, k, v, cu, cu.clone().long(), 10, 10, window_size=CAUSAL),
                               sdpa_varlen(q, k, v, cu, True), rtol=1e-5, atol=2e-5)


def test_num_splits_is_accepted():
    q, k, v, cu = random_batch([6, 10], 2, 2, 16)
    torch.testing.assert_close(varlen_attn(q, k, v, cu, cu, 10, 10, num_splits=1), sdpa_varlen(q, k, v, cu, False),
                               rtol=1e-5, atol=2e-5)


# ---- with a plan (CAD over a world of one) ---------------------------------------------------------------------
@pytest.mark.parametrize("window", [CAUSAL, FULL], ids=["causal", "full"])
@pytest.mark.parametrize("lengths,hq,hkv,d", CASES[:2])
def test_plan_forward_backward_match_sdpa(lengths, hq, hkv, d, window):
    q, k, v, cu = random_batch(lengths, hq, hkv, d, seed=1)
    d_o = torch.randn_like(q)
    m = _longest(cu)
    plan = cad.plan(cu, causal=window == CAUSAL)
    got = _grads(lambda q, k, v: varlen_attn(q, k, v, cu, cu, m, m, window_size=window, plan=plan), q, k, v, d_o)
    want = _grads(lambda q, k, v: sdpa_varlen(q, k, v, cu, window == CAUSAL), q, k, v, d_o)
    _assert_matches(got, want)
    o, lse = varlen_attn(q, k, v, cu, cu, m, m, window_size=window, plan=plan, return_aux=AuxRequest(lse=True))
    _, want_lse = cad.varlen_attn(q, k, v, cu, causal=window == CAUSAL, return_lse=True)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)


def test_plan_from_pieces():
    q, k, v, cu = random_batch([6, 10], 2, 2, 16)
    plan = cad.plan_pieces([(0, 6, 0, 6), (1, 10, 0, 10)])
    torch.testing.assert_close(varlen_attn(q, k, v, cu, cu, 10, 10, window_size=CAUSAL, plan=plan),
                               sdpa_varlen(q, k, v, cu, True), rtol=1e-5, atol=2e-5)


def test_plan_of_other_causality_is_refused():
    q, k, v, cu = random_batch([6, 10], 2, 2, 16)
    with pytest.raises(cad.CadError, match=r"window_size.*causal=True"):
        varlen_attn(q, k, v, cu, cu, 10, 10, window_size=FULL, plan=cad.plan(cu))


def test_torch_compile_traces_it():
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    q, k, v, cu = random_batch([6, 10], 2, 2, 16)
    local = torch.compile(lambda q, k, v: varlen_attn(q, k, v, cu, cu, 10, 10, window_size=CAUSAL) * 2,
                          backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(local(q, k, v), sdpa_varlen(q, k, v, cu, True) * 2, rtol=1e-5, atol=2e-5)
    planned = torch.compile(lambda q, k, v, cu, plan: varlen_attn(q, k, v, cu, cu, 32, 32, window_size=CAUSAL,
                                                                  plan=plan) * 2, backend="aot_eager")
    for i in range(3):  # a plan per micro-batch, autograd through it
        q, k, v, cu = random_batch([5 + i, 7], 2, 2, 16, seed=i)
        q.requires_grad_()
        o = planned(q, k, v, cu, cad.plan(cu))
        o.sum().backward()
        torch.testing.assert_close(o, sdpa_varlen(q, k, v, cu, True) * 2, rtol=1e-5, atol=2e-5)
        assert q.grad is not None


# ---- sliding windows ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [(0, 0), (4, 0), (30, 0), (3, 5), (-1, 4), (6, -1)])
def test_sliding_windows_match_masked_sdpa(window):
    # (left, 0) causal, any other right non-causal: sdpa with the band mask [i - left, i + right] per document.
    from reference import sdpa_varlen_window
    lengths = [7, 1, 33, 12]
    q, k, v, cu = random_batch(lengths, 4, 2, 16, seed=9)
    d_o = torch.randn_like(q)
    m = max(lengths)
    causal = window[1] == 0
    got = _grads(lambda q, k, v: varlen_attn(q, k, v, cu, cu, m, m, window_size=window), q, k, v, d_o)
    want = _grads(lambda q, k, v: sdpa_varlen_window(q, k, v, cu, causal, window), q, k, v, d_o)
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5, msg=lambda msg: f"{name}: {msg}")


def test_a_windowed_plan_runs_its_window_and_refuses_another():
    lengths = [20, 9, 3]
    q, k, v, cu = random_batch(lengths, 2, 2, 16, seed=4)
    plan = cad.plan(cu, window_size=(5, 0))
    from reference import sdpa_varlen_window
    torch.testing.assert_close(varlen_attn(q, k, v, cu, cu, 20, 20, window_size=(5, 0), plan=plan),
                               sdpa_varlen_window(q, k, v, cu, True, (5, 0)), rtol=1e-5, atol=2e-5)
    with pytest.raises(cad.CadError, match="window_left"):
        varlen_attn(q, k, v, cu, cu, 20, 20, window_size=CAUSAL, plan=plan)


# ---- refusals --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,expected", [
    (dict(window_size=(-2, 0)), r"window_size\[0\] \(left\)"),
    (dict(window_size=(3, -4)), r"window_size\[1\] \(right\)"),
    (dict(window_size=(2.5, 0)), "window_size must be a pair"),
    (dict(window_size=(-1, 0, 0)), "window_size must be a pair"),
    (dict(scale=0.0), "scale must be greater than 0"),
    (dict(scale=float("nan")), "scale must be greater than 0"),
    (dict(seqused_k=torch.tensor([6, 10], dtype=torch.int32)), "seqused_k"),
    (dict(block_table=torch.zeros(2, 1, dtype=torch.int32)), "block_table"),
    (dict(plan="a plan"), "plan must be a cad.Plan"),
])
def test_refused_keywords(kwargs, expected):
    q, k, v, cu = random_batch([6, 10], 2, 2, 16)
    with pytest.raises(cad.CadError, match=expected):
        varlen_attn(q, k, v, cu, cu, 10, 10, **kwargs)


def test_different_cu_seq_q_and_cu_seq_k_are_refused():
    q, k, v, cu = random_batch([6, 10], 2, 2, 16)
    other = torch.tensor([0, 8, 16], dtype=torch.int32)
    with pytest.raises(cad.CadError, match=r"cu_seq_q \[0, 6, 16\] and cu_seq_k \[0, 8, 16\] differ"):
        varlen_attn(q, k, v, cu, other, 10, 10)
    with pytest.raises(cad.CadError, match="cu_seq_k must be a 1-D int32 tensor"):
        varlen_attn(q, k, v, cu, None, 10, 10)


@pytest.mark.parametrize("max_q,max_k,expected", [
    (9, 10, r"max_q=9 is below the longest document \(10 tokens\)"),
    (10, 3, "max_k=3 is below"),
    (10.0, 10, "max_q must be an int"),
])
def test_max_lengths_are_checked_loosely(max_q, max_k, expected):
    q, k, v, cu = random_batch([6, 10], 2, 2, 16)
    with pytest.raises(cad.CadError, match=expected):
        varlen_attn(q, k, v, cu, cu, max_q, max_k)
    varlen_attn(q, k, v, cu, cu, 4096, 4096)  # larger than needed: fine, as in PyTorch


def test_bad_gqa_is_refused():
    q, k, v, cu = random_batch([6, 10], 6, 4, 16)
    with pytest.raises(cad.CadError):
        varlen_attn(q, k, v, cu, cu, 10, 10)


# ---- PyTorch's own function, where it can run (CUDA and a CUDA build of the package) ----------------------------
@pytest.mark.skipif(torch_varlen is None or not torch.cuda.is_available(),
                    reason="needs torch.nn.attention.varlen and a CUDA device")
@pytest.mark.parametrize("window", [CAUSAL, FULL], ids=["causal", "full"])
def test_same_results_as_torch_on_cuda(window):
    q, k, v, cu = (t.cuda() for t in random_batch([100, 37, 250], 8, 2, 64, dtype=torch.bfloat16))
    ours = varlen_attn(q, k, v, cu, cu, 250, 250, window_size=window, return_aux=AuxRequest(lse=True))
    kwargs = {"enable_gqa": True} if "enable_gqa" in inspect.signature(torch_varlen.varlen_attn).parameters else {}
    theirs = torch_varlen.varlen_attn(q, k, v, cu, cu, 250, 250, window_size=window, return_aux=AuxRequest(lse=True),
                                      **kwargs)
    torch.testing.assert_close(ours[0].float(), theirs[0].float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-2, atol=1e-2)
