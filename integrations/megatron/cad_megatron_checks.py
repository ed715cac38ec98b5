"""What CadCoreAttention (cad_megatron.py) takes from Megatron-Core, checked in one place: the TransformerConfig fields
it reads, the parallel sizes, the attention mask types, the attention_mask tensor and the inputs' shapes. Every
refusal is a ValueError naming the field, mask type or tensor and what was expected; nothing is truncated (a float
window is refused, not rounded) and no mask is ignored (a mask is honoured exactly or refused).

Mask types (Megatron-Core's AttnMaskType, every member):
- causal, causal_bottom_right, padding_causal: a query sees the keys of its document up to itself.
  causal_bottom_right is causal here: in self-attention a document's queries and keys are the same tokens, where
  the bottom-right and the top-left diagonal are one.
- no_mask, padding: a query sees every key of its document.
- padding, padding_causal with an attention_mask ([s, b] input): the mask's padding tokens are left out of their
  row, which becomes one document of its real tokens (as Transformer Engine unpads); a padding token's output
  (and the gradient through it) is zero.
- arbitrary, and any type this module does not know: refused (CAD computes document masks, not a mask tensor).
"""
import math
import numbers
import operator

import torch
from megatron.core.transformer.enums import AttnMaskType

CAUSAL = frozenset(m for m in (AttnMaskType.causal, AttnMaskType.padding_causal,
                               getattr(AttnMaskType, "causal_bottom_right", None)) if m is not None)
FULL = frozenset((AttnMaskType.no_mask, AttnMaskType.padding))
PADDING = frozenset((AttnMaskType.padding, AttnMaskType.padding_causal))
_SUPPORTED = ", ".join(sorted(m.name for m in CAUSAL | FULL))

# Parallelism (init_cad): CAD spans the data x context group of this rank's tensor-parallel index and pipeline stage
# (Megatron's data-parallel group, with the context-parallel ranks: the ranks that hold distinct tokens of the
# same heads and layers). Under tensor parallelism the ranks of one TP group hold the same tokens and a slice of
# the heads each; each TP index runs CAD over its own group, with its head slice.
_INT64_MAX = 2 ** 63 - 1


def tensor_parallel_heads(heads, groups, tp, what):
    """(query heads, KV heads) of one tensor-parallel rank for a model of `heads` query heads and `groups` KV heads
    over `tp` ranks, as Megatron-Core's SelfAttention splits them: heads / tp query heads, groups / tp KV heads, or
    one replicated KV head per rank where tp > groups (tp a multiple of groups). Anything else is refused."""
    if heads % tp:
        raise ValueError(f"{what}: num_attention_heads {heads} is not a multiple of the tensor-parallel size {tp}")
    if groups % tp and tp % groups:
        raise ValueError(f"{what}: num_query_groups {groups} and the tensor-parallel size {tp}: the KV heads split "
                         f"over the tensor-parallel ranks (a multiple of {tp}) or are replicated over them (a "
                         f"divisor of {tp}); neither holds")
    return heads // tp, max(1, groups // tp)


def check_parallel(config, pg_collection, what):
    """The layer's own check of the parallel sizes (init_cad checks parallel_state's): (tensor-parallel size,
    context-parallel size), the config's checked against pg_collection's groups and parallel_state's where they
    exist. Pipeline parallelism needs no check: each stage's layers run CAD over that stage's group."""
    tensor = _int(getattr(config, "tensor_model_parallel_size", 1), "tensor_model_parallel_size", what, 1)
    _int(getattr(config, "pipeline_model_parallel_size", 1), "pipeline_model_parallel_size", what, 1)
    group = getattr(pg_collection, "tp", None) if pg_collection is not None else None
    if group is not None and group.size() != tensor:
        raise ValueError(f"{what}: TransformerConfig.tensor_model_parallel_size {tensor} but pg_collection.tp has "
                         f"{group.size()} ranks")
    context = _int(getattr(config, "context_parallel_size", 1), "context_parallel_size", what, 1)
    group = getattr(pg_collection, "cp", None) if pg_collection is not None else None
    if group is not None and group.size() != context:
        raise ValueError(f"{what}: TransformerConfig.context_parallel_size {context} but pg_collection.cp has "
                         f"{group.size()} ranks")
    import torch.distributed as dist
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world % (context * tensor):
        raise ValueError(f"{what}: TransformerConfig.tensor_model_parallel_size {tensor} x context_parallel_size "
                         f"{context} does not divide the world size {world}")
    from megatron.core import parallel_state as ps
    if ps.model_parallel_is_initialized():
        for name, kind, size, theirs in (
                ("tensor_model_parallel_size", "tensor", tensor, ps.get_tensor_model_parallel_world_size),
                ("context_parallel_size", "context", context, ps.get_context_parallel_world_size)):
            if theirs() != size:
                raise ValueError(f"{what}: TransformerConfig.{name} {size} but parallel_state's {kind}-parallel group "
                                 f"has {theirs()} ranks (initialize_model_parallel({name}=...))")
    return tensor, context


