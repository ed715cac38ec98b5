"""The trainers' attention implementations registered with transformers besides cad.hf's "cad" and
"cad_local": "torch_varlen" (torch.nn.attention.varlen.varlen_attn) and "fa4" (FlashAttention-4 through
cad.fa4, imported only when chosen); and the attention clock that times them as cad.attention_time() times CAD's.
"""
import time

import torch


class AttentionClock:
    """Seconds in the torch_varlen attention calls (forward and backward), as cad.attention_time() counts CAD's:
    wall time, with CUDA waited for around every call when `sync` (not under ping-pong on CUDA, see train_one)."""
    seconds = 0.0
    sync = False
    started = None

    @classmethod
    def now(cls, device):
        if cls.sync and device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    @classmethod
    def take(cls):
        seconds, cls.seconds = cls.seconds, 0.0
        return seconds


class _BackwardStarts(torch.autograd.Function):
    """Identity on the attention output: its backward runs just before the attention's backward."""

    @staticmethod
    def forward(ctx, o):
        return o.view_as(o)

    @staticmethod
    def backward(ctx, d_o):
        AttentionClock.started = AttentionClock.now(d_o.device)
        return d_o


class _BackwardEnds(torch.autograd.Function):
    """Identity on q, k, v: its backward runs once the attention's backward has produced all three gradients."""

    @staticmethod
    def forward(ctx, q, k, v):
        return q.view_as(q), k.view_as(k), v.view_as(v)

    @staticmethod
    def backward(ctx, d_q, d_k, d_v):
        if AttentionClock.started is not None:
            AttentionClock.seconds += AttentionClock.now(d_q.device) - AttentionClock.started
            AttentionClock.started = None
        return d_q, d_k, d_v


def torch_varlen_function():
    """torch.nn.attention.varlen.varlen_attn (torch >= 2.9), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def torch_varlen_unavailable(device, window=-1):
    """Why the torch_varlen baseline cannot run here (a sentence), or None. window: --window (a windowed model
    needs a varlen_attn that takes window_size, torch >= 2.11)."""
    if device.type != "cuda":
        return "torch_varlen: torch.nn.attention.varlen.varlen_attn runs on CUDA only (this run is on the CPU)"
    if torch_varlen_function() is None:
        return f"torch_varlen: torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn (torch >= 2.9)"
    if window >= 0 and "window_size" not in _varlen_parameters(torch_varlen_function()):
        return (f"torch_varlen: torch {torch.__version__}'s varlen_attn takes no window_size (torch >= 2.11), which "
                f"--window {window} needs")
    return None


def layer_window_left(config, layer_idx):
    """A decoder layer's window left from the model config as build_model sets it (sliding_window = left + 1 and
    layer_types); -1 for a global layer or a model without windows."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if window is None or (types is not None and types[layer_idx] != "sliding_attention"):
        return -1
    return window - 1


# id(cu_seqlens) -> (cu_seqlens, longest document): read back (or set by make_nanos) once per micro-batch, not
# once per layer
_max_lengths = {}


def remember_longest(cu, longest):
    """Record the longest document of cu_seqlens `cu` (known on the host when the micro-batch is made), so that
    the local attention calls over it need no GPU read-back."""
    if len(_max_lengths) > 8:
        _max_lengths.clear()
    _max_lengths[id(cu)] = (cu, longest)


def _longest(cu):
    cached = _max_lengths.get(id(cu))
    if cached is None or cached[0] is not cu:
        remember_longest(cu, int((cu[1:] - cu[:-1]).max().item()))
        cached = _max_lengths[id(cu)]
    return cached[1]


def _packed_row(name, query, key, value, dropout, cad_cu_seqlens, position_ids):
    """What both local attention functions take from transformers' call: THD q/k/v of the one packed row, the
    documents (cad_cu_seqlens, else position_ids restarts), the longest document, and whether the call is timed
    (the attention clock's host calls stay out of compiled graphs)."""
    if dropout:
        raise ValueError(f"{name} attention: attention dropout is not supported")
    batch, heads, seq, dim = query.shape
    if batch != 1:
        raise ValueError(f"{name} attention: expected one packed row, got a batch of {batch}")
    if cad_cu_seqlens is None:
        from cad.hf import cu_seqlens_from_position_ids  # the package's one rule for packed documents
    cu = cad_cu_seqlens if cad_cu_seqlens is not None else cu_seqlens_from_position_ids(position_ids)
    q = query.transpose(1, 2).reshape(seq, heads, dim)
    k = key.transpose(1, 2).reshape(seq, key.shape[1], dim)
    v = value.transpose(1, 2).reshape(seq, value.shape[1], dim)
    timed = not torch.compiler.is_compiling()
    if timed and torch.is_grad_enabled():
        q, k, v = _BackwardEnds.apply(q, k, v)
    return q, k, v, cu, _longest(cu), timed


