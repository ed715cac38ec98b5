"""A step's documents packed over the ranks whole: the layout of context parallelism for packed documents.

A document longer than one rank's tokens is cut at rank boundaries into pieces on consecutive ranks, and
stays one document: its positions run on across the cut (RoPE sees one sequence), the token after a piece's
last one is the next rank's first (no label lost at a cut), and CAD attends it whole through a plan made from
the pieces (`cad.plan_pieces(layout.pieces)`). The step's token stream is the documents in order; rank r holds
tokens `[r * tokens_per_rank, (r + 1) * tokens_per_rank)` of it.

    layouts = cad.pack_documents(lengths, tokens_per_rank=131072, ranks=8)
    mine = layouts[rank]
    plan = cad.plan_pieces(mine.pieces)                      # every rank, collective when made
    ids = stream[mine.start:mine.stop]                        # this rank's tokens of the step's stream
    targets = mine.targets(stream)                            # next-token labels, -100 at each document's end
    o = cad.varlen_attn(q, k, v, None, plan=plan)            # attention over whole documents

Document ids are the documents' indices in `lengths` (the same on every rank, as plans from pieces need).
Pure data: no communication, no torch state; every rank computes the same layouts from the same lengths.
"""
from dataclasses import dataclass

import torch

from ._checks import integer
from ._errors import CadError

__all__ = ["RankLayout", "pack_documents"]

IGNORE_INDEX = -100  # the label cross_entropy skips (torch's default ignore_index)


@dataclass(frozen=True)
class RankLayout:
    """One rank's share of a step: `pieces` (doc_id, doc_len, offset_in_doc, len) in token order, covering
    tokens [start, stop) of the step's stream."""
    rank: int
    start: int
    stop: int
    pieces: tuple

    @property
    def tokens(self):
        return self.stop - self.start

    def position_ids(self, device=None):
        """[tokens] int64: each token's position in its document (continuous across a cut)."""
        parts = [torch.arange(offset, offset + n, dtype=torch.int64) for _, _, offset, n in self.pieces]
        out = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
        return out if device is None else out.to(device)

    def cu_seqlens(self, device=None):
        """[pieces + 1] int32: the pieces' boundaries in this rank's buffer (local attention over them attends
        each piece alone: what a trainer without context parallelism computes)."""
        out = torch.zeros(len(self.pieces) + 1, dtype=torch.int32)
        if self.pieces:
            out[1:] = torch.tensor([p[3] for p in self.pieces]).cumsum(0)
        return out if device is None else out.to(device)

    def targets(self, stream):
        """[tokens] next-token labels from the step's whole token stream (1-D, at least `stop` long): token i
        predicts stream[i + 1] within its document, and a document's last token predicts nothing (-100), so
        a piece's last token is labelled with the next rank's first where the document goes on."""
        if stream.dim() != 1 or stream.numel() < self.stop:
            raise CadError(f"cad.RankLayout.targets: stream must be 1-D with at least {self.stop} tokens (rank "
                           f"{self.rank}'s stop), got shape {tuple(stream.shape)}")
        out = stream[self.start + 1:self.stop + 1].clone()
        if out.numel() < self.tokens:  # the stream's last token
            out = torch.cat([out, out.new_full((self.tokens - out.numel(),), IGNORE_INDEX)])
        at = 0
        for _, doc_len, offset, n in self.pieces:
            at += n
            if offset + n == doc_len:
                out[at - 1] = IGNORE_INDEX
        return out


def _length(value, what):
    return integer(value, what, "cad.pack_documents")  # the package's one integer check (int64, no bool/float)


def pack_documents(lengths, tokens_per_rank, ranks, *, max_doc_len=None, drop_remainder=True):
    """Lay the documents `lengths` (in order) over `ranks` buffers of `tokens_per_rank` tokens each, cutting a
    document wherever a rank's buffer ends; returns one RankLayout per rank.

    The documents must fill every rank: their total is at least ranks * tokens_per_rank. What does not fit
    is dropped from the end (the last document that fits partly is shortened to what fits and stays whole:
    its doc_len is the tokens kept), unless drop_remainder=False, which refuses a total other than the
    capacity. max_doc_len, when given, refuses a document longer than it (naming it): the longest document
    is its own setting, apart from the tokens per rank."""
    tokens_per_rank = _length(tokens_per_rank, "tokens_per_rank")
    ranks = _length(ranks, "ranks")
    if tokens_per_rank < 1 or ranks < 1:
        raise CadError(f"cad.pack_documents: tokens_per_rank and ranks must be positive, got {tokens_per_rank} "
                       f"and {ranks}")
    if max_doc_len is not None:
        max_doc_len = _length(max_doc_len, "max_doc_len")
        if max_doc_len < 1:
            raise CadError(f"cad.pack_documents: max_doc_len must be positive, got {max_doc_len}")
    capacity = tokens_per_rank * ranks
    docs, total = [], 0
    for i, n in enumerate(lengths):
        n = _length(n, f"lengths[{i}]")
        if n < 1:
            raise CadError(f"cad.pack_documents: document {i} has length {n}; lengths must be positive")
        if max_doc_len is not None and n > max_doc_len:
            raise CadError(f"cad.pack_documents: document {i} has {n} tokens, above max_doc_len {max_doc_len}")
        if total + n > capacity and not drop_remainder:
            raise CadError(f"cad.pack_documents: the documents hold more than {capacity} tokens "
                           f"({ranks} ranks x {tokens_per_rank}); drop_remainder=False refuses that")
        if total >= capacity:
            break
        n = min(n, capacity - total)
        docs.append(n)
        total += n
    if total < capacity:
        raise CadError(f"cad.pack_documents: {total} tokens of documents cannot fill {ranks} ranks of "
                       f"{tokens_per_rank} tokens ({capacity}); give more documents")
    layouts, doc, offset = [], 0, 0
    for rank in range(ranks):
        room, pieces = tokens_per_rank, []
        while room > 0:
            take = min(docs[doc] - offset, room)
            pieces.append((doc, docs[doc], offset, take))
            offset += take
            room -= take
            if offset == docs[doc]:
                doc, offset = doc + 1, 0
        layouts.append(RankLayout(rank, rank * tokens_per_rank, (rank + 1) * tokens_per_rank, tuple(pieces)))
    return layouts


