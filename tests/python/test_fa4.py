"""cad.fa4: FlashAttention-4 behind cad.varlen_attn's arguments.

Everywhere: the refusals (flash_attn.cute not importable, an FA4 whose API this module does not know, a result of
another shape, no CUDA GPU, a GPU older than SM90) and the argument checks, each naming what is wrong; and the
plumbing of segments_attn (server batches: shared K/V rows gathered, Q rows reordered, uncovered rows, dK/dV
summed back) through a stand-in for FA4's function that computes attention in float64, against attention
computed segment by segment on the original rows.
On an SM90+ GPU with flash-attn-4 installed: the real kernel against the float reference (O, LSE, gradients;
GQA, D 64 and 128, causal and windowed, shared prefixes)."""
import math
import sys

import pytest
import torch

import cad
from cad import fa4


@pytest.fixture
def fresh(monkeypatch):
    """cad.fa4 with its import cache emptied (and restored after the test)."""
    saved = list(fa4._loaded)
    fa4._loaded.clear()
    yield monkeypatch
    fa4._loaded[:] = saved


def batch(lengths, hq=4, hkv=2, d=64, dtype=torch.bfloat16, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    q, k, v = (torch.randn(t, h, d, generator=g).to(dtype).to(device) for h in (hq, hkv, hkv))
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    return q, k, v, cu


def expect(match, fn, *args, status="INVALID_ARGUMENT", **kwargs):
    with pytest.raises(cad.CadError, match=match) as info:
        fn(*args, **kwargs)
    assert info.value.status == status, info.value
    return str(info.value)


# ---- refusals -------------------------------------------------------------------------------------------------
def test_not_installed_is_a_reason_naming_the_package(fresh):
    fresh.setitem(sys.modules, "flash_attn.cute", None)  # import raises ModuleNotFoundError
    ok, reason = fa4.available()
    assert not ok
    assert "flash_attn.cute is not importable" in reason and "pip install flash-attn-4" in reason


def test_not_installed_refuses_a_call_as_unavailable(fresh):
    fresh.setitem(sys.modules, "flash_attn.cute", None)
    fresh.setattr(fa4, "_device_reason", lambda device: None)  # as if on an SM90 GPU: only the import is missing
    q, k, v, cu = batch([5, 3])
    msg = expect("cad.fa4.varlen_attn: FlashAttention-4 cannot run: flash_attn.cute is not importable",
                 fa4.varlen_attn, q, k, v, cu, 5, status="UNAVAILABLE")
    assert "pip install flash-attn-4" in msg


def test_cpu_tensors_are_refused_as_not_a_cuda_gpu():
    q, k, v, cu = batch([5, 3])
    expect("cad.fa4.varlen_attn: FlashAttention-4 cannot run: the device is cpu, not a CUDA GPU", fa4.varlen_attn,
           q, k, v, cu, 5, status="UNAVAILABLE")
    expect("cad.fa4.segments_attn: FlashAttention-4 cannot run: the device is cpu", fa4.segments_attn, q, k, v,
           [(0, 5, 0, 5)], status="UNAVAILABLE")
    ok, reason = fa4.available("cpu")
    assert not ok and "not a CUDA GPU" in reason


def test_no_cuda_device(fresh):
    fresh.setattr(torch.cuda, "is_available", lambda: False)
    ok, reason = fa4.available()
    assert not ok and "no CUDA device" in reason


def test_a_gpu_older_than_sm90_is_refused(fresh):
    fresh.setattr(torch.cuda, "is_available", lambda: True)
    fresh.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    fresh.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    ok, reason = fa4.available("cuda:0")
    assert not ok
    assert "NVIDIA A100-SXM4-80GB is SM80; cad.fa4 needs SM90 or newer" in reason


def _module_with(fn):
    module = type(sys)("flash_attn.cute")
    module.flash_attn_varlen_func = fn
    return module


def test_an_fa4_without_the_keywords_is_refused_naming_them(fresh):
    def old_api(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None, causal=False):
        raise AssertionError("must not be called")
    fresh.setitem(sys.modules, "flash_attn.cute", _module_with(old_api))
    fresh.setattr(fa4, "_device_reason", lambda device: None)
    ok, reason = fa4.available()
    assert not ok
    assert "takes no window_size, return_lse" in reason and "4.0.0b releases" in reason
    q, k, v, cu = batch([4])
    expect("takes no window_size, return_lse", fa4.varlen_attn, q, k, v, cu, 4, status="UNAVAILABLE")


def test_a_module_without_the_function_is_refused(fresh):
    fresh.setitem(sys.modules, "flash_attn.cute", type(sys)("flash_attn.cute"))
    ok, reason = fa4.available()
    assert not ok and "flash_attn.cute has no flash_attn_varlen_func" in reason


@pytest.mark.parametrize("result, shown", [((1, 2, 3, 4, 5), "a tuple of 5"), ([], "a list of 0"),
                                           ("text", "str")])
def test_a_result_of_another_shape_is_refused(result, shown):
    if isinstance(result, tuple):
        result = tuple(torch.zeros(1) for _ in result)
    expect(f"returned {shown}; cad.fa4 takes out or \\(out, lse\\)", fa4._outputs, result, "cad.fa4.varlen_attn",
           status="UNIMPLEMENTED")


def test_out_and_out_lse_are_taken():
    o, lse = torch.ones(2), torch.zeros(3)
    assert fa4._outputs(o, "x")[0] is o and fa4._outputs(o, "x")[1] is None
    got = fa4._outputs((o, lse), "x")
    assert got[0] is o and got[1] is lse


# ---- argument checks (before any device or install check) -------------------------------------------------------
def test_tensor_checks_name_the_tensor():
    q, k, v, cu = batch([5, 3])
    call = fa4.varlen_attn
    expect("q must be a \\[T, H, D\\] tensor", call, q[0], k, v, cu, 5)
    expect("v must be a \\[T, H, D\\] tensor \\(THD\\), got list", call, q, k, [1], cu, 5)
    expect("k \\[8, 2, 64\\] and v \\[8, 1, 64\\] must have one shape", call, q, k, v[:, :1], cu, 5)
    expect("q has 8 tokens, k and v 7", call, q, k[:7], v[:7], cu, 5)
    expect("head dims differ: q 64, k/v 32", call, q, k[..., :32], v[..., :32], cu, 5)
    q3 = torch.cat([q, q[:, :1]], dim=1)
    expect("q's 5 heads must be a multiple of k/v's 2", call, q3, k, v, cu, 5)
    expect("q is torch.float32; FlashAttention-4 takes bfloat16 or float16", call, q.float(), k, v, cu, 5)
    expect("k is torch.float16, q torch.bfloat16: one dtype", call, q, k.half(), v, cu, 5)
    expect("v is on meta, q on cpu", call, q, k, v.to("meta"), cu, 5)


def test_window_and_scale_checks():
    q, k, v, cu = batch([5, 3])
    call = fa4.varlen_attn
    expect("window_size\\[1\\] \\(right\\) is 2, but causal=True", call, q, k, v, cu, 5, window_size=(4, 2))
    expect("window_size\\[0\\] \\(left\\) must be -1 \\(no limit\\) or >= 0, got -2", call, q, k, v, cu, 5,
           window_size=(-2, 0))
    expect("window_size must be a pair \\(left, right\\) of ints, got \\(4.0, 0\\)", call, q, k, v, cu, 5,
           window_size=(4.0, 0))
    expect("window_size must be a pair", call, q, k, v, cu, 5, window_size=(1, 2, 3))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        expect("softmax_scale must be finite and > 0", call, q, k, v, cu, 5, softmax_scale=bad)
    expect("softmax_scale must be a number or None, got str", call, q, k, v, cu, 5, softmax_scale="x")


def test_windows_past_int64_are_refused():
    q, k, v, cu = batch([5, 3])
    expect("window_size\\[0\\] \\(left\\) must be an int in \\[-1, 9223372036854775807\\], got 9223372036854775808",
           fa4._window, (2 ** 63, 0), True, "cad.fa4.varlen_attn")
    expect("window_size\\[1\\] \\(right\\) must be an int in \\[-1, 9223372036854775807\\]", fa4._window,
           (0, 2 ** 64), False, "cad.fa4.varlen_attn")


def test_documents_refilled_behind_the_version_counter_are_read_again():
    q, k, v, cu = batch([5, 3])
    on_device, longest = fa4._cu_seqlens(cu, 8, torch.device("cpu"), "x")
    assert on_device.tolist() == [0, 5, 8] and longest == 5
    cu.data.copy_(torch.tensor([0, 2, 8], dtype=torch.int32))  # the version counter does not move
    on_device, longest = fa4._cu_seqlens(cu, 8, torch.device("cpu"), "x")
    assert on_device.tolist() == [0, 2, 8] and longest == 6
    cu.numpy()[1] = 7
    on_device, longest = fa4._cu_seqlens(cu, 8, torch.device("cpu"), "x")
    assert on_device.tolist() == [0, 7, 8] and longest == 7


def test_window_translation():
    assert fa4._window((-1, -1), True, "x") == (None, 0)     # causal
    assert fa4._window((-1, 0), True, "x") == (None, 0)
    assert fa4._window((128, 0), True, "x") == (128, 0)      # a causal window
    assert fa4._window((128, -1), True, "x") == (128, 0)
    assert fa4._window((-1, -1), False, "x") == (None, None)  # full attention
    assert fa4._window((3, 5), False, "x") == (3, 5)


def test_cu_seqlens_checks():
    q, k, v, cu = batch([5, 3])
    call = fa4.varlen_attn
    expect("cu_seqlens must be a 1-D int32 tensor \\[num_docs \\+ 1\\], got torch.int64", call, q, k, v, cu.long(), 5)
    expect("cu_seqlens must be a 1-D int32 tensor .* got list", call, q, k, v, [0, 5, 8], 5)
    expect("cu_seqlens must start at 0 and end at the 8 tokens of q, got \\[0, 5, 7\\]", call, q, k, v,
           torch.tensor([0, 5, 7], dtype=torch.int32), 5)
    expect("cu_seqlens decreases at document 1 \\(6 -> 5\\)", call, q, k, v,
           torch.tensor([0, 6, 5, 8], dtype=torch.int32), 6)
    expect("cu_seqlens is on meta, q on cpu", call, q, k, v, cu.to("meta"), 5)
    expect("max_seqlen=4 is below the longest document \\(5 tokens\\)", call, q, k, v, cu, 4)
    expect("max_seqlen must be an int .* got float", call, q, k, v, cu, 5.0)


def test_segment_checks():
    q, k, v, _ = batch([6])
    call = fa4.segments_attn
    expect("segments\\[1\\] = \\(2, 5, 0, 5\\) lies outside the batch \\(6 query rows, 6 key/value rows\\)", call, q,
           k, v, [(0, 2, 0, 2), (2, 5, 0, 5)])
    expect("segments\\[0\\] = \\(0, 3, 0, 2\\) has q_len > kv_len", call, q, k, v, [(0, 3, 0, 2)])
    expect("segments \\(0, 3, 0, 3\\) and \\(2, 2, 0, 4\\) overlap in Q", call, q, k, v, [(2, 2, 0, 4), (0, 3, 0, 3)])
    expect("segments\\[0\\] must be 4 ints", call, q, k, v, [(0, 3, 0)])
    expect("segments must be an integer \\[n, 4\\] table", call, q, k, v, torch.zeros(2, 3, dtype=torch.int64))
    expect("has a negative entry", call, q, k, v, [(0, -1, 0, 2)])


# ---- the plumbing, through a float64 stand-in for FA4's function --------------------------------------------------
def allowed(q_len, kv_len, causal, window):
    """[q_len, kv_len] mask: causal bottom-right (query i sees keys j <= i + kv_len - q_len), window (left, right)
    counted from the same diagonal, -1 = no limit (cad.varlen_attn's meaning)."""
    i = torch.arange(q_len).unsqueeze(1) + (kv_len - q_len)
    j = torch.arange(kv_len).unsqueeze(0)
    mask = torch.ones(q_len, kv_len, dtype=torch.bool)
    left, right = window
    if causal:
        mask &= j <= i
    if left >= 0:
        mask &= j >= i - left
    if right >= 0 and not causal:
        mask &= j <= i + right
    return mask


def attend(q, k, v, mask, scale):
    """O [L, H, D] and LSE [H, L] in float64, K/V heads repeated for GQA; fully masked rows: O 0, LSE -inf."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale
    s = s.masked_fill(~mask.to(s.device), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.clamp_min(-1e300).unsqueeze(-1)).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v.double()), lse


def stand_in(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size,
             return_lse):
    """flash_attn_varlen_func's meaning, computed sequence by sequence in float64 (for the plumbing tests)."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    assert max_seqlen_q >= max(b - a for a, b in zip(cq, cq[1:]))
    assert max_seqlen_k >= max(b - a for a, b in zip(ck, ck[1:]))
    left, right = (-1 if w is None else w for w in window_size)
    outs, lses = [], []
    for (a, b), (c, d) in zip(zip(cq, cq[1:]), zip(ck, ck[1:])):
        o, lse = attend(q[a:b], k[c:d], v[c:d], allowed(b - a, d - c, causal, (left, right)), softmax_scale)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs).to(q.dtype), torch.cat(lses, dim=1).float()


