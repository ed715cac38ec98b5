"""cad.varlen_attn(window_size=...) on the local path (plan=None, the CPU reference backend) against torch sdpa
with an explicit per-document window mask, forward and backward; bad windows refused naming the argument."""
import pytest
import torch

import cad
import harness
from reference import random_batch, sdpa_varlen, sdpa_varlen_window

LENGTHS, HQ, HKV, D = [7, 1, 33, 12], 4, 2, 16  # odd lengths, a one-token document, GQA
# Imported once by the ranks' forkserver (tests/python/harness.py): the two-rank cases build Mistral and Qwen2.
HF_MODULES = (*harness.TRANSFORMERS, "transformers.models.mistral.modeling_mistral",
              "transformers.models.qwen2.modeling_qwen2")


def _grads(fn, q, k, v, d_o):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    o.backward(d_o)
    return o.detach(), q.grad, k.grad, v.grad


def _assert_all_close(got, want):
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("window", [(0, 0), (1, 0), (4, -1), (31, 0), (32, -1), (100, 0)])
def test_causal_windows_match_masked_sdpa(window):
    q, k, v, cu = random_batch(LENGTHS, HQ, HKV, D)
    d_o = torch.randn_like(q)
    got = _grads(lambda q, k, v: cad.varlen_attn(q, k, v, cu, causal=True, window_size=window), q, k, v, d_o)
    want = _grads(lambda q, k, v: sdpa_varlen_window(q, k, v, cu, True, window), q, k, v, d_o)
    _assert_all_close(got, want)


@pytest.mark.parametrize("window", [(0, 0), (2, 3), (-1, 0), (0, -1), (5, 40), (-1, -1)])
def test_noncausal_windows_match_masked_sdpa(window):
    q, k, v, cu = random_batch(LENGTHS, HQ, HKV, D, seed=1)
    d_o = torch.randn_like(q)
    got = _grads(lambda q, k, v: cad.varlen_attn(q, k, v, cu, causal=False, window_size=window), q, k, v, d_o)
    want = _grads(lambda q, k, v: sdpa_varlen_window(q, k, v, cu, False, window), q, k, v, d_o)
    _assert_all_close(got, want)


@pytest.mark.parametrize("causal", [True, False])
def test_window_longer_than_every_document_is_no_window(causal):
    q, k, v, cu = random_batch(LENGTHS, HQ, HKV, D, seed=2)
    wide = (33, 0 if causal else 33)
    torch.testing.assert_close(cad.varlen_attn(q, k, v, cu, causal=causal, window_size=wide),
                               cad.varlen_attn(q, k, v, cu, causal=causal), rtol=0, atol=0)
    torch.testing.assert_close(cad.varlen_attn(q, k, v, cu, causal=causal, window_size=wide),
                               sdpa_varlen(q, k, v, cu, causal), rtol=1e-5, atol=2e-5)


def test_windowed_lse():
    q, k, v, cu = random_batch([9], 2, 2, 8, seed=3)
    _, lse = cad.varlen_attn(q, k, v, cu, causal=True, window_size=(2, 0), softmax_scale=0.5, return_lse=True)
    scores = torch.einsum("qhd,khd->hqk", q, k) * 0.5
    i, j = torch.arange(9).unsqueeze(1), torch.arange(9).unsqueeze(0)
    scores = scores.masked_fill(~((j <= i) & (j >= i - 2)), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window,causal,expected", [
    ((-2, 0), True, r"window_size\[0\] \(left\)"),
    ((3, -5), False, r"window_size\[1\] \(right\)"),
    ((3, 1), True, r"window_size\[1\] \(right\).*causal"),
    ((3,), True, "window_size must be a pair"),
    ("ab", True, "window_size must be a pair"),
    ((2.5, 0), True, "window_size must be a pair"),
])
def test_bad_windows_are_refused_naming_the_argument(window, causal, expected):
    q, k, v, cu = random_batch([5, 7], 2, 2, 16)
    with pytest.raises(cad.CadError, match=expected):
        cad.varlen_attn(q, k, v, cu, causal=causal, window_size=window)


