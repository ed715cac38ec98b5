"""CAD as Megatron-Core's core attention (megatron-core from PyPI, 0.16 and 0.19; no Megatron-LM fork).

    from cad_megatron import cad_gpt_layer_spec, init_cad, attach_plan
    init_cad()                                   # after parallel_state.initialize_model_parallel(...)
    model = GPTModel(config, cad_gpt_layer_spec(normalization="RMSNorm"), vocab_size=..., ...)
    packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=m, max_seqlen_kv=m)
    packed = attach_plan(packed, config, cu_seqlens_host=cu_cpu, ahead=True, tag=i)   # optional, per micro-batch
    loss = model(tokens, position_ids, None, labels=labels, packed_seq_params=packed)

Megatron-Core's extension point is the layer spec: `SelfAttention`'s `SelfAttentionSubmodules.core_attention` is
a class (or any callable) that the attention layer builds with the keywords config, layer_number,
attn_mask_type, attention_type, cp_comm_type, softmax_scale, pg_collection, and calls as
`core_attention(query, key, value, attention_mask, attn_mask_type=, attention_bias=, packed_seq_params=)`.
With packed documents (`PackedSeqParams(qkv_format="thd")`) the layer hands it query [t, np, hn] and key/value
[t, ng, hn] (batch dimension squeezed, RoPE applied per document from cu_seqlens) and reshapes what it returns
to [t, 1, np * hn]; without, [s, b, np, hn] / [s, b, ng, hn] and it expects [s, b, np * hn].
`CadCoreAttention` is such a module: it runs `cad.varlen_attn` over the documents of `cu_seqlens_q`, balanced
across the data-parallel group's ranks by a CAD plan (or locally, on the project's kernels, without one).

Plans belong to the micro-batch, as the PackedSeqParams do:
- `attach_plan(packed_seq_params, config, ...)` returns a `CadPackedSeqParams` (PackedSeqParams plus
  `cad_plan`) whose plan the training loop asks for once per micro-batch, on every rank in the same order --
  ahead (`ahead=True`, `tag=` the micro-batch's index) for micro-batch i+1 while micro-batch i computes, from a
  host copy of cu_seqlens so that nothing reads the GPU back;
- otherwise every layer finds the plan that the micro-batch's first CAD layer made from
  `packed_seq_params.cu_seqlens_q` (collective at that layer: every rank gets there), remembered by that tensor
  (weakly: it goes with the micro-batch's tensor; recomputed layers reuse it and make none).
Either way every forward keeps its plan alive until its backward (cad's rule).

Batches without packed_seq_params ([s, b] sequences, each one document) run CAD's local attention: equal-length
rows cost every rank the same, so there is nothing to balance. Every Megatron-Core mask type is honoured exactly or
refused naming it (cad_megatron_checks): causal, causal_bottom_right (the same in self-attention), padding_causal,
no_mask and padding are computed; arbitrary is refused. An attention_mask is read, never ignored: with causal or
no_mask it must be that type's own mask; with padding or padding_causal a padding mask ([s, b] input), whose
padding tokens are left out of their row's document (as Transformer Engine unpads; a padding token's output is
zero); with packed_seq_params (THD) none (the documents are cu_seqlens). Anything else -- per-document or per-head
masks, attention bias, attention dropout, softmax offsets (off-by-one/learnable), padded THD without context
parallelism (cu_seqlens_q_padded unlike cu_seqlens_q), float or look-ahead windows -- is refused at construction
or call, naming what. Sliding windows (config.window_size, window_attn_skip_freq) run through plans made for the
window (one per window kind).

Parallelism: `init_cad()` makes the process's cad.Context over its CAD group (`cad_group()`): Megatron's
data-parallel group with the context-parallel ranks, i.e. the ranks of this rank's tensor-parallel index and
pipeline stage that hold distinct tokens. Every plan of the layers and of attach_plan is that context's.
- Tensor parallelism (size t): the ranks of a TP group hold the same tokens and a slice of the heads each; the layer
  takes its slice as Megatron's SelfAttention hands it (Hq / t query heads, Hkv / t KV heads, or one KV head
  replicated where t > Hkv; other sizes refused). Each TP index runs CAD over its own group with the same plan (the
  same documents, a deterministic balancer), made per micro-batch ahead as without TP: no collective across the TP
  group, the exchanges move a head slice. Sequence parallelism around attention is unchanged (its gather before
  linear_qkv hands attention every token).
- Pipeline parallelism: each stage's layers run CAD over that stage's group, in the schedule's order (1F1B mixes
  forwards and backwards; every rank of a stage's group runs the same order).
- Context parallelism (context_parallel_size > 1): CAD is the context parallelism (cad_megatron_cp): the layer maps
  its THD tokens -- Megatron's own padded head/tail layout (cu_seqlens_q_padded), or CAD's unpadded layout from
  cad_megatron_cp.pack_for_context_parallel -- to pieces of whole documents and attends each document whole across
  the ranks holding it, balanced over data x context; padding tokens are never read (outputs and gradients zero).
  RoPE is exact in both layouts: Megatron's own for its layout, each token's position in its document for CAD's
  (cad_megatron_rope).

`PerDocumentDotProductAttention` is Megatron-Core's own local attention (`DotProductAttention`, which refuses
packed input) run once per document of a THD batch: the reference the tests and train_gpt_cad.py compare CAD
against. Its memory is O(heads x longest document^2): short documents only.
`megatron_cpu_support()` makes Megatron-Core's local attention run on the CPU (see there).
"""
import copy
import dataclasses
import functools
import math
from typing import Any, Optional

