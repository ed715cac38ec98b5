"""What a batch costs: causal and windowed (query, key) pairs per document, the decoder layers' masks
(--window, --global-every) and the model FLOPs of a step (the trainers' MFU).

Model FLOPs (no recomputation counted) = 6 * P * tokens + 3 * 4 * (heads * head_dim) * attention pairs, with P the
parameters that multiply activations (all but the input embedding table) and the pairs summed over the layers,
each layer over its own mask: len * (len + 1) / 2 per document for a global layer, sum over p of
min(p + 1, LEFT + 1) for a windowed one."""


def causal_cost(lengths):
    return sum(n * (n + 1) // 2 for n in lengths)


def window_cost(lengths, left):
    """(query, key) pairs of causal attention with window_size=(left, 0): the query at position p sees
    min(p + 1, left + 1) keys; left -1 (no window): causal_cost."""
    if left < 0:
        return causal_cost(lengths)
    w = left + 1
    return sum(n * (n + 1) // 2 if n <= w else w * (w + 1) // 2 + (n - w) * w for n in lengths)


def layer_windows(args):
    """Per decoder layer, its window's left (-1: a global, causal layer): --window and --global-every (every
    N-th layer global: layers N-1, 2N-1, ...; without --global-every all windowed)."""
    window, every = getattr(args, "window", -1), getattr(args, "global_every", None)
    if window < 0:
        return [-1] * args.layers
    return [-1 if every and (i + 1) % every == 0 else window for i in range(args.layers)]


def masks(args):
    """The masks the layers use, as (window left, layers using it), in the order of the first layer of each."""
    counts = {}
    for left in layer_windows(args):
        counts[left] = counts.get(left, 0) + 1
    return list(counts.items())


def attention_pairs(args, lengths):
    """(query, key) pairs of all decoder layers' attention over these documents (each layer's mask counted)."""
    return sum(layers * window_cost(lengths, left) for left, layers in masks(args))


def count_matmul_parameters(lm):
    """P of the MFU formula: every parameter but the input embedding table (a lookup, no FLOPs); a head tied to
    that table still multiplies, so it counts then."""
    embedding = lm.get_input_embeddings().weight
    tied = lm.get_output_embeddings() is not None and lm.get_output_embeddings().weight is embedding
    return sum(p.numel() for p in lm.parameters()) - (0 if tied else embedding.numel())


def model_flops(args, params, docs_by_micro_batch):
    """Model FLOPs of one step over all ranks (the module docstring's formula)."""
    tokens = sum(sum(docs) for by_rank in docs_by_micro_batch for docs in by_rank)
    pairs = sum(attention_pairs(args, docs) for by_rank in docs_by_micro_batch for docs in by_rank)  # all layers
    head_dim = args.hidden // args.heads
    return 6 * params * tokens + 3 * 4 * args.heads * head_dim * pairs