@pytest.fixture
def fake_fa4(fresh):
    fresh.setitem(sys.modules, "flash_attn.cute", _module_with(stand_in))
    fresh.setattr(fa4, "_device_reason", lambda device: None)
    return fresh


def reference_segments(q, k, v, segments, causal, window, scale):
    """O and LSE of a server batch, segment by segment on the original rows (float64); rows outside every
    segment: O 0, LSE -inf."""
    o = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf, dtype=torch.float64, device=q.device)
    for q_off, q_len, kv_off, kv_len in segments:
        if q_len == 0 or kv_len == 0:
            continue
        so, sl = attend(q[q_off:q_off + q_len], k[kv_off:kv_off + kv_len], v[kv_off:kv_off + kv_len],
                        allowed(q_len, kv_len, causal, window), scale)
        o = o.index_copy(0, torch.arange(q_off, q_off + q_len, device=q.device), so)
        lse[:, q_off:q_off + q_len] = sl.detach()
    return o, lse


# A document of 12 tokens split into two query shards (rows 0-4 and 9-15) that share its K/V prefix, a second
# document (rows 5-8, K/V 12-15), rows 16-17 in no segment; listed out of Q order.
SHARED = [(9, 7, 0, 12), (5, 4, 12, 4), (0, 5, 0, 5)]