import torch
from torch.utils.weak import WeakIdKeyDictionary

import cad
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.module import MegatronModule

import cad_megatron_checks as checks
import cad_megatron_cp as cp
import cad_megatron_rope as rope

__all__ = ["CadCoreAttention", "CadPackedSeqParams", "PerDocumentDotProductAttention", "attach_plan",
           "cad_context", "cad_gpt_layer_spec", "cad_group", "init_cad", "megatron_cpu_support", "packed_seq_params",
           "plan_shape", "plans_of", "shutdown_cad", "use_cad"]


@dataclasses.dataclass
class CadPackedSeqParams(PackedSeqParams):
    """Megatron-Core's PackedSeqParams plus the micro-batch's cad.Plan (made by attach_plan) and, under context
    parallelism, its tokens as pieces of documents (cad_megatron_cp.CpLayout: CAD's layout, or Megatron's mapped by
    attach_plan) and, under CAD's layout with RoPE, each token's (query, key) rotary embedding for core attention to
    apply (cad_megatron_rope; set by the layer per call)."""
    cad_plan: Optional[Any] = None
    cad_cp: Optional[Any] = None
    cad_rotary: Optional[Any] = None


def _window_of(config, layer_number):
    """The layer's sliding window as (left, 0) (PyTorch's and Megatron's meaning), or None (checked)."""
    return checks.config_window(config, max(1, layer_number), f"CadCoreAttention (layer {max(1, layer_number)})")


def _compute_dtype(config, compute_dtype=None):
    if compute_dtype is not None:
        return compute_dtype
    if config.bf16:
        return torch.bfloat16
    if config.fp16:
        return torch.float16
    return config.params_dtype