def _timed(timed, device, attend):
    """attend()'s output, its time added to the attention clock (and its backward's, through _BackwardStarts)."""
    start = AttentionClock.now(device) if timed else None
    out = attend()
    if timed:
        AttentionClock.seconds += AttentionClock.now(device) - start
        if torch.is_grad_enabled():
            out = _BackwardStarts.apply(out)
    return out


def torch_varlen_attention(module, query, key, value, attention_mask, *, scaling=None, dropout=0.0,
                           cad_cu_seqlens=None, cad_plan=None, position_ids=None, **kwargs):
    """A transformers attention function over torch.nn.attention.varlen.varlen_attn: local causal varlen
    attention, the documents from the cad_cu_seqlens keyword (else position_ids restarts); cad_plan is ignored.
    A windowed layer (layer_window_left) passes window_size=(left, 0). K/V heads are repeated to the query
    heads, since varlen_attn does not take GQA (on every torch this runs on)."""
    batch, heads, seq, dim = query.shape
    q, k, v, cu, longest, timed = _packed_row("torch_varlen", query, key, value, dropout, cad_cu_seqlens,
                                              position_ids)
    varlen_attn = torch_varlen_function()
    repeats = heads // k.shape[1]
    if repeats > 1:
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
    params = _varlen_parameters(varlen_attn)
    left = layer_window_left(module.config, module.layer_idx)
    if "window_size" in params:
        options = {"window_size": (left, 0)}
    elif left >= 0:
        raise ValueError(f"torch_varlen attention: this torch's varlen_attn takes no window_size (layer "
                         f"{module.layer_idx} has window {left})")
    else:
        options = {"is_causal": True}  # torch 2.9/2.10
    if scaling is not None and "scale" in params:
        options["scale"] = scaling
    elif scaling is not None and abs(scaling - dim ** -0.5) > 1e-12:
        raise ValueError(f"torch_varlen attention: this torch's varlen_attn takes no scale (asked {scaling})")
    out = _timed(timed, q.device, lambda: varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu,
                                                      longest, longest, **options))
    return out.reshape(batch, seq, heads, dim), None


_PARAMETERS = {}


def _varlen_parameters(function):
    if function not in _PARAMETERS:
        import inspect
        _PARAMETERS[function] = set(inspect.signature(function).parameters)
    return _PARAMETERS[function]


def register_attention():
    """cad.hf's "cad" and "cad_local", and the trainers' "torch_varlen" and "fa4", as transformers attention
    functions."""
    import cad.hf
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    cad.hf.register()
    for name, function in (("torch_varlen", torch_varlen_attention), ("fa4", fa4_attention)):
        AttentionInterface.register(name, function)
        AttentionMaskInterface.register(name, flash_attention_mask)  # documents, never a [T, T] mask


# --attention's choices -> the transformers attention implementation each registers as
IMPLEMENTATIONS = {"cad": "cad", "local": "cad_local", "torch_varlen": "torch_varlen", "fa4": "fa4"}


# ---- FlashAttention-4 (--attention fa4) -------------------------------------------------------------------
def fa4_module():
    """cad.fa4, imported when asked for: only --attention fa4 needs it (and the kernels it loads)."""
    import importlib
    return importlib.import_module("cad.fa4")


def fa4_unavailable(device):
    """Why FlashAttention-4 cannot run on `device` (a sentence naming --attention fa4 and cad.fa4's reason), or
    None."""
    try:
        fa4 = fa4_module()
    except ImportError as exc:
        return f"--attention fa4: this cad package has no FlashAttention-4 binding (cad.fa4: {exc})"
    ok, reason = fa4.available(device)
    return None if ok else f"--attention fa4: FlashAttention-4 is not available here: {reason}"


def fa4_attention(module, query, key, value, attention_mask, *, scaling=None, dropout=0.0, cad_cu_seqlens=None,
                  cad_plan=None, position_ids=None, **kwargs):
    """A transformers attention function over cad.fa4.varlen_attn: local causal varlen attention on one packed
    row (THD tensors, K/V heads as they are: GQA), the documents from the cad_cu_seqlens keyword (else
    position_ids restarts); cad_plan is ignored. A windowed layer (layer_window_left) passes window_size=(left, 0).
    Timed by the attention clock as torch_varlen_attention is."""
    batch, heads, seq, dim = query.shape
    q, k, v, cu, longest, timed = _packed_row("fa4", query, key, value, dropout, cad_cu_seqlens, position_ids)
    left = layer_window_left(module.config, module.layer_idx)
    window = (left, 0) if left >= 0 else (-1, -1)
    out = _timed(timed, q.device, lambda: fa4_module().varlen_attn(
        q.contiguous(), k.contiguous(), v.contiguous(), cu, longest, causal=True, window_size=window,
        softmax_scale=scaling))
    return out.reshape(batch, seq, heads, dim), None