@pytest.mark.parametrize("causal, window", [(True, (-1, -1)), (True, (3, 0)), (False, (-1, -1)), (False, (2, 1))])
def test_segments_with_shared_kv_match_segment_by_segment(fake_fa4, causal, window):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(18, 4, 16, generator=g, dtype=torch.float64).requires_grad_(True)
    k = torch.randn(16, 2, 16, generator=g, dtype=torch.float64).requires_grad_(True)
    v = torch.randn(16, 2, 16, generator=g, dtype=torch.float64).requires_grad_(True)
    fake_fa4.setattr(fa4, "_DTYPES", (torch.float64,))  # the stand-in computes in float64: check exactly
    segments = SHARED if causal else SHARED + [(16, 1, 2, 0)]
    o, lse = fa4.segments_attn(q, k, v, torch.tensor(segments), causal=causal, window_size=window)
    ro, rlse = reference_segments(q, k, v, segments, causal, window, 1 / 4)
    torch.testing.assert_close(o, ro, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse.double(), rlse, rtol=1e-6, atol=1e-6)
    assert torch.isinf(lse[:, 16:]).all() and (o[16:] == 0).all()
    d_o = torch.randn(o.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(o, (q, k, v), d_o)
    want = torch.autograd.grad(ro, (q, k, v), d_o)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)
    assert got[1][:5].abs().sum() > 0  # the shared prefix's rows got gradients from both shards


