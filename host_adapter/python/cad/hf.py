"""Hugging Face transformers adapter: CAD as an attention implementation, with no change to the model code.

    import cad.hf
    cad.hf.register()   # "cad" (balanced through CAD plans) and "cad_local" (the same kernels, local only)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="cad")

Packed batches: the documents come from the `cu_seq_lens_q` keyword that transformers forwards to attention
functions (as flash_attention_2 receives it), or else from `position_ids` restarting at 0 at every document;
with neither, every row of the batch is one document. A plan is made at the model's first attention layer
(layer_idx 0) of every forward, on every rank (collective), and serves every layer's forward and backward.

A caller that runs a forward in pieces (e.g. two nano-batches through cad.ping_pong, each with its own plan)
passes each call's documents and plan itself, as layer keywords that transformers forwards to the attention
function: `cad_cu_seqlens` (int32 [documents + 1]) and, for "cad", `cad_plan` (made by cad.plan on every
rank). Neither is then derived nor remembered.
"""
import torch

from ._errors import CadError
from ._ops import varlen_attn
from ._plan import plan as make_plan

_state = {"plan": None, "key": None, "cu": None}


def _cu_seqlens(query, kwargs):
    batch, _, seq, _ = query.shape
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        return cu.to(torch.int32)
    positions = kwargs.get("position_ids")
    device = query.device
    if positions is None:
        return torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32, device=device)
    flat = positions.reshape(-1)
    starts = (flat == 0).nonzero().reshape(-1)
    row_starts = torch.arange(0, batch * seq, seq, device=flat.device)
    starts = torch.unique(torch.cat([starts, row_starts]))
    end = torch.tensor([batch * seq], device=flat.device)
    return torch.cat([starts, end]).to(torch.int32)


def _documents(module, query, kwargs):
    """cu_seqlens of this forward, computed once at layer 0 and reused by the other layers."""
    key = kwargs.get("cu_seq_lens_q", kwargs.get("position_ids"))
    if getattr(module, "layer_idx", 0) == 0 or _state["cu"] is None or _state["key"] is not key:
        _state["cu"], _state["key"] = _cu_seqlens(query, kwargs), key
        _state["plan"] = None
    return _state["cu"]


def _attention(module, query, key, value, attention_mask, *, distributed, dropout=0.0, scaling=None,
               is_causal=None, cad_cu_seqlens=None, cad_plan=None, **kwargs):
    if dropout:
        raise CadError("cad attention: attention dropout is not supported (set attention_dropout=0)")
    if kwargs.get("output_attentions"):
        raise CadError("cad attention: output_attentions is not supported")
    if cad_plan is not None and cad_cu_seqlens is None:
        raise CadError("cad attention: cad_plan was passed without the cad_cu_seqlens it was made for")
    if distributed and cad_cu_seqlens is not None and cad_plan is None:
        raise CadError("cad attention: cad_cu_seqlens was passed without its cad_plan (a plan is collective: "
                       "make it with cad.plan on every rank before the forward)")
    batch, heads, seq, dim = query.shape
    cu = _documents(module, query, kwargs) if cad_cu_seqlens is None else cad_cu_seqlens
    causal = module.is_causal if is_causal is None else is_causal
    q = query.transpose(1, 2).reshape(batch * seq, heads, dim).contiguous()
    k = key.transpose(1, 2).reshape(batch * seq, key.shape[1], dim).contiguous()
    v = value.transpose(1, 2).reshape(batch * seq, value.shape[1], dim).contiguous()
    plan = None
    if distributed and cad_plan is not None:
        plan = cad_plan
    elif distributed:
        if _state["plan"] is None:
            _state["plan"] = make_plan(cu, causal=causal)
        plan = _state["plan"]
    out = varlen_attn(q, k, v, cu, plan=plan, causal=causal, softmax_scale=scaling)
    return out.reshape(batch, seq, heads, dim), None


def cad_attention(module, query, key, value, attention_mask, **kwargs):
    """The "cad" attention function: CAD over the process group, one plan per forward."""
    return _attention(module, query, key, value, attention_mask, distributed=True, **kwargs)


def cad_local_attention(module, query, key, value, attention_mask, **kwargs):
    """The "cad_local" attention function: the same varlen backend, no distribution (for comparison)."""
    return _attention(module, query, key, value, attention_mask, distributed=False, **kwargs)


def current_plan():
    """The plan of the last forward's "cad" attention (for plan.stats), or None."""
    return _state["plan"]


def register(name="cad", local_name="cad_local"):
    """Register the attention functions (and a mask function that builds no dense mask) with transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, cad_attention)
    AttentionInterface.register(local_name, cad_local_attention)
    # Like flash attention: documents come from cu_seqlens / position_ids, never from a [T, T] mask.
    AttentionMaskInterface.register(name, flash_attention_mask)
    AttentionMaskInterface.register(local_name, flash_attention_mask)
