"""Hugging Face transformers adapter: CAD as an attention implementation, with no change to the model code.

    import cad.hf
    cad.hf.register()   # "cad" (balanced through CAD plans) and "cad_local" (the same kernels, local only)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="cad")

Packed batches: the documents come from the `cu_seq_lens_q` keyword that transformers forwards to attention
functions (as flash_attention_2 receives it), or else from `position_ids` restarting at 0 at every document;
with neither, every row of the batch is one document.

Plans belong to the micro-batch: the plan of a forward is derived from the tensor its documents come from
(`cu_seq_lens_q`, else `position_ids`), made by the first attention call that sees that tensor (on every rank:
collective) and reused by every later call that passes the same tensor -- the other layers, and the layers that
activation checkpointing recomputes inside the backward, which therefore make no plan of their own. It lives as
long as that tensor (the micro-batch's input) does. Refilling the tensor in place makes a new plan.

Plans made ahead: when micro-batch i+1 is loaded, `cad.hf.plan_ahead(model, position_ids=...)` (on every rank, in
the same order) derives its documents and queues its plan on the stack's planning thread (cad.plan(ahead=True)),
while micro-batch i computes; the forward that passes the same tensor finds the plan there and makes none at its
first layer.

Sliding windows: a layer whose attention function gets transformers' `sliding_window` keyword (Mistral, Qwen2 and
their kin pass it; None for a global layer), or else whose module or config has a `sliding_window`, attends to the
last `sliding_window` keys up to and including each query's own (transformers' mask: key > query - sliding_window),
i.e. cad's window_size=(sliding_window - 1, 0) (non-causal: (sliding_window - 1, sliding_window - 1), as
transformers' flash attention). A CAD plan holds one window, so a model that interleaves windowed and global
layers has two plans per micro-batch (one per mask), each made by the first layer of its kind, or both queued by
plan_ahead.

A caller that runs a forward in pieces (e.g. two nano-batches through cad.ping_pong, each with its own plan)
passes each call's documents and plan itself, as layer keywords that transformers forwards to the attention
function: `cad_cu_seqlens` (int32 [documents + 1]) and, for "cad", `cad_plan` (made by cad.plan on every
rank). Neither is then derived nor remembered. For a model with windowed and global layers `cad_plan` may be a
tuple (or list) of plans, one per mask, as plan_ahead returns them: each layer takes the plan made for its own
window (cad.plan(cu, window_size=(left, 0)) for a layer of sliding_window left + 1; no window for a global layer).

Documents longer than a rank (context parallelism for packed documents): a rank's tokens are pieces of documents
that go on on other ranks (cad.pack_documents' RankLayout). Pass `cad_plan=cad.hf.plan_pieces(model, layout.pieces)`
(plans from pieces, one per mask) without `cad_cu_seqlens`, and the layout's `position_ids`, which run on across a
cut: every layer attends each document whole, and RoPE sees one document. "cad_local" with such a plan attends each
piece alone (no other rank to reach).
"""
import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import _context
from . import _documents as _offsets
from ._errors import CadError
from ._ops import varlen_attn
from ._api import plan as make_plan
from ._api import plan_pieces as make_pieces_plan


class _State:
    """What the attention functions remember, owned by the default context (its `extras["hf"]`): the plans they
    make are the default context's, and go with it."""

    def __init__(self):
        # Documents source tensor (by identity) -> _Documents. Weak: an entry goes with the micro-batch's tensor.
        self.by_source = WeakIdKeyDictionary()
        # plan_ahead's entries that no forward has used yet, oldest first (weak references). A forward may get
        # another tensor than the one plan_ahead was given -- FSDP2's root module moves its forward's tensor
        # arguments to the GPU -- and then takes the oldest unused entry with the same documents instead of making
        # a plan at its first layer.
        self.unused_ahead = []
        # The plan of the last "cad" call, for current_plan() (statistics): it stays alive until the next call's
        # replaces it. Since plans hold only index tables between calls (their buffers are per call), that costs
        # little.
        self.last = None


def _state():
    return _context.default().extras.setdefault("hf", _State())


def _stamp(source):
    """What tells a source tensor's documents apart: its version and, on the host, its values (a refill through
    .data or .numpy() does not move the version; see cad._documents)."""
    return source._version, _offsets.fingerprint(source)