def _int(value, field, what, minimum):
    """A config field that must be an int >= minimum (not a bool, not a float)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{what}: TransformerConfig.{field} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_heads(config, what, tensor_parallel_size=1):
    """(query heads, KV heads, kv_channels) of one tensor-parallel rank as ints (tensor_parallel_heads), query
    groups dividing the heads."""
    heads = _int(config.num_attention_heads, "num_attention_heads", what, 1)
    groups = _int(config.num_query_groups if config.num_query_groups is not None else heads, "num_query_groups",
                  what, 1)
    head_dim = _int(config.kv_channels, "kv_channels", what, 1)
    if heads % groups:
        raise ValueError(f"{what}: TransformerConfig.num_attention_heads {heads} is not a multiple of num_query_groups "
                         f"{groups}")
    return (*tensor_parallel_heads(heads, groups, tensor_parallel_size, what), head_dim)


def check_attention_options(config, attention_dropout, softmax_scale, what):
    """Attention dropout (0 only), softmax_type (vanilla only) and softmax_scale (a finite number > 0, or None);
    returns softmax_scale as a float or None."""
    dropout = config.attention_dropout if attention_dropout is None else attention_dropout
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or dropout != 0:
        raise ValueError(f"{what}: attention dropout {dropout!r} is not supported by CAD; set "
                         f"TransformerConfig(attention_dropout=0.0)")
    softmax_type = getattr(config, "softmax_type", "vanilla")
    if softmax_type != "vanilla":
        raise ValueError(f"{what}: softmax_type {softmax_type!r} is not supported (vanilla only)")
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real) or \
            not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"{what}: softmax_scale must be a finite number > 0, got {softmax_scale!r}")
    return float(softmax_scale)


def config_window(config, layer_number, what):
    """The layer's sliding window from config.window_size and config.window_attn_skip_freq, as Megatron-Core reads
    them (transformer.utils.is_layer_window_attention), checked: (left, 0) with left >= 0, or None (no window: not
    set, left -1, or a layer the skip frequency leaves global). A query sees keys [i - left, i] of its document."""
    window = config.window_size
    if not window:  # None or empty: Megatron-Core has no window either
        return None
    try:
        if isinstance(window, (str, bytes)) or len(window) != 2 or any(isinstance(x, bool) for x in window):
            raise TypeError
        left, right = (operator.index(x) for x in window)  # ints only: a float is refused, never truncated
    except (TypeError, ValueError):
        raise ValueError(f"{what}: TransformerConfig.window_size must be a pair (left, right) of ints, got "
                         f"{window!r}") from None
    if left < -1 or left > _INT64_MAX:
        raise ValueError(f"{what}: TransformerConfig.window_size[0] (left) must be -1 (no limit) or 0 to 2**63 - 1, "
                         f"got {left}")
    if right != 0:
        raise ValueError(f"{what}: TransformerConfig.window_size[1] (right) is {right}: CAD computes causal windows "
                         f"(right 0), where a query sees no key after itself")
    if not _windowed_layer(config.window_attn_skip_freq, layer_number, config.num_layers, what):
        return None
    return (left, 0) if left >= 0 else None


def _windowed_layer(skip, layer_number, num_layers, what):
    """Whether layer `layer_number` (1-based) is windowed under window_attn_skip_freq `skip` (Megatron-Core's rule:
    None every layer; an int n every layer but each n-th; a list one 0/1 per layer)."""
    if skip is None:
        return True
    if isinstance(skip, numbers.Integral) and not isinstance(skip, bool):
        if skip < 1:
            raise ValueError(f"{what}: TransformerConfig.window_attn_skip_freq must be >= 1 (every n-th layer "
                             f"global), got {skip}")
        return layer_number % skip != 0
    if isinstance(skip, (list, tuple)):
        if any(not isinstance(x, numbers.Integral) or x not in (0, 1) for x in skip):
            raise ValueError(f"{what}: TransformerConfig.window_attn_skip_freq as a list holds one 0 or 1 per layer, "
                             f"got {skip!r}")
        if layer_number > len(skip):
            raise ValueError(f"{what}: TransformerConfig.window_attn_skip_freq has {len(skip)} entries, layer "
                             f"{layer_number} has none (num_layers {num_layers})")
        return bool(skip[layer_number - 1])
    raise ValueError(f"{what}: TransformerConfig.window_attn_skip_freq must be None, an int or a list of 0/1 per "
                     f"layer, got {skip!r}")


def mask_type(kind, what):
    """kind if CAD computes it (CAUSAL or FULL), else a ValueError naming it."""
    if not isinstance(kind, AttnMaskType) or kind not in CAUSAL | FULL:
        name = kind.name if isinstance(kind, AttnMaskType) else repr(kind)
        raise ValueError(f"{what}: attn_mask_type {name} is not supported: CAD computes {_SUPPORTED} (an arbitrary "
                         f"mask tensor is not a document mask)")
    return kind


# ---- inputs --------------------------------------------------------------------------------------------------------
def thd_inputs(query, key, value, heads, kv_heads, head_dim, what):
    """Packed documents: [t, h, d] (or [t, 1, h, d], the batch dimension Megatron-Core squeezes for THD) to [t, h, d],
    the heads and head dim the layer was built for."""
    out = []
    for name, t, h in (("query", query, heads), ("key", key, kv_heads), ("value", value, kv_heads)):
        if t.dim() == 4 and t.shape[1] == 1:
            t = t.squeeze(1)
        if t.dim() != 3 or tuple(t.shape[1:]) != (h, head_dim) or t.shape[0] != query.shape[0]:
            raise ValueError(f"{what}: {name} of shape {tuple(t.shape)} with packed_seq_params (THD): expected "
                             f"[t, {h}, {head_dim}] (or [t, 1, {h}, {head_dim}]) with t = {query.shape[0]}")
        out.append(t)
    return out


def sbhd_inputs(query, key, value, heads, kv_heads, head_dim, what):
    """[s, b, h, d] input without packed_seq_params: (s, b), every row one document of s tokens."""
    if query.dim() != 4:
        hint = " (packed [t, h, d] documents need packed_seq_params with qkv_format 'thd')" if query.dim() == 3 else ""
        raise ValueError(f"{what}: query of shape {tuple(query.shape)} without packed_seq_params: expected "
                         f"[s, b, {heads}, {head_dim}]{hint}")
    s, b = query.shape[0], query.shape[1]
    for name, t, h in (("query", query, heads), ("key", key, kv_heads), ("value", value, kv_heads)):
        if tuple(t.shape) != (s, b, h, head_dim):
            raise ValueError(f"{what}: {name} of shape {tuple(t.shape)}: expected [{s}, {b}, {h}, {head_dim}] "
                             f"(self-attention: keys and values are the queries' tokens)")
    return s, b


# ---- attention_mask ------------------------------------------------------------------------------------------------
def kept_tokens(attention_mask, kind, s, b, what):
    """What attention_mask (bool, True: masked, Megatron-Core's convention) asks of [s, b] input under mask type
    `kind`, or a ValueError where CAD cannot compute it exactly:
    - None: every token is a token of its row's document (no mask, a mask equal to the type's own, or a padding
      mask without padding);
    - a bool [b, s] tensor (padding types): the tokens that are not padding.
    causal and no_mask take None or a mask equal to theirs ([b or 1, 1, s, s], broadcast); padding and
    padding_causal a padding mask: [b or 1, 1, 1, s] (the padding keys), or [b or 1, 1, s, s] whose every real
    token's row masks exactly the padding keys (padding_causal: among the keys up to the query; a padding token is
    one that cannot see itself, and its own row is not read: its output is zero)."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.bool:
        got = attention_mask.dtype if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise ValueError(f"{what}: attention_mask must be a bool tensor (True: masked), got {got}")
    shape = tuple(attention_mask.shape)
    if len(shape) != 4 or shape[0] not in (1, b) or shape[1] != 1 or shape[2] not in (1, s) or shape[3] != s:
        raise ValueError(f"{what}: attention_mask of shape {shape} for [s={s}, b={b}] input: expected "
                         f"[{b} or 1, 1, 1 or {s}, {s}] (a per-head mask is an arbitrary mask: not supported)")
    m = attention_mask.expand(b, 1, shape[2], s)[:, 0]  # [b, 1 or s, s]
    causal = kind in CAUSAL
    device = attention_mask.device
    below = torch.ones(s, s, dtype=torch.bool, device=device).tril()  # key j <= query i
    if kind in PADDING:
        pad = m[:, 0, :] if shape[2] == 1 else m.diagonal(dim1=1, dim2=2)  # [b, s]
        if shape[2] == s:
            read = (~pad)[:, :, None].expand(b, s, s)  # the real tokens' rows ...
            if causal:
                read = read & below  # ... up to the query
            if ((m != pad[:, None, :]) & read).any():
                raise ValueError(f"{what}: attention_mask for attn_mask_type {kind.name} is not a padding mask: a real "
                                 f"token's row masks keys that are not padding (an arbitrary mask, or documents: "
                                 f"pass those as packed_seq_params, qkv_format 'thd')")
        return ~pad if pad.any() else None
    want = ~below if causal else torch.zeros(s, s, dtype=torch.bool, device=device)
    if (m.expand(b, s, s) != want).any():
        raise ValueError(f"{what}: attn_mask_type {kind.name} with an attention_mask that is not that type's mask "
                         f"({'the causal triangle' if causal else 'nothing masked'}): CAD computes the type's mask "
                         f"and would ignore the rest; padding is attn_mask_type padding/padding_causal, documents "
                         f"are packed_seq_params (qkv_format 'thd')")
    return None