# ---- memory: what a server must hold for a document cut across ranks ------------------------------------------
# The last query of a document reads every key before it (the window's keys with a sliding window), so the server
# that runs it holds them all: the last piece of a 1M-token document needs the whole document's K/V there. The
# rule is tools/workload/server_memory.cpp's (`cad plan --memory-cap`), in the same words, kept equal by
# tests/python/test_long_trainer.py, which compares the two on the same layouts: the trainers refuse a layout
# here, before a step, as `cad plan` refuses it, instead of running out of memory inside one.

@dataclass(frozen=True)
class MemoryFloor:
    """The least memory any plan needs for one document: the server of its last query receives every key that
    query reads, `keys` = [begin, end), and the query row itself, less what it holds. `rank` is the rank that
    would receive least (holding `held` of those keys); `bytes` what it would receive (Q/K/V/O, as a balancer's
    memory_cap_bytes counts them)."""
    doc_id: int
    doc_len: int
    keys: tuple
    rank: int
    held: int
    bytes: int

    def refusal(self, cap_bytes):
        """Why no plan of the layout fits `cap_bytes` (a sentence naming the document, the rank and the bytes),
        or None where it fits (or cap_bytes is 0: no cap)."""
        if not cap_bytes or self.bytes <= cap_bytes:
            return None
        return (f"no plan of this layout fits memory cap {cap_bytes} bytes: document {self.doc_id} ({self.doc_len} "
                f"tokens) has a last query that reads keys [{self.keys[0]}, {self.keys[1]}) on one server, and the "
                f"rank that would receive least, rank {self.rank} (holding {self.held} of them), would receive "
                f"{self.bytes} bytes; raise the cap or lay out fewer tokens of the document per step")


def _last_query_keys(doc_len, causal, window_size):
    """Keys [begin, end) the document's last query reads (cad's visible keys: window_size (left, right), -1 = no
    limit; causal: right is 0)."""
    left, right = window_size
    p = doc_len - 1
    begin = max(0, p - left) if left >= 0 else 0
    end = p + 1 if causal else (min(doc_len, p + right + 1) if right >= 0 else doc_len)
    return begin, end


def memory_floors(layouts, *, num_heads, num_kv_heads, head_dim, bytes_per_element, causal=True,
                  window_size=(-1, -1)):
    """Per document of the layouts (RankLayouts, or per rank its pieces), in document order, its MemoryFloor. Bytes:
    a K/V token is 2 * num_kv_heads * head_dim elements, a query row Q and O (2 * num_heads * head_dim), each
    bytes_per_element wide (the plan model's q_memory_bytes and kv_token_bytes)."""
    what = "cad.packing.memory_floors"
    shape = {name: integer(value, name, what, 1) for name, value in (
        ("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
        ("bytes_per_element", bytes_per_element))}
    kv_bytes = 2 * shape["num_kv_heads"] * shape["head_dim"] * shape["bytes_per_element"]
    q_bytes = 2 * shape["num_heads"] * shape["head_dim"] * shape["bytes_per_element"]
    holders = {}  # doc -> [(rank, offset, len)]
    for rank, lay in enumerate(layouts):
        for doc_id, doc_len, offset, n in (lay.pieces if isinstance(lay, RankLayout) else lay):
            holders.setdefault(doc_id, []).append((rank, offset, n))

    def held_by(pieces, rank, begin, end):
        return sum(max(0, min(end, o + n) - max(begin, o)) for r, o, n in pieces if r == rank)

    floors = []
    for doc_id in sorted(holders):
        pieces = holders[doc_id]
        doc_len = max(o + n for _, o, n in pieces)
        begin, end = _last_query_keys(doc_len, causal, window_size)
        best = None
        for rank in sorted({r for r, _, _ in pieces}):  # only a holder can receive less than the whole
            held = held_by(pieces, rank, begin, end)
            need = (end - begin - held) * kv_bytes + (1 - held_by(pieces, rank, doc_len - 1, doc_len)) * q_bytes
            if best is None or need < best[2]:
                best = (rank, held, need)
        floors.append(MemoryFloor(doc_id, doc_len, (begin, end), *best))
    return floors


def check_memory_cap(layouts, memory_cap_bytes, **shape):
    """Refuse (cad.CadError) a layout no plan of which fits `memory_cap_bytes` per server: the document whose
    floor is largest (ties: the lowest id), naming it, the rank and the bytes. 0: no cap. `shape`: memory_floors'
    keywords. Returns the largest floor (None without documents)."""
    cap = integer(memory_cap_bytes, "memory_cap_bytes", "cad.packing.check_memory_cap", 0)
    floors = memory_floors(layouts, **shape)
    worst = None
    for f in floors:
        if worst is None or f.bytes > worst.bytes:
            worst = f
    reason = worst.refusal(cap) if worst is not None else None
    if reason:
        raise CadError(f"cad.packing.check_memory_cap: {reason}")
    return worst