class CadCoreAttention(MegatronModule):
    """Megatron-Core core attention on CAD (see the module's docstring). Constructor and forward as
    Megatron-Core's DotProductAttention / TEDotProductAttention; extra keywords (bind them with
    functools.partial, as cad_gpt_layer_spec does): `balance` (False: never plan, CAD's local attention on the
    same kernels -- the unbalanced baseline) and `compute_dtype` (None: the inputs' dtype; CAD's CUDA kernels
    take bf16). Mask types and attention masks: cad_megatron_checks (each honoured exactly or refused)."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type="self", attention_dropout=None,
                 softmax_scale=None, cp_comm_type=None, pg_collection=None, *, balance=True, compute_dtype=None):
        super().__init__(config=config)
        self.layer_number = max(1, layer_number)
        self.attention_type = attention_type
        self.balance = bool(balance)
        self.compute_dtype = compute_dtype
        what = self._what = f"CadCoreAttention (layer {self.layer_number})"
        if attention_type != "self":
            raise ValueError(f"{what}: attention_type '{attention_type}': CAD computes self-attention over packed "
                             f"documents only")
        softmax_scale = checks.check_attention_options(config, attention_dropout, softmax_scale, what)
        if not self.balance and getattr(config, "context_parallel_size", 1) != 1:
            raise ValueError(f"{what}: balance=False with TransformerConfig.context_parallel_size "
                             f"{config.context_parallel_size}: CAD's local attention cannot attend a document across "
                             f"the context-parallel ranks (balance=True plans it)")
        self.tp_size, self.cp_size = checks.check_parallel(config, pg_collection, what)
        self.attn_mask_type = checks.mask_type(attn_mask_type, what)
        # This rank's head slice: SelfAttention hands it heads / tp query heads and groups / tp KV heads (its config
        # says num_query_groups = tp where it replicates fewer KV heads over the TP ranks).
        self.num_heads, self.num_kv_heads, self.head_dim = checks.check_heads(config, what, self.tp_size)
        # Megatron's DotProductAttention divides the scale by layer_number under apply_query_key_layer_scaling and
        # multiplies it back inside its fp32 softmax: the same probabilities. CAD computes in fp32 throughout.
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.window = _window_of(config, layer_number)
        self._causal(None)  # a window on a layer whose mask type is not causal: refused here, not at the first call

    def _causal(self, attn_mask_type):
        kind = checks.mask_type(self.attn_mask_type if attn_mask_type is None else attn_mask_type, self._what)
        if kind in checks.CAUSAL:
            return kind, True
        if self.window is not None:
            raise ValueError(f"{self._what}: a sliding window (TransformerConfig.window_size) with attn_mask_type "
                             f"{kind.name} (CAD computes causal windows only)")
        return kind, False

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        if kwargs:
            raise TypeError(f"CadCoreAttention.forward: unexpected keywords {sorted(kwargs)}")
        what = self._what
        if attention_bias is not None:
            raise ValueError(f"{what}: attention_bias is not supported")
        kind, causal = self._causal(attn_mask_type)
        window = self.window if self.window is not None else ((-1, 0) if causal else (-1, -1))
        shape = (self.num_heads, self.num_kv_heads, self.head_dim, what)
        if packed_seq_params is not None:
            if packed_seq_params.qkv_format != "thd":
                raise ValueError(f"{what}: packed_seq_params.qkv_format '{packed_seq_params.qkv_format}' (only 'thd' "
                                 f"packs documents)")
            if attention_mask is not None:
                raise ValueError(f"{what}: an attention_mask with packed_seq_params (THD): the documents are "
                                 f"packed_seq_params.cu_seqlens_q, attn_mask_type {kind.name} their mask; pass "
                                 f"attention_mask=None")
            q, k, v = checks.thd_inputs(query, key, value, *shape)
            tokens = q.shape[0]
            layout = cp.layout_of(packed_seq_params, self.cp_size, tokens, what)
            if layout is not None:  # documents across ranks (context parallelism): attended whole through pieces
                if not self.balance:
                    raise ValueError(f"{what}: balance=False with packed_seq_params.cad_cp (pieces of documents cut "
                                     f"across ranks): CAD's local attention cannot attend them whole")
                rotary = getattr(packed_seq_params, "cad_rotary", None)
                if rotary is not None:  # RoPE at each token's position in its document (cad_megatron_rope)
                    q, k = rope.apply_rotary(q, k, rotary, self.config)
                return self._attend_layout(q, k, v, layout, packed_seq_params, causal, window).reshape(tokens, -1)
            _check_packed(packed_seq_params)
            cu, plan = packed_seq_params.cu_seqlens_q, None
            if self.balance:
                plan = _plan_for(packed_seq_params, causal, window, tokens)
                if plan is not None and plan.cu_seqlens is not None:
                    cu = plan.cu_seqlens  # the plan's own tensor (host copy): no GPU read-back per layer
            return self._attend(q, k, v, cu, plan, causal, window).reshape(tokens, -1)
        if self.cp_size > 1:
            raise ValueError(f"{what}: context_parallel_size {self.cp_size} without packed_seq_params: CAD's context "
                             f"parallelism takes packed documents (PackedSeqParams with qkv_format 'thd', Megatron's "
                             f"THD layout or cad_megatron_cp.pack_for_context_parallel's)")
        s, b = checks.sbhd_inputs(query, key, value, *shape)
        kept = checks.kept_tokens(attention_mask, kind, s, b, what)
        q, k, v = (t.transpose(0, 1).reshape(b * s, t.shape[2], t.shape[3]) for t in (query, key, value))
        if kept is None:  # every row one document of s tokens
            out = self._attend(q, k, v, _rows_cu_seqlens(b, s), None, causal, window)
        else:  # padding: each row's real tokens one document; a padding token's output is zero
            if self.window is not None:
                raise ValueError(f"{what}: a padding attention_mask on a sliding-window layer (Megatron-Core's "
                                 f"window mask leaves the padding out; CAD refuses rather than choose)")
            index = kept.reshape(-1).nonzero().squeeze(1)
            counts = kept.sum(1, dtype=torch.int32).cpu()
            cu = torch.cat([torch.zeros(1, dtype=torch.int32), counts.cumsum(0, dtype=torch.int32)])
            real = self._attend(*(t.index_select(0, index) for t in (q, k, v)), cu, None, causal, window)
            out = real.new_zeros(b * s, *real.shape[1:]).index_copy(0, index, real)
        return out.view(b, s, -1).transpose(0, 1).contiguous()  # [s, b, np * hn]

    def _attend_layout(self, q, k, v, layout, p, causal, window):
        """Attention over the real tokens of `layout` (pieces of whole documents); padding tokens' outputs zero."""
        plan = cp.plan_for_layout(layout, getattr(p, "cad_plan", None), causal, _window_left(window, causal), window,
                                  q.device)
        if layout.real is None:
            return self._attend(q, k, v, None, plan, causal, window)
        real = layout.real_on(q.device)
        out = self._attend(*(t.index_select(0, real) for t in (q, k, v)), None, plan, causal, window)
        return out.new_zeros(layout.tokens, *out.shape[1:]).index_copy(0, real, out)

    def _attend(self, q, k, v, cu, plan, causal, window):
        dtype = q.dtype
        if self.compute_dtype is not None:
            q, k, v = (t.to(self.compute_dtype) for t in (q, k, v))
        return cad.varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), cu, plan=plan, causal=causal,
                               window_size=window, softmax_scale=self.softmax_scale).to(dtype)


