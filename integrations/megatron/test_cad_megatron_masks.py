"""CadCoreAttention's mask types, attention masks, inputs and config fields against the installed megatron-core: every
member of its AttnMaskType is either computed equal (outputs and gradients) to Megatron-Core's own masked attention
(DotProductAttention with the mask spelled out, per document) or refused with a ValueError naming it; an
attention_mask is honoured (padding) or refused, never ignored; the parallel sizes, windows and other config fields
the layer reads are checked, not truncated. CAD's local attention (no plan) on the CPU, in this process
(Megatron's DotProductAttention needs parallel_state: a gloo group of one for this module's tests)."""
import dataclasses

import pytest
import torch

pytest.importorskip("megatron.core",
                    reason="megatron-core is not installed (pip install megatron-core; run_tests.sh does it)")

from megatron.core.packed_seq_params import PackedSeqParams  # noqa: E402
from megatron.core.transformer.enums import AttnMaskType  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402


HEADS, GROUPS, HEAD_DIM = 4, 2, 16
# What each mask type means for self-attention (the test's own table, not the layer's): "causal" (a query sees its
# document's keys up to itself), "full" (every key of its document), or None (CAD must refuse it).
MEANING = {"causal": "causal", "causal_bottom_right": "causal", "padding_causal": "causal", "no_mask": "full",
           "padding": "full", "arbitrary": None}


@pytest.fixture(scope="module")
def megatron_state():
    """parallel_state over a gloo group of this process alone, Megatron's local attention on the CPU."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from cad_megatron import megatron_cpu_support
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        megatron_cpu_support()
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _config(**changes):
    base = dict(num_layers=2, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, num_query_groups=GROUPS,
                use_cpu_initialization=True, attention_dropout=0.0, masked_softmax_fusion=False)
    return TransformerConfig(**dict(base, **changes))


def _layer(kind, **changes):
    from cad_megatron import CadCoreAttention
    return CadCoreAttention(_config(**changes), 1, kind, "self", balance=False)


def _qkv(s, b, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((s, b, HEADS, HEAD_DIM), (s, b, GROUPS, HEAD_DIM), (s, b, GROUPS, HEAD_DIM))
    return [torch.randn(*shape, generator=g, dtype=torch.float64).float().requires_grad_() for shape in shapes]


def _megatron(q, k, v, mask):
    """Megatron-Core's DotProductAttention with `mask` ([b, 1, s, s] bool, True: masked, or None: no mask) spelled
    out: its masked fill and softmax ([s, b, h * d] out)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    kind = AttnMaskType.no_mask if mask is None else AttnMaskType.padding  # the mask given is the mask applied
    return DotProductAttention(_config(), 1, kind, "self")(q, k, v, mask)


def _causal(s):
    return torch.ones(s, s, dtype=torch.bool).triu(1)


def _grads(out, tensors, weight):
    grads = torch.autograd.grad((out * weight).sum(), tensors)
    return [g.clone() for g in grads]


def _assert_equal(got, want, what):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: {m}")


# ---- [s, b] input: mask types and attention masks ------------------------------------------------------------------
def test_every_mask_type_is_computed_as_megatron_computes_it_or_refused(megatron_state):
    s, b = 7, 3
    q, k, v = _qkv(s, b)
    weight = torch.randn(s, b, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(1))
    seen = []
    for kind in AttnMaskType:  # every member of the installed megatron-core's enum
        meaning = MEANING.get(kind.name)
        if meaning is None:  # arbitrary, and any type this test does not know: refused, naming it
            with pytest.raises(ValueError, match=kind.name):
                _layer(kind)
            with pytest.raises(ValueError, match=kind.name):
                _layer(AttnMaskType.causal)(q, k, v, None, attn_mask_type=kind)
            seen.append((kind.name, "refused"))
            continue
        layer = _layer(kind)
        want_mask = _causal(s)[None, None].expand(b, 1, s, s) if meaning == "causal" else None
        want = _megatron(q, k, v, want_mask)
        want_grads = _grads(want, (q, k, v), weight)
        # no attention_mask, and the type's own mask spelled out (Megatron-LM's dataloader passes the causal one)
        own = want_mask if want_mask is not None else torch.zeros(b, 1, s, s, dtype=torch.bool)
        for given in (None, own):
            out = layer(q, k, v, given)
            _assert_equal(out, want, f"{kind.name} (mask {'given' if given is not None else 'None'})")
            for got_g, want_g, name in zip(_grads(out, (q, k, v), weight), want_grads, "qkv"):
                _assert_equal(got_g, want_g, f"{kind.name} d{name}")
        # the same mask type given at the call, to a layer built with another
        other = AttnMaskType.no_mask if meaning == "causal" else AttnMaskType.causal
        _assert_equal(_layer(other)(q, k, v, None, attn_mask_type=kind).detach(), want.detach(),
                      f"{kind.name} given at the call")
        seen.append((kind.name, meaning))
    assert {name for name, _ in seen} == {m.name for m in AttnMaskType}
    assert ("padding", "full") in seen and ("padding_causal", "causal") in seen and ("arbitrary", "refused") in seen