def test_segments_already_packed_are_passed_as_they_are(fake_fa4):
    calls = []

    def spy(q, k, v, **kw):
        calls.append((q, k))
        return stand_in(q, k, v, **kw)
    fake_fa4.setitem(sys.modules, "flash_attn.cute", _module_with(spy))
    q, k, v, _ = batch([3, 5], dtype=torch.bfloat16)
    fa4.segments_attn(q, k, v, [(0, 3, 0, 3), (3, 5, 3, 5)])
    assert calls[0][0].data_ptr() == q.data_ptr() and calls[0][1].data_ptr() == k.data_ptr()  # no gather


def test_varlen_attn_passes_documents_and_window(fake_fa4):
    seen = {}

    def spy(q, k, v, **kw):
        seen.update(kw)
        return stand_in(q, k, v, **kw)[0]  # a version returning out alone
    fake_fa4.setitem(sys.modules, "flash_attn.cute", _module_with(spy))
    q, k, v, cu = batch([5, 3, 0, 4])
    o = fa4.varlen_attn(q, k, v, cu, None, causal=True, window_size=(2, 0), softmax_scale=0.5)
    assert seen["max_seqlen_q"] == seen["max_seqlen_k"] == 5  # None: the longest document
    assert seen["cu_seqlens_q"].tolist() == [0, 5, 8, 8, 12] and seen["cu_seqlens_q"].dtype == torch.int32
    assert seen["window_size"] == (2, 0) and seen["causal"] is True and seen["softmax_scale"] == 0.5
    want, _ = reference_segments(q, k, v, [(0, 5, 0, 5), (5, 3, 5, 3), (8, 4, 8, 4)], True, (2, 0), 0.5)
    torch.testing.assert_close(o.double(), want, rtol=2e-2, atol=2e-2)