@functools.lru_cache(maxsize=64)
def _rows_cu_seqlens(rows, length):
    return torch.arange(0, (rows + 1) * length, length, dtype=torch.int32)


def _check_packed(p):
    if p.cu_seqlens_kv is not None and p.cu_seqlens_kv is not p.cu_seqlens_q and not torch.equal(
            p.cu_seqlens_kv, p.cu_seqlens_q):
        raise ValueError("CadCoreAttention: cu_seqlens_kv differs from cu_seqlens_q (self-attention over the same "
                         "packed documents only)")
    padded = p.cu_seqlens_q_padded
    if padded is not None and padded is not p.cu_seqlens_q and not torch.equal(padded, p.cu_seqlens_q):
        raise ValueError("CadCoreAttention: padded THD (cu_seqlens_q_padded unlike cu_seqlens_q) is not supported")


# cu_seqlens_q tensor (by identity) -> (its version, {(causal, window): plan}): the plans the micro-batch's first
# CAD layer made, for the other layers (and recomputed ones) of the same micro-batch.
_lazy_plans = WeakIdKeyDictionary()


def _plan_for(p, causal, window, tokens):
    attached = getattr(p, "cad_plan", None)
    if attached is not None and attached.causal == causal and attached.window_left == _window_left(window, causal):
        if attached.tokens != tokens:
            raise ValueError(f"CadCoreAttention: the micro-batch's cad_plan covers {attached.tokens} tokens, the "
                             f"layer got {tokens}: attach_plan(...) was given other documents than "
                             f"packed_seq_params.cu_seqlens_q")
        return attached
    cu = p.cu_seqlens_q
    entry = _lazy_plans.get(cu)
    if entry is None or entry[0] != cu._version:
        entry = _lazy_plans[cu] = (cu._version, {})
    plans = entry[1]
    key = (causal, tuple(window))
    if key not in plans:
        plans[key] = cad_context().plan(cu, causal=causal, window_size=window)  # collective here (every rank)
    return plans[key]