def test_cad_plan_with_a_window_matches_the_local_path():
    # One process: CAD over the "host" communicator with a world of one; the window travels in the plan.
    q, k, v, cu = random_batch(LENGTHS, HQ, HKV, D, seed=4)
    d_o = torch.randn_like(q)
    plan = cad.plan(cu, window_size=(5, 0))
    got = _grads(lambda q, k, v: cad.varlen_attn(q, k, v, cu, plan=plan, window_size=(5, 0)), q, k, v, d_o)
    want = _grads(lambda q, k, v: sdpa_varlen_window(q, k, v, cu, True, (5, 0)), q, k, v, d_o)
    _assert_all_close(got, want)


def test_the_plan_fixes_the_mask_and_a_conflicting_one_is_refused_naming_both():
    q, k, v, cu = random_batch([5, 7], 2, 2, 16, seed=3)
    plan = cad.plan(cu, window_size=(4, 0))
    want = sdpa_varlen_window(q, k, v, cu, True, (4, 0))
    torch.testing.assert_close(cad.varlen_attn(q, k, v, cu, plan=plan), want, rtol=1e-5, atol=2e-5)  # the plan's
    # The same mask given again is accepted; another is refused, naming the argument and the plan's value.
    torch.testing.assert_close(cad.varlen_attn(q, k, v, cu, plan=plan, causal=True, window_size=(4, 0)), want,
                               rtol=1e-5, atol=2e-5)
    with pytest.raises(cad.CadError, match=r"window_size=\(-1, -1\) conflicts with plan #\d+'s window_size=\(4, 0\)"):
        cad.varlen_attn(q, k, v, cu, plan=plan, window_size=(-1, -1))  # a global layer with the local layers' plan
    with pytest.raises(cad.CadError, match=r"window_size=\(4, 0\) conflicts with plan #\d+'s window_size=\(-1, 0\)"):
        cad.varlen_attn(q, k, v, cu, plan=cad.plan(cu), window_size=(4, 0))
    with pytest.raises(cad.CadError, match=r"causal=False conflicts with plan #\d+'s causal=True"):
        cad.varlen_attn(q, k, v, cu, plan=plan, causal=False)
    full = cad.plan(cu, causal=False)
    torch.testing.assert_close(cad.varlen_attn(q, k, v, cu, plan=full), sdpa_varlen(q, k, v, cu, False),
                               rtol=1e-5, atol=2e-5)


def test_cad_plan_refuses_bad_windows():
    _, _, _, cu = random_batch([5, 7], 2, 2, 16)
    with pytest.raises(cad.CadError, match=r"cad.plan: window_size\[0\] \(left\)"):
        cad.plan(cu, window_size=(-3, 0))
    with pytest.raises(cad.CadError, match=r"cad.plan_pieces: window_size\[1\] \(right\)"):
        cad.plan_pieces([(7, 12, 0, 12)], window_size=(3, 2))


def test_plan_pieces_with_a_window():
    q, k, v, cu = random_batch([12], 2, 2, 16, seed=5)
    plan = cad.plan_pieces([(7, 12, 0, 12)], window_size=(3, 0))
    torch.testing.assert_close(cad.varlen_attn(q, k, v, None, plan=plan, window_size=(3, 0)),
                               sdpa_varlen_window(q, k, v, cu, True, (3, 0)), rtol=1e-5, atol=2e-5)


# Per rank: unequal documents, so the balancer moves windowed tasks between ranks.
RANK_LENGTHS = [[40, 3, 1], [5, 6, 7, 8], [1, 29]]


def _interleaved_layers(rank, world, balancer):
    # A windowed layer, then a global one over its output, as models that interleave them do: one plan per
    # mask, both made from the same cu_seqlens; gradients through both against masked sdpa.
    cad.init(balancer=balancer, timeout_ms=20000)
    q, k, v, cu = random_batch(RANK_LENGTHS[rank], 4, 2, 16, seed=rank)
    d_o = torch.randn(q.shape, generator=torch.Generator().manual_seed(100 + rank))
    local, global_ = cad.plan(cu, window_size=(6, 0)), cad.plan(cu)

    def through_cad(q, k, v):
        h = cad.varlen_attn(q, k, v, cu, plan=local, window_size=(6, 0))
        return cad.varlen_attn(h, k, v, cu, plan=global_)

    def through_sdpa(q, k, v):
        return sdpa_varlen(sdpa_varlen_window(q, k, v, cu, True, (6, 0)), k, v, cu, True)

    got, want = _grads(through_cad, q, k, v, d_o), _grads(through_sdpa, q, k, v, d_o)
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5, msg=lambda m: f"rank {rank} {name}: {m}")