class _Documents:
    """One micro-batch's documents (cu_seqlens, derived once) and its plans by mask ((causal, window_size))."""

    def __init__(self, stamp, cu):
        self.stamp, self.cu, self.plans = stamp, cu, {}
        self.used = False  # by a forward (plan_ahead's entries wait in unused_ahead until then)


def _take_planned_ahead(cu):
    """The oldest unused plan_ahead entry with the documents of `cu`, marked used; None if there is none."""
    state = _state()
    waiting = [entry for entry in (ref() for ref in state.unused_ahead) if entry is not None and not entry.used]
    state.unused_ahead[:] = [weakref.ref(entry) for entry in waiting]
    if not waiting:
        return None
    documents = _context.default().documents  # what each tensor held when last read (see cad._documents)
    wanted = documents.offsets(cu, "cad attention")  # one read-back per micro-batch, only when an entry waits
    for entry in waiting:
        if documents.offsets(entry.cu, "cad.hf.plan_ahead") == wanted:
            entry.used = True
            return entry
    return None


def cu_seqlens_from_position_ids(position_ids):
    """cu_seqlens (int32 [documents + 1]) of packed rows `position_ids` [batch, seq] (or [seq]): a document starts
    wherever the positions restart at 0, and at every row's start (a row may begin inside a document). Reads
    the positions on their device (one host synchronisation, for the count of documents)."""
    rows = position_ids.reshape(-1, position_ids.shape[-1])
    batch, seq = rows.shape
    flat = rows.reshape(-1)
    starts = (flat == 0).nonzero().reshape(-1)
    row_starts = torch.arange(0, batch * seq, seq, device=flat.device)
    starts = torch.unique(torch.cat([starts, row_starts]))
    end = torch.tensor([batch * seq], device=flat.device)
    return torch.cat([starts, end]).to(torch.int32)


def _cu_seqlens(query, kwargs):
    batch, _, seq, _ = query.shape
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        return cu.to(torch.int32, copy=True)  # its own tensor: the entry must not hold its source alive
    positions = kwargs.get("position_ids")
    if positions is None:
        return torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32, device=query.device)
    return cu_seqlens_from_position_ids(positions.expand(batch, seq))


def _window_of_size(sliding_window, causal):
    """cad's window_size for transformers' sliding_window (keys (query - sliding_window, query], see the module
    docstring); (-1, -1) for None: no window."""
    if sliding_window is None:
        return (-1, -1)
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
        raise CadError(f"cad attention: sliding_window must be None or an int >= 1 (the keys a query sees, its own "
                       f"included), got {sliding_window!r}")
    return (sliding_window - 1, 0) if causal else (sliding_window - 1, sliding_window - 1)


def _layer_sliding_window(config, layer_idx):
    """A config's sliding window for one layer: none for a layer its layer_types call anything but
    "sliding_attention" (Qwen2's, Gemma's); the config's sliding_window otherwise (Mistral's: every layer)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is not None and layer_types is not None and layer_idx is not None and \
            layer_types[layer_idx] != "sliding_attention":
        return None
    return window


def _sliding_window(module, kwargs):
    """The layer's transformers sliding_window: the attention function's keyword when given (None there means a
    global layer), else the module's attribute, else its config's (for its layer)."""
    if "sliding_window" in kwargs:
        return kwargs["sliding_window"]
    if hasattr(module, "sliding_window"):
        return module.sliding_window
    config = getattr(module, "config", None)
    return None if config is None else _layer_sliding_window(config, getattr(module, "layer_idx", None))


def _model_windows(model, causal):
    """The window_size of every mask a model's attention layers use, in layer order, without repeats."""
    config = getattr(model, "config", model)
    layers = getattr(config, "num_hidden_layers", None) or 1
    windows = []
    for i in range(layers):
        w = _window_of_size(_layer_sliding_window(config, i), causal)
        if w not in windows:
            windows.append(w)
    return windows


def _documents(query, kwargs):
    """This micro-batch's _Documents, derived once from the tensor its documents come from (None: no such tensor,
    every row one document, derived per call)."""
    source = kwargs.get("cu_seq_lens_q")
    if source is None:
        source = kwargs.get("position_ids")
    if source is None:
        return None
    by_source = _state().by_source
    entry = by_source.get(source)
    stamp = _stamp(source)
    if entry is None or entry.stamp != stamp:
        cu = _cu_seqlens(query, kwargs)
        entry = _Documents(stamp, cu)
        ahead = _take_planned_ahead(cu)
        if ahead is not None:  # the same documents as a micro-batch planned ahead, in another tensor
            entry.plans = ahead.plans
        by_source[source] = entry
    entry.used = True
    return entry


