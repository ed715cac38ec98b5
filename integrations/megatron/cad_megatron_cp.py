"""Megatron-Core's context parallelism (context_parallel_size > 1) on CAD: which of a rank's THD tokens are which
pieces of which documents.

CAD attends each document whole across the ranks that hold its pieces, and balances the step's attention over the
data x context group (init_cad). A rank's THD input under context parallelism comes in one of two layouts:

- Megatron's own (`get_thd_batch_on_this_cp_rank`, Transformer Engine's `thd_get_partitioned_indices`): every
  document of the data-parallel replica's micro-batch is padded at its end to a multiple of 2 * cp
  (`cu_seqlens_q_padded`; `cu_seqlens_q` are the real lengths) and cut into 2 * cp equal chunks; CP rank r holds
  chunks r and 2 * cp - 1 - r of each document, in document order. `megatron_layout` maps that to pieces:
  padding tokens belong to no piece (CAD never reads them; their outputs and gradients are zero). A document's id
  is the replica's data-parallel rank << 32 | its index, the same on the replica's CP ranks and distinct across
  replicas.
- CAD's (`pack_for_context_parallel`): the step's documents laid in order over the data x context ranks by
  `cad.pack_documents`, cut wherever a rank's buffer ends, without padding, positions continuous across a cut.
  Its PackedSeqParams carry the pieces themselves (`cad_cp`).

RoPE: Megatron's own THD RoPE is exact for its own layout; for CAD's layout each token's angle comes from its
position in its document (CpLayout.positions, continuous across a cut; cad_megatron_rope).
"""
import torch
from torch.utils.weak import WeakIdKeyDictionary

import cad

__all__ = ["CpLayout", "layout_of", "megatron_layout", "pack_for_context_parallel", "plan_for_layout"]


class CpLayout:
    """One rank's THD tokens as pieces of whole documents.

    pieces: (doc_id, doc_len, offset_in_doc, len) of its real tokens, in token order (what cad.plan_pieces takes);
    tokens: the rank's tokens in the layer's input, padding included; real: int64 indices of the real tokens among
    them (None: every token is real); positions: each token's position in its document (int64 [tokens]) where RoPE
    is to use it (CAD's layout; None: Megatron's layout, whose RoPE Megatron computes). `plans` holds the plans the
    micro-batch's layers made from it (one per causal/window kind), so that every layer and recomputed layer of the
    micro-batch shares them."""

    def __init__(self, pieces, tokens, real=None, positions=None):
        self.pieces = tuple(tuple(int(x) for x in p) for p in pieces)
        self.tokens = int(tokens)
        self.real = real
        self.real_tokens = sum(p[3] for p in self.pieces)
        if positions is not None and (real is not None or positions.shape != (self.tokens,)):
            raise ValueError(f"CpLayout: positions of shape {tuple(positions.shape)} for {self.tokens} tokens "
                             f"(expected [{self.tokens}], every token real)")
        self.positions = positions
        self.max_position = max((p[2] + p[3] - 1 for p in self.pieces), default=-1)
        self.plans = {}
        self._real_on = {}
        self._positions_on = {}

    def positions_on(self, device):
        """`positions` on `device`, copied there once (every layer of the micro-batch gathers its RoPE with it)."""
        device = torch.device(device)
        if device not in self._positions_on:
            self._positions_on[device] = self.positions.to(device)
        return self._positions_on[device]

    def real_on(self, device):
        """`real` on `device`, copied there once (every layer of the micro-batch gathers with it)."""
        device = torch.device(device)
        if device not in self._real_on:
            self._real_on[device] = self.real.to(device)
        return self._real_on[device]

    def __repr__(self):
        return f"CpLayout({len(self.pieces)} pieces, {self.real_tokens} real of {self.tokens} tokens)"


def _offsets(cu, name, what):
    values = cu.tolist() if isinstance(cu, torch.Tensor) else list(cu)
    if not values or values[0] != 0 or any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"{what}: {name} must start at 0 and never decrease, got {values}")
    return [int(x) for x in values]


