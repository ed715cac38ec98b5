"""Rotary position embeddings (RoPE) under CAD's context-parallel layout, exact.

Megatron-Core applies RoPE in SelfAttention before core attention. With THD packed documents it takes each
document of cu_seqlens_q to start at position 0 and, under context parallelism, to be cut into Megatron's own
head/tail chunks (`_apply_rotary_pos_emb_thd`, cp_group = the context-parallel group). CAD's layout
(cad_megatron_cp.pack_for_context_parallel) is neither: a rank holds whole pieces of documents, a piece may start
inside its document (offset_in_doc > 0, where a document is cut at the previous rank's end), and a piece's tokens
are not a multiple of 2 * cp. Megatron's positions there restart at every cut.

So for CAD's layout the layer hands Megatron no rotary embedding and gives core attention each token's angle from
its position in its document (CpLayout.positions, what cad.pack_documents' position_ids are): GPTModel's
RotaryEmbedding table (packed THD: the whole [max_seqlen, 1, 1, dim] table, never sliced per CP rank) gathered at
those positions, applied to query and key by Megatron's own rotation (`_apply_rotary_pos_emb_bshd`, the function
its THD path applies per document), first thing in CadCoreAttention -- where Megatron's layer would have applied
it, right before core attention. The table must cover the longest document: pack_for_context_parallel sets
max_seqlen_q to it (GPTModel's table length is max(max_seqlen_q, max_seqlen_kv)).

Everything else -- no packed_seq_params, packed documents without CP, Megatron's own CP layout -- keeps Megatron's
RoPE unchanged. `CadRotary` is the SelfAttention mixin that does this (cad_megatron.use_cad puts it in the spec).
`rope_on_cpu(model)` lets a GPTModel's RoPE run on the CPU (tests).
"""
import dataclasses
import functools

import torch

__all__ = ["CadRotary", "apply_rotary", "rope_on_cpu", "rotary_for_layout", "with_cad_rotary"]


def rotary_for_layout(rotary_pos_emb, layout, what="CadSelfAttention"):
    """(query's, key's) per-token rotary embeddings [tokens, 1, 1, dim] of `layout`'s tokens: GPTModel's table(s)
    `rotary_pos_emb` ([max_seqlen, 1, 1, dim], or a (query, key) pair) at each token's position in its
    document."""
    pair = rotary_pos_emb if isinstance(rotary_pos_emb, tuple) else (rotary_pos_emb, rotary_pos_emb)
    out = []
    for table in pair:
        if table is None:
            out.append(None)
            continue
        if table.dim() != 4 or table.shape[1:3] != (1, 1):
            raise ValueError(f"{what}: rotary_pos_emb of shape {tuple(table.shape)}: expected [max_seqlen, 1, 1, "
                             f"dim] (GPTModel's RotaryEmbedding for packed THD input)")
        if layout.max_position >= table.shape[0]:
            raise ValueError(f"{what}: a token at position {layout.max_position} of its document, but the rotary "
                             f"table covers {table.shape[0]} positions: packed_seq_params.max_seqlen_q must be the "
                             f"longest document's length (pack_for_context_parallel sets it)")
        out.append(table.index_select(0, layout.positions_on(table.device)))
    return tuple(out)


def apply_rotary(q, k, rotary, config):
    """q [t, heads, dim], k [t, kv_heads, dim] rotated by the per-token embeddings `rotary` (rotary_for_layout),
    by Megatron's own rotation with the layer's options (interleaving, YaRN's mscale)."""
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
        _yarn_get_concentration_factor_from_config)
    options = dict(rotary_interleaved=config.rotary_interleaved, multi_latent_attention=config.multi_latent_attention,
                   mscale=_yarn_get_concentration_factor_from_config(config))
    q_emb, k_emb = rotary
    if q_emb is not None:
        q = _apply_rotary_pos_emb_bshd(q.unsqueeze(1), q_emb, **options).squeeze(1)
    if k_emb is not None:
        k = _apply_rotary_pos_emb_bshd(k.unsqueeze(1), k_emb, **options).squeeze(1)
    return q, k


class CadRotary:
    """SelfAttention mixin: under CAD's context-parallel layout (packed_seq_params.cad_cp with positions), the
    layer's RoPE goes to core attention per token (see the module); otherwise Megatron's SelfAttention as is."""

    def forward(self, *args, **kwargs):
        packed = kwargs.get("packed_seq_params")
        emb = kwargs.get("rotary_pos_emb")
        layout = getattr(packed, "cad_cp", None)
        if len(args) > 4 and layout is None:
            return super().forward(*args, **kwargs)
        if len(args) > 4:
            raise TypeError("CadSelfAttention.forward: pass rotary_pos_emb and packed_seq_params by keyword (as "
                            "Megatron's TransformerLayer does)")
        if emb is not None and layout is not None and layout.positions is not None:
            kwargs["rotary_pos_emb"] = None  # Megatron's THD RoPE would restart positions at every piece
            kwargs["packed_seq_params"] = dataclasses.replace(
                packed, cad_rotary=rotary_for_layout(emb, layout, f"CadSelfAttention (layer {self.layer_number})"))
        return super().forward(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def with_cad_rotary(cls):
    """`cls` (SelfAttention or a subclass) with CadRotary in front."""
    if issubclass(cls, CadRotary):
        return cls
    return type(f"Cad{cls.__name__}", (CadRotary, cls), {"__doc__": CadRotary.__doc__})


def _cpu_get_emb(self, max_seq_len, offset=0):
    """RotaryEmbedding.get_emb without its move of inv_freq to torch.cuda.current_device()."""
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)
    if not self.rotary_interleaved:
        emb = torch.cat((freqs, freqs), dim=-1)
    else:
        emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
    return emb[:, None, None, :]


def rope_on_cpu(model):
    """Let a GPTModel's RotaryEmbedding compute on the CPU (megatron-core moves its frequencies to CUDA at the
    first forward): its table is made where inv_freq lives (build with use_cpu_initialization=True). Returns
    model."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    rotary = getattr(model, "rotary_pos_emb", None)
    if type(rotary) is not RotaryEmbedding:
        raise ValueError(f"rope_on_cpu: the model's rotary_pos_emb is {type(rotary).__name__}, expected Megatron's "
                         f"RotaryEmbedding (position_embedding_type='rope')")
    rotary.get_emb = _cpu_get_emb.__get__(rotary)
    return model
