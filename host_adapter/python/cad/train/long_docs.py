"""Documents longer than a rank in the trainers (--max-doc-len): a step's documents packed over the ranks whole.

With --max-doc-len N the recipe's documents are scaled to N (recipe.long_stream: its 64K documents become N
long) instead of to the tokens of one rank, and laid over the ranks' buffers of --tokens-per-rank (--context)
tokens by cad.pack_documents: a document is cut wherever a buffer ends and stays one document. Each rank gets
  - its pieces (doc_id, doc_len, offset_in_doc, len), from which CAD makes the plan that attends every document
    whole (cad.plan_pieces, one per mask the layers use);
  - position_ids that run on across a cut (RoPE sees one document);
  - targets (next-token labels, already shifted): a piece's last token predicts the next rank's first token where
    its document goes on, a document's last token predicts nothing. No label is lost at a cut.
Every rank computes every rank's layout from the same lengths and seeds, without communicating.

The loss: a rank's summed token losses over the step's predicted tokens (every rank's) divided by the ranks, so
that the data-parallel mean of the ranks' gradients is the gradient of the step's token-weighted mean loss, the
loss of one process running the same documents unsplit (tests/python/test_long_trainer.py checks that, loss and
every gradient). The ranks' mean of their losses is that loss.

Memory: a document's last query reads every key before it, so the server that runs it holds the document's whole
K/V. With --memory-cap B (the most Q/K/V/O bytes one server receives in a call, the balancers' memory cap) a
layout no plan of which fits B is refused before the step, naming the document, the rank and the bytes
(cad.packing.check_memory_cap, `cad plan --memory-cap`'s rule); prefix_aware plans within B.

Without --max-doc-len the trainers run as before: documents scaled to one rank, a document cut at a buffer end
becomes a document of each rank (positions restart, no attention across the cut)."""
import torch

from .flops import masks, window_cost
from .recipe import long_stream

IGNORE_INDEX = -100


def add_options(parser):
    """--max-doc-len and --memory-cap, as both trainers take them (--tokens-per-rank is --context's other name)."""
    parser.add_argument("--max-doc-len", type=int, default=None,
                        help="the longest document, apart from the tokens per rank: the recipe's documents scaled to "
                             "it and packed over the ranks whole (cad.pack_documents): a document longer than a rank "
                             "lies on consecutive ranks, positions and labels continuous across the cut, attended whole "
                             "through a plan from pieces (needs --attention cad with more than one rank holding a "
                             "step's tokens). Default: documents scaled to --context, each rank's buffer on its own "
                             "(today's recipe)")
    parser.add_argument("--memory-cap", type=int, default=0,
                        help="the most Q/K/V/O bytes one CAD server receives in an attention call (cad.init's "
                             "memory_cap_bytes: prefix_aware plans within it, the other balancers refuse a plan over "
                             "it); with --max-doc-len a layout no plan fits is refused before its step, naming the "
                             "document, the rank and the bytes. 0 (default): no cap")


def check_options(parser, args, refused=()):
    """parser.error for what --max-doc-len cannot go with: `refused`, (option, whether given) pairs."""
    if args.memory_cap < 0:
        parser.error(f"--memory-cap must be at least 0 (0: no cap), got {args.memory_cap}")
    if args.max_doc_len is None:
        return
    if args.max_doc_len < 1:
        parser.error(f"--max-doc-len must be at least 1, got {args.max_doc_len}")
    for option, given in refused:
        if given:
            parser.error(f"--max-doc-len does not go with {option}: it lays a step's documents over the ranks whole, "
                         f"one buffer per rank")


def refuse_local(args, ranks, what):
    """Local attention cannot attend a document across ranks: refused (cad.CadError) where the documents lie on more
    than one rank's buffer."""
    import cad
    if args.max_doc_len is not None and args.attention != "cad" and ranks > 1:
        raise cad.CadError(f"{what}: --max-doc-len over {ranks} ranks needs --attention cad: {args.attention} attention "
                           f"would attend each rank's piece of a document alone")


class LongStep:
    """One micro-batch of a step laid over `ranks` buffers: `layouts` (cad.RankLayout per rank), `tokens` (the step's
    token stream, int64 [ranks x tokens per rank], on the host) and `documents` (the documents laid out, their
    lengths as packed)."""

    def __init__(self, layouts, tokens):
        self.layouts = layouts
        self.tokens = tokens
        self.documents = [p[1] for lay in layouts for p in lay.pieces if p[2] == 0]
        # every token predicts the next one of its document, but each document's last token
        self.predicted = sum(lay.tokens for lay in layouts) - len(self.documents)

    def spans(self):
        """doc_id -> the ranks holding a piece of it."""
        out = {}
        for lay in self.layouts:
            for p in lay.pieces:
                out.setdefault(p[0], []).append(lay.rank)
        return out


