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