def plans_of(packed_seq_params):
    """The cad.Plans a micro-batch's layers used so far: the attached one, then those its first layers made."""
    plans = [packed_seq_params.cad_plan] if getattr(packed_seq_params, "cad_plan", None) is not None else []
    layout = getattr(packed_seq_params, "cad_cp", None)
    if layout is not None:  # context parallelism: the plans its first layers made from the pieces
        return plans + list(layout.plans.values())
    entry = _lazy_plans.get(packed_seq_params.cu_seqlens_q)
    return plans + (list(entry[1].values()) if entry is not None else [])


def _window_left(window, causal):
    return window[0] if window is not None else -1


def plan_shape(config, compute_dtype=None, tensor_parallel_size=None):
    """(num_heads, num_kv_heads, head_dim, dtype) of CadCoreAttention's calls for `config` on one tensor-parallel
    rank (what cad.plan's ahead planning needs), read through the layer's own checks: the rank's head slice.
    tensor_parallel_size: None reads config.tensor_model_parallel_size."""
    if tensor_parallel_size is None:
        tensor_parallel_size = getattr(config, "tensor_model_parallel_size", 1)
    tensor_parallel_size = checks._int(tensor_parallel_size, "tensor_model_parallel_size", "plan_shape", 1)
    heads, kv_heads, head_dim = checks.check_heads(config, "plan_shape", tensor_parallel_size)
    return heads, kv_heads, head_dim, _compute_dtype(config, compute_dtype)


def attach_plan(packed_seq_params, config, *, cu_seqlens_host=None, ahead=True, tag=None, device=None,
                compute_dtype=None, causal=True, window_size=None, cu_seqlens_padded_host=None):
    """packed_seq_params (a micro-batch's, qkv_format 'thd') as CadPackedSeqParams carrying cad.plan for its
    documents: on every rank, once per micro-batch, in the same order. cu_seqlens_host: a CPU copy of
    cu_seqlens_q (else it is read back from the device once). ahead=True makes the plan on CAD's planning thread
    (tag: the micro-batch's number, compared across ranks). window_size: the window of the layers this plan serves
    (default: config.window_size when every layer is windowed, else none).

    Under context parallelism (config.context_parallel_size > 1, or packed_seq_params from
    cad_megatron_cp.pack_for_context_parallel) the plan is made from the micro-batch's pieces over the data x
    context group, and the returned params carry them (cad_cp): cu_seqlens_padded_host is a CPU copy of
    cu_seqlens_q_padded where Megatron's layout pads (else it is read back once)."""
    if packed_seq_params.qkv_format != "thd":
        raise ValueError(f"attach_plan: qkv_format '{packed_seq_params.qkv_format}' (packed documents are 'thd')")
    _, cp_size = checks.check_parallel(config, None, "attach_plan")
    layout = cp.layout_of(packed_seq_params, cp_size, None, "attach_plan", cu_seqlens_host=cu_seqlens_host,
                          cu_seqlens_padded_host=cu_seqlens_padded_host)
    if layout is None:
        _check_packed(packed_seq_params)
    cu = cu_seqlens_host if cu_seqlens_host is not None else packed_seq_params.cu_seqlens_q
    if window_size is None:
        window = checks.config_window(config, 1, "attach_plan") if config.window_attn_skip_freq is None else None
        window_size = window if window is not None else ((-1, 0) if causal else (-1, -1))
    heads, kv_heads, head_dim, dtype = plan_shape(config, compute_dtype)
    device = torch.device(device) if device is not None else packed_seq_params.cu_seqlens_q.device
    shape = dict(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, device=device)
    if layout is None:
        plan = cad_context().plan(cu, causal=causal, window_size=window_size, ahead=ahead, tag=tag if ahead else None,
                                  **shape)
    else:
        plan = cad_context().plan_pieces(layout.pieces, causal=causal, window_size=window_size, device=device)
        if ahead:
            plan.make_ahead(tag=tag, **shape)
        else:
            plan.make(**shape)
    values = {f.name: getattr(packed_seq_params, f.name) for f in dataclasses.fields(packed_seq_params) if f.init}
    values["cad_plan"] = plan
    values["cad_cp"] = layout
    values["cad_rotary"] = None
    return CadPackedSeqParams(**values)