def megatron_layout(cu_seqlens, cu_seqlens_padded, cp_size, cp_rank, replica, what="CadCoreAttention"):
    """CpLayout of CP rank `cp_rank`'s tokens under Megatron's THD context-parallel layout (see the module).
    cu_seqlens: the documents' real lengths, cumulated (the replica's whole micro-batch); cu_seqlens_padded: their
    padded lengths (None: no padding, each document a multiple of 2 * cp_size); replica: the data-parallel rank."""
    cu = _offsets(cu_seqlens, "cu_seqlens_q", what)
    padded = cu if cu_seqlens_padded is None else _offsets(cu_seqlens_padded, "cu_seqlens_q_padded", what)
    if len(padded) != len(cu):
        raise ValueError(f"{what}: cu_seqlens_q_padded has {len(padded) - 1} documents, cu_seqlens_q "
                         f"{len(cu) - 1}")
    chunks = 2 * cp_size
    pieces, real, local = [], [], 0
    for i in range(len(cu) - 1):
        length, size = cu[i + 1] - cu[i], padded[i + 1] - padded[i]
        if size % chunks:
            name = "cu_seqlens_q_padded" if cu_seqlens_padded is not None else "cu_seqlens_q (no cu_seqlens_q_padded)"
            raise ValueError(f"{what}: document {i} holds {size} tokens in {name}, not a multiple of 2 * "
                             f"context_parallel_size = {chunks} (Megatron's THD context parallelism pads each "
                             f"document to one)")
        if length > size:
            raise ValueError(f"{what}: document {i} has {length} tokens (cu_seqlens_q) but {size} padded "
                             f"(cu_seqlens_q_padded)")
        chunk = size // chunks
        for j in (cp_rank, chunks - 1 - cp_rank):
            start = j * chunk
            n = max(0, min(chunk, length - start))
            if n:
                pieces.append((replica << 32 | i, length, start, n))
                real.append(torch.arange(local, local + n, dtype=torch.int64))
            local += chunk
    index = None
    if local != sum(p[3] for p in pieces):
        index = torch.cat(real) if real else torch.zeros(0, dtype=torch.int64)
    return CpLayout(pieces, local, index)


def pack_for_context_parallel(lengths, tokens_per_rank, *, device=None, config=None, max_doc_len=None,
                              drop_remainder=True, **attach):
    """This rank's share of a step's documents `lengths` laid over the data x context ranks by cad.pack_documents
    (no padding; see the module): (cad.RankLayout, CadPackedSeqParams). The RankLayout gives the rank's tokens of
    the step's stream (start, stop), position_ids() and targets(stream); the CadPackedSeqParams (qkv_format thd,
    cu_seqlens of the rank's pieces, max_seqlen the longest document's length -- RoPE's table covers every position
    of a piece --, `cad_cp` the pieces and their positions) go to the model. With config (and attach_plan's
    keywords: ahead, tag, ...) the micro-batch's plan is attached (collective). After
    parallel_state.initialize_model_parallel; every rank of the data x context group calls it with the same
    lengths."""
    from megatron.core import parallel_state as ps
    from cad_megatron import CadPackedSeqParams, attach_plan
    ranks = ps.get_data_parallel_world_size(with_context_parallel=True)
    rank = ps.get_data_parallel_rank(with_context_parallel=True)
    mine = cad.pack_documents(lengths, tokens_per_rank, ranks, max_doc_len=max_doc_len,
                              drop_remainder=drop_remainder)[rank]
    cu = mine.cu_seqlens(device)
    longest = max(p[1] for p in mine.pieces)
    packed = CadPackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                                max_seqlen_kv=longest,
                                cad_cp=CpLayout(mine.pieces, mine.tokens, positions=mine.position_ids()))
    if config is not None:
        packed = attach_plan(packed, config, device=device, **attach)
    elif attach:
        raise ValueError(f"pack_for_context_parallel: attach_plan's keywords {sorted(attach)} need config=")
    return mine, packed