@pytest.mark.parametrize("world,balancer", [(2, "prefix_aware"), (3, "distca")])
def test_interleaved_local_and_global_layers_through_cad(world, balancer):
    harness.run(world, _interleaved_layers, balancer, preload=HF_MODULES)


def test_torch_compile_traces_a_window():
    q, k, v, cu = random_batch([6, 10], 2, 2, 16)
    fn = torch.compile(lambda q, k, v: cad.varlen_attn(q, k, v, cu, window_size=(3, 0)), backend="aot_eager",
                       fullgraph=True)
    torch.testing.assert_close(fn(q, k, v), sdpa_varlen_window(q, k, v, cu, True, (3, 0)), rtol=1e-5, atol=2e-5)


# ---- cad.hf: transformers' sliding_window ------------------------------------------------------------------
HF_DOCS = [[13, 2, 17], [9, 30]]  # per rank, packed by position_ids restarts; documents longer than the window


def _hf_config(kind, sliding_window):
    """A tiny Mistral (every layer windowed) or Qwen2 (layer 0 global, layer 1 windowed: layer_types)."""
    from transformers import MistralConfig, Qwen2Config
    common = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, attention_dropout=0.0)
    if kind == "mistral":
        return MistralConfig(sliding_window=sliding_window, **common)
    return Qwen2Config(use_sliding_window=sliding_window is not None, sliding_window=sliding_window,
                       max_window_layers=1, **common)


def _hf_loss_and_grads(config, implementation, ids, positions):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation, dtype=torch.float32)
    # use_cache=False: with a cache transformers' masks ignore the documents in position_ids (training has none)
    loss = model(input_ids=ids, position_ids=positions, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_same_training(got, want, what):
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6, msg=lambda m: f"{what} loss: {m}")
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], rtol=1e-4, atol=1e-6,
                                   msg=lambda m: f"{what} grad {name}: {m}")


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
@pytest.mark.parametrize("packed", [False, True])
def test_hf_sliding_window_matches_transformers_attention(kind, packed):
    # cad_local against transformers' own sdpa and eager attention (their sliding-window masks), loss and every
    # parameter's gradient, for a window of 5 keys (its own included) in documents of up to 32 tokens.
    import cad.hf
    cad.hf.register()
    config = _hf_config(kind, 5)
    docs = [3, 12, 17] if packed else [32]
    ids = torch.randint(0, 97, (1, sum(docs)), generator=torch.Generator().manual_seed(7))
    positions = torch.cat([torch.arange(n) for n in docs]).unsqueeze(0)
    got = _hf_loss_and_grads(config, "cad_local", ids, positions)
    for implementation in ("sdpa", "eager"):
        _assert_same_training(got, _hf_loss_and_grads(config, implementation, ids, positions),
                              f"{kind} packed={packed} cad_local vs {implementation}")
    # The window did matter: the same model without one gives another loss.
    unwindowed = _hf_loss_and_grads(_hf_config(kind, None), "cad_local", ids, positions)
    assert abs(unwindowed[0].item() - got[0].item()) > 1e-5
    if packed:  # and so did the documents (transformers' masks agreed above because they saw them too)
        one_document = _hf_loss_and_grads(config, "cad_local", ids, torch.arange(sum(docs)).unsqueeze(0))
        assert abs(one_document[0].item() - got[0].item()) > 1e-5


def test_hf_sliding_window_from_the_keyword_the_module_or_its_config():
    import types

    import cad.hf
    q, k, v, cu = random_batch([7, 3, 12], 4, 2, 16, seed=3)
    as_hf = [t.unsqueeze(0).transpose(1, 2) for t in (q, k, v)]
    want = sdpa_varlen_window(q, k, v, cu, True, (3, 0))
    unwindowed = sdpa_varlen(q, k, v, cu, True)
    config = types.SimpleNamespace(sliding_window=4, layer_types=["full_attention", "sliding_attention"])
    cases = [  # (module, keywords, expected)
        (types.SimpleNamespace(is_causal=True), {"sliding_window": 4}, want),
        (types.SimpleNamespace(is_causal=True, sliding_window=7), {"sliding_window": 4}, want),  # the keyword wins
        (types.SimpleNamespace(is_causal=True, sliding_window=4), {"sliding_window": None}, unwindowed),
        (types.SimpleNamespace(is_causal=True, sliding_window=4), {}, want),
        (types.SimpleNamespace(is_causal=True, config=config, layer_idx=1), {}, want),
        (types.SimpleNamespace(is_causal=True, config=config, layer_idx=0), {}, unwindowed),
    ]
    for i, (module, keywords, expected) in enumerate(cases):
        out, _ = cad.hf.cad_local_attention(module, *as_hf, None, cad_cu_seqlens=cu, **keywords)
        torch.testing.assert_close(out.reshape(q.shape), expected, rtol=1e-5, atol=2e-5, msg=lambda m: f"case {i}: {m}")
    for bad in (0, -1, 2.0, True):
        with pytest.raises(cad.CadError, match="sliding_window must be None or an int >= 1"):
            cad.hf.cad_local_attention(types.SimpleNamespace(is_causal=True), *as_hf, None, cad_cu_seqlens=cu,
                                       sliding_window=bad)


