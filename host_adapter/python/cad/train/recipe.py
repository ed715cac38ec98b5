"""The DistCA batch recipe and document packing, in Python: the same generator as the C++
tools/workload/batch_recipe.cpp (so a seed gives the batch `cad plan --dist` and `cad demo` use).

Documents cut at 64K (long chunks twice), 90% of the rest kept, shuffled, scaled by context/64K, packed into
per-rank buffers of `context` tokens (a document cut by a buffer end continues as its own piece on the next rank).

Why two implementations: the C++ one feeds the CLI, the simulator and the conformance kit (no Python there), and
the trainers need the recipe without a built library (integrations load it before CAD starts). They are kept
equal by tests/python/test_train_recipe.py, which compares this module's batches with the built `cad plan
--dist ... --json --tasks` piece tables, seed by seed; a change to either side fails it."""
import math

from .flops import causal_cost


MASK64 = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self):
        return (self.next() >> 11) * 2.0 ** -53

    def below(self, n):
        limit = MASK64 - MASK64 % n
        while True:
            x = self.next()
            if x < limit:
                return x % n


def recipe_documents(lengths, context, seed, split=65536):
    rng, docs = SplitMix64(seed), []
    for n in lengths:
        while n >= split:
            docs += [split, split]
            n -= split
        if n > 0 and rng.uniform() < 0.9:
            docs.append(n)
    for i in range(len(docs), 1, -1):
        j = rng.below(i)
        docs[i - 1], docs[j] = docs[j], docs[i - 1]
    scale = context / split
    return [max(1, int(math.floor(d * scale + 0.5))) for d in docs]  # llround for positive values


def sample_batch(lengths, context, ranks, seed):
    """Per rank, the document lengths of its buffer (pieces of cut documents count as documents here)."""
    docs = recipe_documents(lengths, context, seed)
    pass_ = 1
    while sum(docs) < context * ranks and pass_ < 1024:
        docs += recipe_documents(lengths, context, seed + pass_)
        pass_ += 1
    out, rank, room = [[] for _ in range(ranks)], 0, context
    for n in docs:
        if rank >= ranks:
            break
        n = min(n, room + (ranks - 1 - rank) * context)
        while n > 0:
            take = min(n, room)
            out[rank].append(take)
            n, room = n - take, room - take
            if room == 0:
                rank, room = rank + 1, context
    return out


def long_stream(lengths, max_doc_len, tokens, seed):
    """The documents of a step whose documents may be longer than a rank (--max-doc-len), in order: the recipe scaled
    by max_doc_len / 64K (its 64K documents become max_doc_len long) instead of by the tokens per rank, its passes
    (seed, seed + 1, ...) repeated until they hold `tokens` (every rank's buffer); cad.pack_documents lays them out.
    The C++ tools/workload sample_batch_scaled's stream (`cad plan --dist ... --max-doc-len`)."""
    docs = recipe_documents(lengths, max_doc_len, seed)
    pass_ = 1
    while sum(docs) < tokens and pass_ < 1024:
        docs += recipe_documents(lengths, max_doc_len, seed + pass_)
        pass_ += 1
    return docs


_BATCHES = {}


def cached_batch(lengths, context, ranks, seed):
    """sample_batch, remembered: every configuration of --configs (and every test case) trains the same
    batches, and the pure-Python recipe walks the whole length file (~0.1 s) for each."""
    key = (id(lengths), len(lengths), context, ranks, seed)
    if key not in _BATCHES:
        _BATCHES[key] = (lengths, sample_batch(lengths, context, ranks, seed))  # lengths kept: its id stays its own
    return [list(docs) for docs in _BATCHES[key][1]]


def balanced_documents(docs_by_rank):
    """The micro-batch made balanced, for a measured ideal (--balanced-batches): every rank keeps its token count,
    but its documents become equal lengths L (and one shorter remainder) with L chosen so that its causal
    attention work is nearest the mean rank's. Local attention on these batches runs what perfect balance would
    give at no communication cost, with everything else (tokens, GEMMs, collectives) as in the real batch."""
    target = sum(causal_cost(d) for d in docs_by_rank) / len(docs_by_rank)
    out = []
    for docs in docs_by_rank:
        tokens = sum(docs)
        if tokens == 0:
            out.append([])
            continue

        def cost(length):
            return causal_cost([length] * (tokens // length) + ([tokens % length] if tokens % length else []))

        lo, hi = 1, tokens  # cost grows with the length (more pairs in longer documents): bisect
        while lo < hi:
            mid = (lo + hi) // 2
            if cost(mid) < target:
                lo = mid + 1
            else:
                hi = mid
        best = min((length for length in (lo - 1, lo) if length >= 1), key=lambda n: abs(cost(n) - target))
        out.append([best] * (tokens // best) + ([tokens % best] if tokens % best else []))
    return out
