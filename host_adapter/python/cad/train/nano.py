"""The nano-batch split policy of ping-pong: where a rank's buffer splits into two nano-batches (whole
documents, the boundary nearest half its tokens), which half runs first (the heavier one, by causal attention
work, on every rank), and the buffer's tokens put in that order. Every rank computes the same from the same batch,
so all agree without communicating."""
import torch

from .flops import causal_cost


def split_point(doc_lengths):
    """Where a rank's documents split into two nano-batches: k with doc_lengths[:k] | doc_lengths[k:], the
    document boundary nearest half the tokens (the first one on a tie); None with fewer than 2 documents."""
    if len(doc_lengths) < 2:
        return None
    half, prefix, best = sum(doc_lengths) / 2, 0, None
    for k in range(1, len(doc_lengths)):
        prefix += doc_lengths[k - 1]
        if best is None or abs(prefix - half) < best[1]:
            best = (k, abs(prefix - half))
    return best[0]


def nano_batches(docs_by_rank, ping_pong):
    """Per rank, its nano-batches (lists of document lengths) in the order they run: two with ping-pong where every
    rank can be split, else one (the whole buffer). Every rank computes this from the same batch, so all agree.
    The heavier half (causal attention work) runs first on every rank: nano-batch k of all ranks is balanced by one
    plan, and a rank's light half paired with another's heavy one is imbalance that plan must move away (over a
    64K run's batches on 2 ranks the halves' plans sent 1.53x the unsplit plans' bytes in buffer order, 1.32x
    heavier first: bench/balancers/nano_split_bytes.py). run_order puts the buffer's tokens in that order."""
    cuts = [split_point(docs) for docs in docs_by_rank] if ping_pong else [None]
    if None in cuts:
        return [[docs] for docs in docs_by_rank]
    return [[docs[:k], docs[k:]] if causal_cost(docs[:k]) >= causal_cost(docs[k:]) else [docs[k:], docs[:k]]
            for docs, k in zip(docs_by_rank, cuts)]


def run_order(inputs, docs, nanos):
    """A rank's inputs (make_inputs over `docs`) with its tokens in the order its nano-batches run (`nanos`, from
    nano_batches): the same tensors where the first half runs first, else the second half's tokens first. Whole
    documents move (positions and labels with them), so the loss sums the same terms."""
    if len(nanos) < 2 or nanos[0] == docs[:len(nanos[0])] and nanos[1] == docs[len(nanos[0]):]:
        return inputs
    first = sum(nanos[1])  # the buffer's first half, which runs second
    return {key: torch.cat([t[:, first:], t[:, :first]], dim=1) for key, t in inputs.items()}