def test_padding_masks_are_honoured_on_every_real_token(megatron_state):
    """Padding masks: right padding, left padding, a hole in the middle and a row of padding only, as a [b, 1, 1, s]
    key mask and as Megatron-LM's [b, 1, s, s] form; each row's real tokens are its document. Equal to Megatron's
    masked attention on every real token (outputs and every gradient); a padding token's output is zero."""
    s, b = 8, 4
    pad = torch.zeros(b, s, dtype=torch.bool)
    pad[0, 5:] = True  # right padding
    pad[1, :3] = True  # left padding
    pad[2, 2:4] = True  # a hole
    pad[3, :] = True  # nothing real
    q, k, v = _qkv(s, b, seed=2)
    real = (~pad).T[:, :, None].float()  # [s, b, 1]
    weight = torch.randn(s, b, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(3)) * real
    for kind in (AttnMaskType.padding, AttnMaskType.padding_causal):
        causal = kind is AttnMaskType.padding_causal
        full = pad[:, None, :].expand(b, s, s) | (_causal(s) if causal else False)  # Megatron-LM's mask
        want = _megatron(q, k, v, full[:, None])
        want_grads = _grads(want, (q, k, v), weight)
        forms = {"key mask [b, 1, 1, s]": pad[:, None, None, :],
                 "[b, 1, s, s] padding rows and columns": (pad[:, None, :] | pad[:, :, None])[:, None]}
        if causal:
            forms["[b, 1, s, s] with the causal triangle"] = full[:, None]
        for form, mask in forms.items():
            out = _layer(kind)(q, k, v, mask)
            what = f"{kind.name}, {form}"
            _assert_equal(out * real, want * real, what)
            assert torch.equal(out * (1 - real), torch.zeros_like(out)), f"{what}: padding tokens' outputs not zero"
            for got_g, want_g, name in zip(_grads(out, (q, k, v), weight), want_grads, "qkv"):
                _assert_equal(got_g, want_g, f"{what} d{name}")
    # A padding mask without padding is no mask.
    none = torch.zeros(b, 1, 1, s, dtype=torch.bool)
    _assert_equal(_layer(AttnMaskType.padding)(q, k, v, none), _megatron(q, k, v, None), "padding, nothing padded")


def test_masks_cad_cannot_compute_are_refused_not_ignored():
    s, b = 6, 2
    q, k, v = _qkv(s, b)
    pad = torch.zeros(b, 1, 1, s, dtype=torch.bool)
    pad[0, 0, 0, 4:] = True
    documents = torch.ones(s, s, dtype=torch.bool)  # two documents of 3: a block-diagonal causal mask
    documents[:3, :3] = documents[3:, 3:] = False
    documents = (documents | _causal(s))[None, None]
    refusals = [
        (AttnMaskType.causal, pad, "causal with an attention_mask that is not that type's mask"),
        (AttnMaskType.causal, documents, "causal with an attention_mask"),
        (AttnMaskType.no_mask, _causal(s)[None, None], "no_mask with an attention_mask"),
        (AttnMaskType.causal_bottom_right, torch.zeros(1, 1, s, s, dtype=torch.bool), "causal_bottom_right with"),
        (AttnMaskType.padding_causal, documents, "padding_causal is not a padding mask"),
        (AttnMaskType.padding, _causal(s)[None, None], "padding is not a padding mask"),
        (AttnMaskType.padding, torch.zeros(b, HEADS, s, s, dtype=torch.bool), r"shape \(2, 4, 6, 6\).*per-head"),
        (AttnMaskType.padding, torch.zeros(b, 1, 1, s), "must be a bool tensor"),
        (AttnMaskType.causal, torch.zeros(b, 1, s, s - 1, dtype=torch.bool), r"shape \(2, 1, 6, 5\)"),
    ]
    for kind, mask, words in refusals:
        with pytest.raises(ValueError, match=words):
            _layer(kind)(q, k, v, mask)
    # THD: the documents are packed_seq_params' cu_seqlens; a mask beside them is refused, not ignored
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=4, max_seqlen_kv=4)
    with pytest.raises(ValueError, match="attention_mask with packed_seq_params"):
        _layer(AttnMaskType.padding_causal)(q[:, 0], k[:, 0], v[:, 0], pad[:1], packed_seq_params=packed)
    # a padding mask on a sliding-window layer (Megatron's window mask drops the padding)
    with pytest.raises(ValueError, match="padding attention_mask on a sliding-window layer"):
        _layer(AttnMaskType.padding_causal, window_size=(2, 0))(q, k, v, pad)