def _plan_for_window(plans, causal, window, layer_idx):
    """The plan of `plans` (one per mask) made for this layer's mask: causal and window_left as the layer's."""
    left = window[0]
    for plan in plans:
        if plan.causal == bool(causal) and plan.window_left == left:
            return plan
    have = ", ".join(f"(causal={p.causal}, window_left={p.window_left})" for p in plans) or "none"
    raise CadError(f"cad attention: layer {layer_idx} (causal={bool(causal)}, window_left={left}) has no plan among "
                   f"the cad_plan tuple's: {have}; pass one plan per mask the model's layers use")


def _attention(module, query, key, value, attention_mask, *, distributed, dropout=0.0, scaling=None,
               is_causal=None, cad_cu_seqlens=None, cad_plan=None, **kwargs):
    if dropout:
        raise CadError("cad attention: attention dropout is not supported (set attention_dropout=0)")
    if kwargs.get("output_attentions"):
        raise CadError("cad attention: output_attentions is not supported")
    if cad_plan is not None and cad_cu_seqlens is None and not _from_pieces(cad_plan):
        raise CadError("cad attention: cad_plan was passed without the cad_cu_seqlens it was made for (only a plan "
                       "from pieces, cad.plan_pieces or cad.hf.plan_pieces, needs none)")
    if distributed and cad_cu_seqlens is not None and cad_plan is None:
        raise CadError("cad attention: cad_cu_seqlens was passed without its cad_plan (a plan is collective: "
                       "make it with cad.plan on every rank before the forward)")
    batch, heads, seq, dim = query.shape
    causal = module.is_causal if is_causal is None else is_causal
    window = _window_of_size(_sliding_window(module, kwargs), causal)
    if isinstance(cad_plan, (tuple, list)):
        cad_plan = _plan_for_window(cad_plan, causal, window, getattr(module, "layer_idx", None))
    plan, cu = cad_plan, cad_cu_seqlens
    if cu is None and plan is not None and not distributed:
        cu = _piece_boundaries(plan)  # local attention over a plan's pieces: each piece alone
    if cu is None and plan is None:
        documents = _documents(query, kwargs)
        if documents is None:
            if distributed:
                raise CadError("cad attention: no position_ids or cu_seq_lens_q reached the attention function, so "
                               "its documents and plan cannot be tied to the micro-batch; pass position_ids to the "
                               "model, or cad_plan and cad_cu_seqlens")
            cu = _cu_seqlens(query, kwargs)
        else:
            cu = documents.cu
            if distributed:
                plan = documents.plans.get((causal, window))
                if plan is None:
                    plan = documents.plans[(causal, window)] = make_plan(cu, causal=causal, window_size=window)
    if distributed:
        _state().last = plan
    q = query.transpose(1, 2).reshape(batch * seq, heads, dim).contiguous()
    k = key.transpose(1, 2).reshape(batch * seq, key.shape[1], dim).contiguous()
    v = value.transpose(1, 2).reshape(batch * seq, value.shape[1], dim).contiguous()
    out = varlen_attn(q, k, v, cu, plan=plan if distributed else None, causal=causal, window_size=window,
                      softmax_scale=scaling)
    return out.reshape(batch, seq, heads, dim), None


def _from_pieces(plan):
    """Whether cad_plan (a plan, or one per mask) was made from pieces: its calls take cu_seqlens=None."""
    plans = plan if isinstance(plan, (tuple, list)) else (plan,)
    return all(getattr(p, "cu_seqlens", 0) is None for p in plans)


def _piece_boundaries(plan):
    """cu_seqlens (int32, on the host) of a plan's pieces, each piece one document: what local attention ("cad_local")
    computes over a rank's pieces, with no other rank to reach."""
    lengths = [p[3] for p in plan.pieces]
    return torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)


def cad_attention(module, query, key, value, attention_mask, **kwargs):
    """The "cad" attention function: CAD over the process group, one plan per forward."""
    return _attention(module, query, key, value, attention_mask, distributed=True, **kwargs)


def cad_local_attention(module, query, key, value, attention_mask, **kwargs):
    """The "cad_local" attention function: the same varlen backend, no distribution (for comparison)."""
    return _attention(module, query, key, value, attention_mask, distributed=False, **kwargs)