def packed_seq_params(doc_lengths, device, **attach):
    """(PackedSeqParams for the documents `doc_lengths` packed in order on `device`, their cu_seqlens on the
    host). With attach_plan's keywords (config=..., ...), the CadPackedSeqParams with its plan."""
    cu_host = torch.tensor([0] + list(doc_lengths), dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu = cu_host.to(device)
    longest = max(doc_lengths)
    p = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                        max_seqlen_kv=longest)
    if attach:
        p = attach_plan(p, attach.pop("config"), cu_seqlens_host=cu_host, **attach)
    return p, cu_host


def use_cad(layer_spec, **module_options):
    """A copy of a GPT layer spec (a TransformerLayer ModuleSpec, or a block spec with layer_specs) whose
    self-attention's core_attention is CadCoreAttention (module_options: balance, compute_dtype) and whose
    SelfAttention hands RoPE under CAD's context-parallel layout to it per token (cad_megatron_rope.CadRotary;
    unchanged otherwise)."""
    spec = copy.deepcopy(layer_spec)
    layers = getattr(getattr(spec, "submodules", None), "layer_specs", None) or getattr(spec, "layer_specs", None)
    for layer in layers if layers is not None else [spec]:
        attention = layer.submodules.self_attention
        submodules = getattr(attention, "submodules", None)
        if submodules is None or not hasattr(submodules, "core_attention") or not hasattr(submodules, "linear_qkv"):
            raise ValueError(f"use_cad: the layer's self_attention ({getattr(attention, 'module', attention)}) has no "
                             f"SelfAttentionSubmodules.core_attention (multi-latent attention is not supported)")
        submodules.core_attention = functools.partial(CadCoreAttention, **module_options) if module_options \
            else CadCoreAttention
        attention.module = rope.with_cad_rotary(attention.module)
    return spec


def cad_gpt_layer_spec(*args, balance=True, compute_dtype=None, **kwargs):
    """get_gpt_layer_local_spec(*args, **kwargs) (Megatron-Core's local, non-Transformer-Engine GPT layer) with
    CadCoreAttention as its core attention."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    options = {}
    if not balance:
        options["balance"] = False
    if compute_dtype is not None:
        options["compute_dtype"] = compute_dtype
    return use_cad(get_gpt_layer_local_spec(*args, **kwargs), **options)


def cad_group():
    """(group, ranks): the torch.distributed group CAD spans for this rank, and its global ranks, after
    parallel_state.initialize_model_parallel. It is Megatron-Core's data-parallel group with the context-parallel
    ranks: the ranks of this rank's tensor-parallel index and pipeline stage that hold distinct tokens. With
    tensor parallel size t there are t such groups per stage, one per TP index (each CAD over its head slice);
    with pipeline parallel size p, p x t of them (each stage's layers over that stage's ranks)."""
    from megatron.core import parallel_state as ps
    with_cp = ps.get_context_parallel_world_size() > 1
    group = ps.get_data_parallel_group(with_context_parallel=with_cp)
    import torch.distributed as dist
    return group, tuple(dist.get_process_group_ranks(group))


_state = {}  # "context": the cad.Context of this process's CAD group (init_cad), "ranks": its global ranks


def init_cad(**cad_init_kwargs):
    """The cad.Context over this rank's CAD group (cad_group(): the data x context ranks of its tensor-parallel
    index and pipeline stage), after parallel_state.initialize_model_parallel, for every CadCoreAttention and
    attach_plan of the process; returns it. The keywords are cad.Context's (balancer=..., timeout_ms=...). Called
    on every rank (it is collective over each group at its first plan). A second call closes the first context.
    Every rank of one TP group makes the same plans from the same documents (the balancer is deterministic), so
    the TP ranks' exchanges carry their own head slices of the same tasks."""
    group, ranks = cad_group()
    shutdown_cad()
    _state["context"], _state["ranks"] = cad.Context(group, **cad_init_kwargs), ranks
    return _state["context"]