# ---- packed documents (THD): every mask type per document ------------------------------------------------------------
def test_every_mask_type_over_packed_documents(megatron_state):
    docs = [5, 1, 9, 3]
    t = sum(docs)
    q, k, v = (x[:, 0] for x in _qkv(t, 1, seed=4))
    cu = torch.tensor([0] + docs, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(docs),
                             max_seqlen_kv=max(docs))
    for kind in AttnMaskType:
        meaning = MEANING.get(kind.name)
        if meaning is None:
            with pytest.raises(ValueError, match=kind.name):
                _layer(AttnMaskType.causal)(q, k, v, None, attn_mask_type=kind, packed_seq_params=packed)
            continue
        want, start = [], 0
        for n in docs:  # Megatron's attention on each document alone, its mask spelled out
            part = [x[start:start + n, None] for x in (q, k, v)]
            want.append(_megatron(*part, _causal(n)[None, None] if meaning == "causal" else None)[:, 0])
            start += n
        want = torch.cat(want)
        for shape in ("[t, h, d]", "[t, 1, h, d]"):
            inputs = (q, k, v) if shape == "[t, h, d]" else (q[:, None], k[:, None], v[:, None])
            out = _layer(kind)(*inputs, None, packed_seq_params=packed)
            _assert_equal(out, want, f"THD {kind.name} {shape}")


# ---- inputs and config fields --------------------------------------------------------------------------------------
def test_inputs_of_the_wrong_shape_are_refused_naming_them():
    layer = _layer(AttnMaskType.causal)
    q, k, v = _qkv(6, 2)
    with pytest.raises(ValueError, match=r"query of shape \(6, 4, 16\) without packed_seq_params.*qkv_format 'thd'"):
        layer(q[:, 0], k[:, 0], v[:, 0], None)  # packed [t, h, d] without its documents: not an IndexError
    with pytest.raises(ValueError, match=r"key of shape \(5, 2, 2, 16\): expected \[6, 2, 2, 16\]"):
        layer(q, k[:5], v, None)  # keys of another length (a KV cache): not self-attention over the same tokens
    with pytest.raises(ValueError, match=r"query of shape \(6, 2, 3, 16\)"):
        layer(q[:, :, :3], k, v, None)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=4, max_seqlen_kv=4)
    with pytest.raises(ValueError, match=r"query of shape \(6, 2, 4, 16\) with packed_seq_params"):
        layer(q, k, v, None, packed_seq_params=packed)  # a batch of 2 is not THD's squeezed batch of 1
    with pytest.raises(ValueError, match="qkv_format 'sbhd'"):
        layer(q, k, v, None, packed_seq_params=dataclasses.replace(packed, qkv_format="sbhd"))


def test_parallel_sizes_are_checked_by_the_layer_itself(megatron_state):
    from cad_megatron import CadCoreAttention, plan_shape
    # Tensor parallelism: the layer takes its head slice; sizes that do not fit the world (1 here) or parallel_state
    # are refused, naming both.
    with pytest.raises(ValueError, match="tensor_model_parallel_size 2 x context_parallel_size 1 does not divide "
                                         "the world size 1"):
        CadCoreAttention(_config(tensor_model_parallel_size=2), 1, AttnMaskType.causal, "self", balance=False)
    # Pipeline parallelism: each stage's layers over its own group; nothing for the layer to refuse.
    config = _config(pipeline_model_parallel_size=2, pipeline_dtype=torch.float32)
    layer = CadCoreAttention(config, 1, AttnMaskType.causal, "self", balance=False)
    assert (layer.tp_size, layer.num_heads, layer.num_kv_heads) == (1, HEADS, GROUPS)
    # The head slice of one TP rank, as Megatron's SelfAttention splits them (KV heads replicated where TP > KV heads),
    # and what cannot be split.
    config = _config(num_attention_heads=8, num_query_groups=2, hidden_size=8 * HEAD_DIM)
    assert [plan_shape(config, tensor_parallel_size=t)[:2] for t in (1, 2, 4, 8)] == [(8, 2), (4, 1), (2, 1), (1, 1)]
    with pytest.raises(ValueError, match="num_attention_heads 8 is not a multiple of the tensor-parallel size 3"):
        plan_shape(config, tensor_parallel_size=3)
    config = _config(num_attention_heads=12, num_query_groups=6, hidden_size=12 * HEAD_DIM)
    with pytest.raises(ValueError, match="num_query_groups 6 and the tensor-parallel size 4"):
        plan_shape(config, tensor_parallel_size=4)
    # Context parallelism is CAD's own (test_cad_megatron_cp.py), but not in a world its size does not divide, nor
    # with CAD's local attention.
    from cad_megatron import CadCoreAttention
    config = _config(context_parallel_size=2)
    with pytest.raises(ValueError, match="context_parallel_size 2 does not divide the world size 1"):
        CadCoreAttention(config, 1, AttnMaskType.causal, "self")
    with pytest.raises(ValueError, match="balance=False with TransformerConfig.context_parallel_size 2"):
        CadCoreAttention(config, 1, AttnMaskType.causal, "self", balance=False)