# cu_seqlens_q tensor (by identity) -> ((its version, cu_seqlens_q_padded's), CpLayout): Megatron's layout of a
# micro-batch, read back from the device once by its first CAD layer, for the other layers (and recomputed ones).
_megatron_layouts = WeakIdKeyDictionary()


def _same(a, b):
    return a is b or (a is not None and b is not None and torch.equal(a, b))


def check_packed(p, what):
    """Self-attention over the same documents: the kv cu_seqlens (padded and not) equal the q ones."""
    if p.cu_seqlens_kv is not None and not _same(p.cu_seqlens_kv, p.cu_seqlens_q):
        raise ValueError(f"{what}: cu_seqlens_kv differs from cu_seqlens_q (self-attention over the same packed "
                         f"documents only)")
    if p.cu_seqlens_kv_padded is not None and not _same(p.cu_seqlens_kv_padded, p.cu_seqlens_q_padded):
        raise ValueError(f"{what}: cu_seqlens_kv_padded differs from cu_seqlens_q_padded (self-attention over the "
                         f"same packed documents only)")


def _ranks():
    from megatron.core import parallel_state as ps
    return ps.get_context_parallel_rank(), ps.get_data_parallel_rank()


def layout_of(p, cp_size, tokens, what, *, cu_seqlens_host=None, cu_seqlens_padded_host=None):
    """The CpLayout of a call's (or a micro-batch's) THD tokens, or None when CP does not apply (cp_size 1 and no
    pieces attached): the attached one (CAD's layout, or what attach_plan mapped), else Megatron's layout of
    cu_seqlens_q / cu_seqlens_q_padded for this CP rank (remembered by the cu_seqlens_q tensor). tokens: the
    layer's input length (None: not checked)."""
    layout = getattr(p, "cad_cp", None)
    if layout is None and cp_size > 1:
        check_packed(p, what)
        cu, padded = p.cu_seqlens_q, p.cu_seqlens_q_padded
        key = (cu._version, None if padded is None else (id(padded), padded._version))
        entry = _megatron_layouts.get(cu) if cu_seqlens_host is None else None
        if entry is None or entry[0] != key:
            cp_rank, replica = _ranks()
            host = cu_seqlens_host if cu_seqlens_host is not None else cu
            host_padded = cu_seqlens_padded_host if cu_seqlens_padded_host is not None else padded
            entry = (key, megatron_layout(host, host_padded, cp_size, cp_rank, replica, what))
            if cu_seqlens_host is None:
                _megatron_layouts[cu] = entry
        layout = entry[1]
    if layout is not None and tokens is not None and layout.tokens != tokens:
        raise ValueError(f"{what}: the layer got {tokens} tokens, the micro-batch's context-parallel layout has "
                         f"{layout.tokens} on this rank ({layout}); packed_seq_params describe other documents")
    return layout


def plan_for_layout(layout, attached, causal, window_left, window, device):
    """The plan of the micro-batch whose tokens are `layout`: the attached one (attach_plan) where it is for this
    causal/window kind, else the one the micro-batch's first layer of this kind made (Context.plan_pieces; collective
    at that layer: every rank of the data x context group gets there)."""
    if attached is not None and attached.causal == causal and attached.window_left == window_left:
        if tuple(attached.pieces) != layout.pieces:
            raise ValueError(f"CadCoreAttention: the micro-batch's cad_plan was made for other pieces than its "
                             f"context-parallel layout ({layout}): attach_plan(...) was given other documents")
        return attached
    key = (causal, tuple(window))
    if key not in layout.plans:
        from cad_megatron import cad_context
        layout.plans[key] = cad_context().plan_pieces(layout.pieces, causal=causal, window_size=window, device=device)
    return layout.plans[key]