def test_no_token(fake_fa4):
    q, k, v, cu = batch([0])
    q.requires_grad_(True)
    o = fa4.varlen_attn(q, k, v, cu, 0)
    assert o.shape == q.shape
    o, lse = fa4.segments_attn(*batch([3])[:3], [])
    assert (o == 0).all() and torch.isinf(lse).all()


# ---- the real kernel (SM90+ GPU with flash-attn-4) ----------------------------------------------------------------
_ok, _why = fa4.available() if torch.cuda.is_available() else (False, "no CUDA device")
gpu = pytest.mark.skipif(not _ok, reason=f"FlashAttention-4 not available: {_why}")


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("window", [(-1, -1), (96, 0)])
def test_fa4_matches_the_float_reference(d, window):
    lengths = [300, 1, 77, 700, 128]
    q, k, v, cu = batch(lengths, hq=8, hkv=2, d=d, device="cuda", seed=d)
    qkv = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = fa4.varlen_attn(*qkv, cu.cuda(), max(lengths), causal=True, window_size=window)
    segments = [(a, b - a, a, b - a) for a, b in zip(cu.tolist(), cu.tolist()[1:])]
    ref = [t.detach().double().requires_grad_(True) for t in (q, k, v)]  # float64 on the GPU
    ro, _ = reference_segments(*ref, segments, True, window, 1 / math.sqrt(d))
    assert rel(o, ro) < 1e-2
    d_o = torch.randn(o.shape, device="cuda", dtype=torch.bfloat16)
    got = torch.autograd.grad(o, qkv, d_o)
    want = torch.autograd.grad(ro, ref, d_o.double())
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert rel(a, b) < 2e-2, name


@gpu
def test_fa4_server_batch_with_shared_prefixes():
    g = torch.Generator().manual_seed(5)
    # Two documents of 700 and 300 tokens, each cut into query shards that read their document's K/V prefix.
    segments = [(0, 200, 0, 200), (200, 500, 0, 700), (700, 100, 700, 100), (800, 200, 700, 300)]
    q = torch.randn(1000, 8, 128, generator=g).to(torch.bfloat16)
    k = torch.randn(1000, 2, 128, generator=g).to(torch.bfloat16)
    v = torch.randn(1000, 2, 128, generator=g).to(torch.bfloat16)
    qkv = [t.cuda().requires_grad_(True) for t in (q, k, v)]
    o, lse = fa4.segments_attn(*qkv, segments, causal=True)
    ref = [t.double().requires_grad_(True) for t in (q, k, v)]
    ro, rlse = reference_segments(*ref, segments, True, (-1, -1), 1 / math.sqrt(128))
    assert rel(o, ro.cuda()) < 1e-2
    assert (lse.cpu().double() - rlse).abs().max() < 1e-2
    d_o = torch.randn(o.shape, generator=g).to(torch.bfloat16)
    got = torch.autograd.grad(o, qkv, d_o.cuda())
    want = torch.autograd.grad(ro, ref, d_o.double())
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert rel(a, b.cuda()) < 2e-2, name


