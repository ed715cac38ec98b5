"""CAD's servers through a Python server backend (cad.server_backend, the callback_attention plugin calling back into
the process): server_backend="torch" on 2 CPU processes under gloo gives the results and gradients of local
attention; a callback's failure arrives as a CadError with its message; bad choices are refused naming why."""
import pytest
import torch

import harness
from reference import random_batch, sdpa_varlen, sdpa_varlen_window

# Per rank: unequal documents, so the balancer moves work between ranks and servers get shared K/V prefixes.
LENGTHS = [[37, 2, 1], [4, 9, 5]]


def _compare(rank, causal, window, dtype=torch.float32, tol=2e-5):
    import cad
    q, k, v, cu = random_batch(LENGTHS[rank], 4, 2, 16, dtype=dtype, seed=rank)
    d_o = torch.randn(q.shape, generator=torch.Generator().manual_seed(100 + rank)).to(dtype)
    plan = cad.plan(cu, causal=causal, window_size=window)
    results = []
    local = (lambda q, k, v: sdpa_varlen(q, k, v, cu, causal)) if window == (-1, -1) else \
        (lambda q, k, v: sdpa_varlen_window(q, k, v, cu, causal, window))
    for fn in (lambda q, k, v: cad.varlen_attn(q, k, v, cu, plan=plan, causal=causal, window_size=window), local):
        leaves = [t.detach().clone().float().to(dtype).requires_grad_() for t in (q, k, v)]
        o = fn(*leaves)
        o.backward(d_o)
        results.append([o.detach().float()] + [t.grad.float() for t in leaves])
    for name, a, b in zip(("o", "dq", "dk", "dv"), *results):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"rank {rank} {name}: {m}")
    return plan


def _torch_server_backend(rank, world):
    import cad
    from cad import server_backend
    cad.init(server_backend="torch", timeout_ms=20000)
    for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (True, (6, 0))):
        plan = _compare(rank, causal, window)
    assert plan.stats["imbalance"] < 1.5, plan.stats  # the balancer moved work: remote tasks were served
    counts = server_backend.calls["torch_cpu"]
    assert counts["forward"] >= 3 and counts["backward"] >= 3, counts
    assert not server_backend._alive  # every zero-copy view of a call's tensors went with its call
    # bf16 through the same callbacks (fp32 math inside), against fp32 local attention within bf16 rounding.
    _compare(rank, True, (-1, -1), dtype=torch.bfloat16, tol=3e-2)


def test_torch_server_backend_matches_local_attention():
    harness.run(2, _torch_server_backend)


def _failing_callback(rank, world):
    import cad
    from cad import server_backend

    def broken(*args):
        raise ValueError("the server batch could not be computed")
    server_backend._TorchBackend.forward = staticmethod(broken)
    cad.init(server_backend="torch", timeout_ms=20000)
    q, k, v, cu = random_batch(LENGTHS[rank], 2, 2, 16, seed=rank)
    plan = cad.plan(cu)
    with pytest.raises(cad.CadError) as info:
        cad.varlen_attn(q, k, v, cu, plan=plan)
    message = str(info.value)
    assert "forward callback 'torch_cpu' failed" in message, message
    assert "ValueError: the server batch could not be computed" in message, message


def test_failing_callback_reaches_the_caller_with_its_message():
    harness.run(1, _failing_callback)


def test_choices_are_checked():
    import cad
    from cad import server_backend
    with pytest.raises(cad.CadError, match="server_backend must be one of"):
        cad.Context(server_backend="flash")
    ok, why = server_backend.available("fa4", "cpu")
    assert not ok and "not a CUDA GPU" in why, why
    with pytest.raises(cad.CadError, match="server_backend='fa4' cannot serve on cpu") as info:
        server_backend.instance_config("fa4", "cpu")
    assert info.value.status == "UNAVAILABLE"
    assert server_backend.available("torch", "cpu")[0]


def test_torch_segment_attention_matches_the_reference_backend():
    """The torch implementation alone against the reference plugin on shared K/V, 0- and 1-row segments, uncovered
    rows and a window (the plugin's own oracle is checked by the conformance kit)."""
    from cad import server_backend
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, h, 16, generator=g) for n, h in ((20, 4), (24, 2), (24, 2)))
    segments = [(0, 5, 0, 12), (5, 7, 0, 12), (12, 1, 12, 1), (13, 0, 13, 3), (14, 4, 16, 8)]  # rows 18, 19 uncovered
    for causal, window in ((True, (-1, -1)), (False, (3, 2)), (True, (2, -1))):
        o, lse = server_backend.segment_attention(q, k, v, segments, causal, window, 0.25)
        assert torch.equal(o[18:], torch.zeros_like(o[18:])) and torch.isinf(lse[:, 18:]).all()
        for q_off, q_len, kv_off, kv_len in segments:
            for i in range(q_len):
                pos = i + kv_len - q_len
                keys = [j for j in range(kv_len) if (not causal or j <= pos) and (window[0] < 0 or j >= pos - window[0])
                        and (causal or window[1] < 0 or j <= pos + window[1])]
                for h in range(4):
                    s = torch.stack([(q[q_off + i, h] @ k[kv_off + j, h // 2]) * 0.25 for j in keys])
                    want_lse = torch.logsumexp(s, 0)
                    want_o = (torch.softmax(s, 0)[:, None] * v[[kv_off + j for j in keys], h // 2]).sum(0)
                    torch.testing.assert_close(lse[h, q_off + i], want_lse, rtol=1e-5, atol=1e-5)
                    torch.testing.assert_close(o[q_off + i, h], want_o, rtol=1e-5, atol=1e-5)


def test_torch_segment_backward_matches_autograd():
    """segment_attention_backward's formulas against autograd through the forward (shared K/V, GQA, a window)."""
    from cad import server_backend
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(n, h, 16, generator=g, dtype=torch.float64).float() for n, h in ((20, 4), (24, 2), (24, 2)))
    segments = [(0, 5, 0, 12), (5, 7, 0, 12), (12, 1, 12, 1), (13, 0, 13, 3), (14, 4, 16, 8)]
    d_o = torch.randn(q.shape, generator=g)
    for causal, window in ((True, (-1, -1)), (False, (3, 2))):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o, lse = server_backend.segment_attention(*leaves, segments, causal, window, 0.25)
        want = torch.autograd.grad(o, leaves, d_o)
        got = server_backend.segment_attention_backward(q, k, v, o.detach(), lse, d_o, segments, causal, window, 0.25)
        for name, a, b in zip(("dq", "dk", "dv"), got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name} causal={causal}: {m}")
        assert got[1][12].abs().sum() > 0  # row 12 is read by a segment
        assert torch.equal(got[1][13:16], torch.zeros_like(got[1][13:16]))  # rows 13-15: only the empty segment