def test_config_windows_and_fields_are_checked_not_truncated():
    from cad_megatron import CadCoreAttention, attach_plan
    bad = [
        (dict(window_size=(4.5, 0)), r"window_size must be a pair \(left, right\) of ints, got \(4.5, 0\)"),
        (dict(window_size=(4, 0.0)), r"window_size must be a pair.*got \(4, 0.0\)"),
        (dict(window_size=(True, 0)), "window_size must be a pair"),
        (dict(window_size=(4, 0, 1)), "window_size must be a pair"),
        (dict(window_size=(-2, 0)), r"window_size\[0\] \(left\) must be -1"),
        (dict(window_size=(2 ** 63, 0)), r"window_size\[0\] \(left\) must be -1 \(no limit\) or 0 to 2\*\*63 - 1"),
        (dict(window_size=(4, 3)), r"window_size\[1\] \(right\) is 3: CAD computes causal windows"),
        (dict(window_size=(4, -1)), r"window_size\[1\] \(right\) is -1"),
        (dict(window_size=(4, 0), window_attn_skip_freq=0), "window_attn_skip_freq must be >= 1"),
        (dict(window_size=(4, 0), window_attn_skip_freq=[1]), "window_attn_skip_freq has 1 entries, layer 2"),
        (dict(window_size=(4, 0), window_attn_skip_freq=[1, 2]), "one 0 or 1 per layer"),
        (dict(window_size=(4, 0), window_attn_skip_freq=2.0), "window_attn_skip_freq must be None, an int"),
        (dict(attention_dropout=0.1), "attention dropout 0.1"),
        (dict(num_query_groups=3), "num_attention_heads 4 is not a multiple of num_query_groups 3"),
    ]
    for changes, words in bad:
        config = _config(**changes)
        with pytest.raises(ValueError, match=words):
            CadCoreAttention(config, 2, AttnMaskType.causal, "self", balance=False)
    for scale in (float("nan"), 0.0, -1.0, float("inf"), True, "0.25"):
        with pytest.raises(ValueError, match="softmax_scale must be a finite number > 0"):
            CadCoreAttention(_config(), 1, AttnMaskType.causal, "self", softmax_scale=scale, balance=False)
    with pytest.raises(ValueError, match="sliding window .* with attn_mask_type no_mask"):  # at construction
        CadCoreAttention(_config(window_size=(4, 0)), 1, AttnMaskType.no_mask, "self", balance=False)
    # what is accepted: an int window on the layers the skip frequency (int or list) leaves windowed
    assert CadCoreAttention(_config(window_size=(4, 0)), 1, AttnMaskType.causal, "self").window == (4, 0)
    assert CadCoreAttention(_config(window_size=(-1, 0)), 1, AttnMaskType.causal, "self").window is None
    for skip, windows in ((2, [(4, 0), None]), ([0, 1], [None, (4, 0)])):
        config = _config(window_size=(4, 0), window_attn_skip_freq=skip)
        assert [CadCoreAttention(config, n, AttnMaskType.causal, "self").window for n in (1, 2)] == windows
    # attach_plan reads the same window, checked the same way, before any collective
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=4, max_seqlen_kv=4)
    with pytest.raises(ValueError, match=r"attach_plan: TransformerConfig.window_size must be a pair"):
        attach_plan(packed, _config(window_size=(4.5, 0)), ahead=False)
    # plan_shape (attach_plan's heads and dtype) reads the heads through the same checks
    from cad_megatron import plan_shape
    assert plan_shape(_config()) == (HEADS, GROUPS, HEAD_DIM, torch.float32)
    with pytest.raises(ValueError, match="num_attention_heads 4 is not a multiple of num_query_groups 3"):
        plan_shape(_config(num_query_groups=3))
    assert plan_shape(_config(), tensor_parallel_size=2) == (HEADS // 2, GROUPS // 2, HEAD_DIM, torch.float32)