def cad_context():
    """The cad.Context init_cad made (CadCoreAttention's and attach_plan's plans are its plans)."""
    context = _state.get("context")
    if context is None:
        raise ValueError("cad_megatron: no CAD context: call cad_megatron.init_cad() on every rank after "
                         "parallel_state.initialize_model_parallel(...), before the first balanced CadCoreAttention "
                         "or attach_plan")
    return context


def shutdown_cad():
    """Close init_cad's context (its stacks and plans); a later init_cad makes a new one."""
    context = _state.pop("context", None)
    _state.pop("ranks", None)
    if context is not None:
        context.close()


# ---- the reference: Megatron-Core's own local attention, one document at a time ------------------------
class PerDocumentDotProductAttention(DotProductAttention):
    """Megatron-Core's DotProductAttention (the local spec's core attention, which refuses packed input) run on
    each document of a THD batch as its own [s_i, 1, h, d] sequence, with an explicit causal (or sliding-window)
    mask on the inputs' device. Without packed_seq_params it is DotProductAttention itself."""

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        if packed_seq_params is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias, None)
        if query.dim() == 4:
            query, key, value = (t.squeeze(1) for t in (query, key, value))
        _check_packed(packed_seq_params)
        kind = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        causal = kind in checks.CAUSAL
        cu = packed_seq_params.cu_seqlens_q.tolist()
        out = []
        for a, b in zip(cu, cu[1:]):
            if b == a:
                continue
            n = b - a
            mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=query.device), 1)[None, None] \
                if causal else None
            out.append(super().forward(query[a:b, None], key[a:b, None], value[a:b, None], mask, kind,
                                       attention_bias, None)[:, 0])
        return torch.cat(out)  # [t, np * hn]


class _HostMemoryBuffer:
    """parallel_state's global memory buffer on the tensors' own device (Megatron-Core allocates it on
    torch.cuda.current_device())."""

    def __init__(self):
        self.buffer = {}

    def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
        return torch.empty(tuple(tensor_shape), dtype=dtype)


def megatron_cpu_support():
    """Let Megatron-Core's local layers run on the CPU, after parallel_state.initialize_model_parallel: its
    DotProductAttention allocates the score matrix's input from parallel_state's global memory buffer, which lives
    on torch.cuda.current_device() (replaced by one that allocates on the CPU), and forks the CUDA RNG tracker
    around attention dropout (replaced by Megatron's own inference tracker, whose fork does nothing: the models
    here have no attention dropout). RoPE still needs CUDA in megatron-core (its inv_freq moves to
    torch.cuda.current_device()): on the CPU use position_embedding_type='learned_absolute' or 'none', or
    cad_megatron_rope.rope_on_cpu(model). Also,
    build DotProductAttention's mask on the CPU (PerDocumentDotProductAttention does; its default causal mask is
    made on "cuda")."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as tp_random
    parallel_state._GLOBAL_MEMORY_BUFFER = _HostMemoryBuffer()
    tp_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