# ---- the server backward (segments_attn_backward) through a float64 stand-in for FA4's _flash_attn_bwd -----------
def stand_in_bwd(q, k, v, out, dout, lse, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, window_size_left=None,
                 window_size_right=None, max_seqlen_q=None, max_seqlen_k=None):
    """_flash_attn_bwd's meaning over packed sequences, by autograd through `attend` in float64."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    assert max_seqlen_q == max(b - a for a, b in zip(cq, cq[1:]))
    window = (-1 if window_size_left is None else window_size_left, -1 if window_size_right is None else
              window_size_right)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    outs = [attend(leaves[0][a:b], leaves[1][c:d], leaves[2][c:d], allowed(b - a, d - c, causal, window),
                   softmax_scale)[0] for (a, b), (c, d) in zip(zip(cq, cq[1:]), zip(ck, ck[1:]))]
    grads = torch.autograd.grad(torch.cat(outs), leaves, dout.double())
    return tuple(g.to(q.dtype) for g in grads)


@pytest.fixture
def fake_fa4_backward(fake_fa4):
    interface = type(sys)("flash_attn.cute.interface")
    interface._flash_attn_bwd = stand_in_bwd
    fake_fa4.setitem(sys.modules, "flash_attn.cute.interface", interface)
    saved = list(fa4._loaded_backward)
    fa4._loaded_backward.clear()
    yield fake_fa4
    fa4._loaded_backward[:] = saved


@pytest.mark.parametrize("causal, window", [(True, (-1, -1)), (True, (3, 0)), (False, (2, 1))])
def test_server_backward_gathers_and_sums_shared_kv(fake_fa4_backward, causal, window):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(18, 4, 16, generator=g, dtype=torch.float64).requires_grad_(True)
    k = torch.randn(16, 2, 16, generator=g, dtype=torch.float64).requires_grad_(True)
    v = torch.randn(16, 2, 16, generator=g, dtype=torch.float64).requires_grad_(True)
    fake_fa4_backward.setattr(fa4, "_DTYPES", (torch.float64,))
    o, lse = fa4.segments_attn(q, k, v, SHARED, causal=causal, window_size=window)
    d_o = torch.randn(o.shape, generator=g, dtype=torch.float64)
    want = torch.autograd.grad(o, (q, k, v), d_o)  # the forward's autograd: index_select's backward sums dK/dV
    got = fa4.segments_attn_backward(q.detach(), k.detach(), v.detach(), o.detach(), lse, d_o, SHARED, causal=causal,
                                     window_size=window)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)
    assert (got[0][16:] == 0).all()  # rows no segment covers


def test_server_backward_refuses_an_fa4_without_its_keywords(fake_fa4):
    interface = type(sys)("flash_attn.cute.interface")
    interface._flash_attn_bwd = lambda q, k, v, out, dout, lse, softmax_scale=None, causal=False: None
    fake_fa4.setitem(sys.modules, "flash_attn.cute.interface", interface)
    saved = list(fa4._loaded_backward)
    fa4._loaded_backward.clear()
    try:
        fake_fa4.setattr(fa4, "_DTYPES", (torch.float64,))
        loaded, why = fa4._load_backward()  # what backward_available reports after the device checks
        assert loaded is None and "takes no cu_seqlens_q, cu_seqlens_k" in why, why
        q = torch.zeros(4, 2, 16, dtype=torch.float64)
        with pytest.raises(cad.CadError, match="backward cannot run") as info:
            fa4.segments_attn_backward(q, q[:, :1], q[:, :1], q, torch.zeros(2, 4), q, [(0, 4, 0, 4)])
        assert info.value.status == "UNAVAILABLE"
    finally:
        fa4._loaded_backward[:] = saved