def test_hf_cad_plan_tuple_gives_each_layer_the_plan_of_its_window():
    """cad_plan may be one plan per mask (as plan_ahead returns them): a global layer takes the causal plan, a
    windowed one the plan with its window, in either order; a tuple without the layer's window is refused naming
    it (one process: CAD over the host communicator with a world of one)."""
    import types

    import cad.hf
    q, k, v, cu = random_batch([7, 3, 12], 4, 2, 16, seed=5)
    as_hf = [t.unsqueeze(0).transpose(1, 2) for t in (q, k, v)]
    config = types.SimpleNamespace(sliding_window=4, layer_types=["full_attention", "sliding_attention"])
    layers = [types.SimpleNamespace(is_causal=True, config=config, layer_idx=i) for i in (0, 1)]
    expected = [sdpa_varlen(q, k, v, cu, True), sdpa_varlen_window(q, k, v, cu, True, (3, 0))]
    plans = (cad.plan(cu), cad.plan(cu, window_size=(3, 0)))
    for order in (plans, plans[::-1], list(plans)):
        for layer, want in zip(layers, expected):
            out, _ = cad.hf.cad_attention(layer, *as_hf, None, cad_cu_seqlens=cu, cad_plan=order)
            torch.testing.assert_close(out.reshape(q.shape), want, rtol=1e-5, atol=2e-5)
            assert cad.hf.current_plan().window_left == (3 if layer.layer_idx == 1 else -1)
    with pytest.raises(cad.CadError, match=r"layer 1 \(causal=True, window_left=3\) has no plan among"):
        cad.hf.cad_attention(layers[1], *as_hf, None, cad_cu_seqlens=cu, cad_plan=(plans[0],))


def _hf_train(rank, implementation, kind, ahead):
    """Two optimizer steps of a windowed model on this rank's packed documents; ahead: plans via plan_ahead."""
    import cad.hf
    from transformers import AutoModelForCausalLM

    cad.hf.register()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_hf_config(kind, 6), attn_implementation=implementation,
                                             dtype=torch.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    out = []
    for step in range(2):
        docs = HF_DOCS[rank] if step == 0 else HF_DOCS[rank][::-1]
        ids = torch.randint(0, 97, (1, sum(docs)), generator=g)
        positions = torch.cat([torch.arange(n) for n in docs]).unsqueeze(0)
        if ahead:
            plans = cad.hf.plan_ahead(model, position_ids=positions, tag=step)
            if kind == "mistral":  # one mask: one plan, with the window
                assert isinstance(plans, cad.Plan) and plans.window_left == 5
            else:  # layer 0 global, layer 1 windowed: one plan each, in layer order
                assert [p.window_left for p in plans] == [-1, 5]
        loss = model(input_ids=ids, position_ids=positions, labels=ids).loss
        loss.backward()
        if implementation == "cad":
            last = cad.hf.current_plan()  # the last layer's: windowed in both models
            assert last.window_left == 5
            if ahead:
                assert last is (plans if kind == "mistral" else plans[1])
        out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        optimizer.step()
        optimizer.zero_grad()
    return out


def _hf_cad_equals_local(rank, world, kind):
    local = _hf_train(rank, "cad_local", kind, False)
    for ahead in (False, True):
        for step, (a, b) in enumerate(zip(_hf_train(rank, "cad", kind, ahead), local)):
            _assert_same_training(a, b, f"rank {rank} {kind} ahead={ahead} step {step}")


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_hf_sliding_window_through_cad_on_two_ranks(kind):
    harness.run(2, _hf_cad_equals_local, kind, timeout_s=180, preload=HF_MODULES)
