"""A micro-batch's tensors: token ids, positions and labels of a rank's packed buffer, on the device without
waiting for it, and its nano-batches as MicroBatchLoss takes them (tokens, cu_seqlens, CAD plan)."""
import torch

from .attention import remember_longest
from .flops import masks


def make_inputs(doc_lengths, vocab, seed, device):
    total = sum(doc_lengths)
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (1, total), generator=g)
    position_ids = torch.cat([torch.arange(n) for n in doc_lengths]).unsqueeze(0)
    labels = input_ids.clone()
    starts = torch.tensor([0] + doc_lengths[:-1]).cumsum(0)
    labels[0, starts] = -100  # never predict a document's first token from the previous document
    return {k: to_device(t, device) for k, t in dict(input_ids=input_ids, position_ids=position_ids,
                                                       labels=labels).items()}


def to_device(t, device):
    """A host tensor on `device` without waiting for the GPU: through pinned memory, non-blocking (the next
    micro-batch is loaded while this one computes; a pageable copy would wait for the stream to drain)."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def make_nanos(nano_docs, attention, args, device, dtype, tag=None, lane=None):
    """This rank's nano-batches of one micro-batch as MicroBatchLoss takes them: (tokens, cu_seqlens, plan).
    Collective with CAD: every rank asks for the same plans in the same order: per mask the layers use (masks():
    the first layer's first), nano-batch 0's plan, then nano-batch 1's. One mask: each nano-batch's plan is a
    cad.Plan; windowed and global layers: a tuple of plans, one per mask (a causal one and one with
    window_size=(LEFT, 0)), from which cad.hf gives every layer the plan of its window. With --plan-ahead on
    (tag: this micro-batch's number, the same on every rank) they are made on CAD's planning thread while the
    caller goes on, each with its own tag (masks x (2 x tag + nano-batch) + mask: unique, and the same on every
    rank); otherwise now. With two nano-batches and --ping-pong-lanes 2, nano-batch i's plans go on CAD lane i
    (cad.plan's lane: its own communicator and stream, so neither nano-batch's exchanges queue behind the
    other's); `lane` puts all of them on that lane (a micro-batch that is one of a pair's nano-batches, --ping-pong-nanos
    micro-batches: the pair's second on lane 1). CAD's cu_seqlens stay on the host, where the plan reads them (no GPU read-back); the
    local attentions get theirs on the device."""
    import cad
    kinds = masks(args)
    cus = [torch.tensor([0] + docs, dtype=torch.int32).cumsum(0, dtype=torch.int32) for docs in nano_docs]
    plans = [[None] * len(kinds) for _ in nano_docs]
    if attention == "cad":
        ahead = args.plan_ahead == "on"
        for k, (left, _) in enumerate(kinds):
            for i, cu in enumerate(cus):
                plans[i][k] = cad.plan(cu, window_size=(left, 0) if left >= 0 else (-1, -1), num_heads=args.heads,
                                       num_kv_heads=args.kv_heads, head_dim=args.hidden // args.heads, dtype=dtype,
                                       device=device, ahead=ahead,
                                       tag=len(kinds) * (2 * tag + i) + k if ahead else None,
                                       lane=lane if lane is not None else
                                       i % args.ping_pong_lanes if len(cus) == 2 else 0)
    nanos = []
    for i, (docs, cu) in enumerate(zip(nano_docs, cus)):
        plan = None
        if attention == "cad":
            plan = plans[i][0] if len(kinds) == 1 else tuple(plans[i])
        else:
            cu = to_device(cu, device)
            remember_longest(cu, max(docs))  # the local kernels' longest document, without a GPU read
        nanos.append((sum(docs), cu, plan))
    return nanos