def attention_shape(model, dtype=None):
    """(num_heads, num_kv_heads, head_dim, dtype) of a transformers model's attention calls, from its config
    (dtype: the given one, else the config's, else the parameters')."""
    config = getattr(model, "config", model)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if dtype is None:
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
    if dtype is None and hasattr(model, "parameters"):
        dtype = next(model.parameters()).dtype
    if dtype is None:
        raise CadError("cad.hf.plan_ahead: the attention dtype is unknown (give dtype=...)")
    return int(heads), int(kv_heads), int(head_dim), dtype


def plan_ahead(model, *, position_ids=None, cu_seq_lens_q=None, dtype=None, device=None, causal=True, tag=None):
    """Queue the plan of a micro-batch that is about to run through `model` (attn_implementation "cad"), on every
    rank in the same order, e.g. right after loading micro-batch i+1 while micro-batch i computes. Pass the very
    tensor the forward will get (position_ids, or cu_seq_lens_q): the plan is found by it. dtype: the attention's
    compute dtype when it differs from the model config's (mixed precision). Returns the cad.Plan; for a model
    whose layers use several masks (windowed and global layers, from its config's sliding_window and
    layer_types) one plan per mask is queued, all with this tag, and a tuple of them is returned in the order of
    the layers that first use them."""
    source = cu_seq_lens_q if cu_seq_lens_q is not None else position_ids
    if source is None:
        raise CadError("cad.hf.plan_ahead: give position_ids or cu_seq_lens_q (the tensor the forward will get)")
    if cu_seq_lens_q is not None:
        cu = cu_seq_lens_q.to(torch.int32, copy=True)
    else:
        cu = cu_seqlens_from_position_ids(position_ids)
    heads, kv_heads, head_dim, dtype = attention_shape(model, dtype)
    state = _state()
    entry = state.by_source.get(source)
    stamp = _stamp(source)
    if entry is None or entry.stamp != stamp:
        entry = state.by_source[source] = _Documents(stamp, cu)
        state.unused_ahead.append(weakref.ref(entry))
    plans = []
    for window in _model_windows(model, causal):
        plan = entry.plans.get((causal, window))
        if plan is None:
            plan = entry.plans[(causal, window)] = make_plan(
                entry.cu, causal=causal, window_size=window, num_heads=heads, num_kv_heads=kv_heads,
                head_dim=head_dim, dtype=dtype, device=device or source.device, ahead=True, tag=tag)
        plans.append(plan)
    return plans[0] if len(plans) == 1 else tuple(plans)


def plan_pieces(model, pieces, *, dtype=None, device=None, causal=True, ahead=False, tag=None, lane=0):
    """The plans of a micro-batch laid out as pieces (doc_id, doc_len, offset_in_doc, len) -- a document cut across
    ranks, cad.pack_documents' RankLayout.pieces --, one per mask the model's layers use (as plan_ahead), on every
    rank in the same order: cad.plan_pieces with the model's attention shapes. Pass the result to the forward as the
    `cad_plan` keyword (no cad_cu_seqlens: a plan from pieces needs none), and the layout's position_ids, which run
    on across a cut, so that RoPE sees one document:

        plan = cad.hf.plan_pieces(model, layout.pieces)
        out = model(input_ids=ids, position_ids=layout.position_ids()[None], cad_plan=plan)

    ahead/tag/lane as cad.plan_pieces. Returns a cad.Plan, or a tuple of plans (windowed and global layers)."""
    heads, kv_heads, head_dim, dtype = attention_shape(model, dtype)
    plans = [make_pieces_plan(list(pieces), causal=causal, window_size=window, num_heads=heads, num_kv_heads=kv_heads,
                              head_dim=head_dim, dtype=dtype, device=device, ahead=ahead, tag=tag, lane=lane)
             for window in _model_windows(model, causal)]
    return plans[0] if len(plans) == 1 else tuple(plans)


def current_plan():
    """The plan of the last "cad" attention call (for plan.stats), or None."""
    return _state().last


def register(name="cad", local_name="cad_local"):
    """Register the attention functions (and a mask function that builds no dense mask) with transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, cad_attention)
    AttentionInterface.register(local_name, cad_local_attention)
    # Like flash attention: documents come from cu_seqlens / position_ids, never from a [T, T] mask.
    AttentionMaskInterface.register(name, flash_attention_mask)
    AttentionMaskInterface.register(local_name, flash_attention_mask)