_STEPS = {}


def long_step(lengths, args, ranks, step, micro_batch):
    """Micro-batch `micro_batch` of step `step` over `ranks` buffers of args.context tokens: the recipe's seed
    (args.seed + 1000 step + micro-batch, as the unsplit recipe's) and a token seed of its own for the whole stream
    (the same on every rank). Remembered, as recipe.cached_batch: every configuration trains the same batches."""
    import cad
    key = (id(lengths), len(lengths), args.max_doc_len, args.context, ranks, args.seed, step, micro_batch, args.vocab)
    if key not in _STEPS:
        stream = long_stream(lengths, args.max_doc_len, args.context * ranks, args.seed + 1000 * step + micro_batch)
        layouts = cad.pack_documents(stream, args.context, ranks, max_doc_len=args.max_doc_len)
        g = torch.Generator().manual_seed(args.seed * 7919 + 31 * step + 100003 * micro_batch)
        tokens = torch.randint(0, args.vocab, (args.context * ranks,), generator=g)
        if len(_STEPS) > 64:
            _STEPS.clear()
        _STEPS[key] = (lengths, LongStep(layouts, tokens))  # lengths kept: its id stays its own
    return _STEPS[key][1]


def inputs_of(long, rank, device):
    """A rank's tensors of the micro-batch as MicroBatchLoss takes them: input_ids, position_ids and targets [1, T]
    on `device` (through pinned memory on CUDA), and `predicted`: the step's predicted tokens over the ranks."""
    from .batches import to_device
    lay = long.layouts[rank]
    tensors = dict(input_ids=long.tokens[lay.start:lay.stop], position_ids=lay.position_ids(),
                   targets=lay.targets(long.tokens))
    out = {k: to_device(t.unsqueeze(0), device) for k, t in tensors.items()}
    out["predicted"] = long.predicted / len(long.layouts)
    return out


def piece_lengths(long):
    """Per rank, its pieces' lengths (what the records count as that rank's tokens)."""
    return [[p[3] for p in lay.pieces] for lay in long.layouts]


def piece_pairs(args, pieces):
    """(query, key) pairs of every decoder layer's attention over the queries of these pieces (each layer's mask): a
    query's keys depend only on its position, so a piece [o, o + n) costs the document's first o + n queries less
    its first o."""
    return sum(layers * sum(window_cost([o + n], left) - window_cost([o], left) for _, _, o, n in pieces)
               for left, layers in masks(args))


def check_memory(long, args, dtype):
    """Refuse (cad.CadError) a layout no plan of which fits --memory-cap, for every mask the layers use."""
    from cad.packing import check_memory_cap
    if not args.memory_cap:
        return
    element = torch.empty((), dtype=dtype).element_size()
    for left, _ in masks(args):
        check_memory_cap(long.layouts, args.memory_cap, num_heads=args.heads, num_kv_heads=args.kv_heads,
                         head_dim=args.hidden // args.heads, bytes_per_element=element, causal=True,
                         window_size=(left, 0) if left >= 0 else (-1, -1))


def piece_plans(pieces, attention, args, device, dtype, tag=None, lane=0):
    """(cu_seqlens, plan) of one rank's pieces: with CAD no cu_seqlens and a plan from pieces per mask (a cad.Plan,
    or a tuple with windowed and global layers; collective: every rank asks for the same plans in the same order,
    ahead with --plan-ahead on, tagged masks x tag + mask); local attention the pieces' boundaries on the device and
    no plan (one rank only: refuse_local)."""
    import cad
    from .attention import remember_longest
    from .batches import to_device
    if attention != "cad":
        lengths = [p[3] for p in pieces]
        cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        cu = to_device(cu, device)
        remember_longest(cu, max(lengths) if lengths else 0)
        return cu, None
    kinds = masks(args)
    ahead = args.plan_ahead == "on"
    plans = tuple(cad.plan_pieces(list(pieces), window_size=(left, 0) if left >= 0 else (-1, -1),
                                  num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.hidden // args.heads,
                                  dtype=dtype, device=device, ahead=ahead,
                                  tag=len(kinds) * tag + k if ahead and tag is not None else None, lane=lane)
                  for k, (left, _) in enumerate(kinds))
    return None, plans[0] if len(plans) == 1 else plans
