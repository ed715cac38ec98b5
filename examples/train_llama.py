#!/usr/bin/env python3
"""Train a transformers Llama model (random weights from a config, nothing downloaded) on packed Pretrain-recipe
batches, data parallel (DDP or FSDP2) with gradient accumulation and activation checkpointing, attention through
CAD or local, under torchrun (or as one process).

    torchrun --nproc-per-node 4 examples/train_llama.py --attention cad --balancer prefix_aware \
        --context 4096 --layers 2 --steps 10 --device cpu
    torchrun --nproc-per-node 2 examples/train_llama.py --device cuda --model llama3-8b --layers 8 \
        --context 65536 --micro-batches 2 --checkpointing full --configs local,torch_varlen,prefix_aware,distca+pp

Batches follow the DistCA recipe over ../shared/data/doclen_pretrain.json (the same generator as the C++
tools/workload/batch_recipe.cpp, so a seed gives the batch `cad demo` uses): documents cut at 64K (long
chunks twice), 90% of the rest kept, shuffled, scaled by context/64K, packed into one buffer of --context tokens
per rank (a document cut by a buffer end continues as its own document on the next rank). Each rank's buffer is
one packed sequence (position_ids restart per document).

A step is --micro-batches micro-batches (gradient accumulation), each its own recipe batch (seed + 1000 * step +
micro-batch) and, with CAD, its own plan: cad.plan(cu_seqlens) on every rank, handed to every layer's attention
through the transformers call as the keywords cad_plan and cad_cu_seqlens (cad.hf). With --plan-ahead on (the
default) micro-batch i+1 is loaded and its plan asked for before micro-batch i computes (the next step's first
micro-batch during this step's last), and CAD's planning thread makes it meanwhile (cad.plan(ahead=True)). Nothing is released by hand: the trainer drops its reference after the micro-batch's backward. Each
micro-batch's loss is scaled by 1/micro-batches.

Data parallelism (--parallel): ddp = torch DistributedDataParallel (bucketed all-reduce overlapped with the
backward; no_sync() for all but the last micro-batch, so one all-reduce per step); fsdp2 = fully_shard per
decoder layer, then on the root (embeddings, final norm, head), AdamW on the shards (with --ping-pong the
layers stay gathered between their two nano-batch calls and the backward). With --dtype bf16 FSDP2
keeps fp32 master weights and computes in bf16 (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32));
DDP trains the model in --dtype as is. FSDP2 reduce-scatters after every micro-batch (the gradients stay
sharded: accumulating unsharded gradients over micro-batches would hold a full fp32 copy of them per GPU).

The loss is computed in chunks of --loss-chunk tokens, each chunk's logits recomputed in the backward
(torch.utils.checkpoint): transformers' own loss materialises the [tokens, vocab] logits in fp32, 34 GB at 64K
tokens with Llama-3's 128256-token vocabulary. So the trainer calls the base model (model.model, the same
keywords reach the attention) and its head itself.

--ping-pong splits every rank's buffer into two nano-batches at the document boundary nearest half its tokens
(whole documents only: a piece of a document cut across ranks is one document of its rank and stays whole in
its nano-batch). Each nano-batch has its own CAD plan (two per micro-batch, made before its forward on every
rank) and each decoder layer is a cad.PingPongLayer called once for both nano-batches (cad.ping_pong_layers), so
that on CUDA one nano-batch's attention exchange overlaps the other's compute while FSDP2 still gathers and
reduces each layer once per micro-batch. The loss is the token-weighted mean over both nano-batches:
the same loss and gradients as without --ping-pong, up to rounding. A micro-batch in which some rank holds
fewer than 2 documents cannot be split; it runs as one nano-batch (one plan, layers in order), says so, and its
step's record has "ping_pong": false. Every rank knows every rank's documents, so all agree without
communicating. Each half is balanced by a plan of its own, which moves more than balancing the whole: at 64K
tokens on 2 ranks the halves in buffer order sent 1.5x the bytes of the unsplit plans (698 against 458 MiB per
layer, docs/multi_gpu.md, run 53). So on every rank the heavier half (causal attention work) runs first, its
tokens moved to the front where it is the buffer's second half (run_order): 1.32x by the planner's count
(bench/balancers/nano_split_bytes.py). --ping-pong-nanos micro-batches instead runs the step's micro-batches in pairs, each
pair's two as the two nano-batches of one forward and backward (one buffer, the second after the first), each with
its unsplit plan on a lane of its own: the unsplit step's bytes, two micro-batches' activations held at once; the
loss is the sum of the two micro-batches' own means, so the gradients are those of one at a time.

Sliding windows (--window LEFT, --global-every N): the windowed decoder layers attend, per query at document
position p, to the keys [p - LEFT, p] (window_size=(LEFT, 0); transformers' sliding_window = LEFT + 1, set in
the model config with its layer_types, as Gemma-3 and gpt-oss do). With --global-every N every N-th layer
(layers N-1, 2N-1, ...) is global (causal) and the others windowed: 6 is Gemma-3's 5 windowed : 1 global, 2
gpt-oss's alternation; without it every layer is windowed. local and cad_local read the window from the config
(cad.hf); torch_varlen passes window_size=(LEFT, 0) to varlen_attn (a torch whose varlen_attn takes no
window_size skips the configuration, saying so); CAD makes one plan per mask and micro-batch (nano-batch with
--ping-pong): a causal plan and cad.plan(cu, window_size=(LEFT, 0)), handed to the layers together as the
cad_plan tuple, from which each layer takes the plan of its own window (cad.hf).

Per step (rank 0 prints a line; --json-out keeps the records): loss, every rank's step time and attention time,
tokens/s, MFU, peak GPU memory, the attention imbalance; then a summary. MFU = model FLOPs of the step /
(slowest rank's step time x ranks x --peak-tflops), model FLOPs (no recomputation counted) =
    6 * P * tokens  +  3 * layers * 4 * (heads * head_dim) * sum over documents of len * (len + 1) / 2
P = the parameters that multiply activations (all but the input embedding table), tokens = every rank's tokens
of the step; the second term is causal attention: forward Q K^T and P V each 2 * head_dim FLOPs per
(query, key) pair and head over len * (len + 1) / 2 pairs per document, the backward twice the forward. A
windowed layer counts its own pairs instead: min(p + 1, LEFT + 1) keys for the query at position p, i.e.
layers * len * (len + 1) / 2 becomes, summed over the layers, len * (len + 1) / 2 for a global layer and
sum over p of min(p + 1, LEFT + 1) for a windowed one.
"""
import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import pathlib
import re
import sys
import time

import torch
import torch.distributed as dist

REPO = pathlib.Path(__file__).resolve().parent.parent
MASK64 = (1 << 64) - 1

MODELS = {  # --model presets: what --hidden, --heads, ... default to
    "tiny": dict(hidden=128, heads=4, kv_heads=2, intermediate=0, vocab=1024, layers=2),
    "llama3-8b": dict(hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256, layers=32),
}


# ---- the DistCA batch recipe (a port of tools/workload/batch_recipe.cpp) ------------------------
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


_BATCHES = {}


def cached_batch(lengths, context, ranks, seed):
    """sample_batch, remembered: every configuration of --configs (and every test case) trains the same
    batches, and the pure-Python recipe walks the whole length file (~0.1 s) for each."""
    key = (id(lengths), len(lengths), context, ranks, seed)
    if key not in _BATCHES:
        _BATCHES[key] = (lengths, sample_batch(lengths, context, ranks, seed))  # lengths kept: its id stays its own
    return [list(docs) for docs in _BATCHES[key][1]]


def causal_cost(lengths):
    return sum(n * (n + 1) // 2 for n in lengths)


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


# ---- the model: attention implementations, checkpointing, data parallelism ------------------------------
class AttentionClock:
    """Seconds in the torch_varlen attention calls (forward and backward), as cad.attention_time() counts CAD's:
    wall time, with CUDA waited for around every call when `sync` (not under ping-pong on CUDA, see train_one)."""
    seconds = 0.0
    sync = False
    started = None

    @classmethod
    def now(cls, device):
        if cls.sync and device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    @classmethod
    def take(cls):
        seconds, cls.seconds = cls.seconds, 0.0
        return seconds


class _BackwardStarts(torch.autograd.Function):
    """Identity on the attention output: its backward runs just before the attention's backward."""

    @staticmethod
    def forward(ctx, o):
        return o.view_as(o)

    @staticmethod
    def backward(ctx, d_o):
        AttentionClock.started = AttentionClock.now(d_o.device)
        return d_o


class _BackwardEnds(torch.autograd.Function):
    """Identity on q, k, v: its backward runs once the attention's backward has produced all three gradients."""

    @staticmethod
    def forward(ctx, q, k, v):
        return q.view_as(q), k.view_as(k), v.view_as(v)

    @staticmethod
    def backward(ctx, d_q, d_k, d_v):
        if AttentionClock.started is not None:
            AttentionClock.seconds += AttentionClock.now(d_q.device) - AttentionClock.started
            AttentionClock.started = None
        return d_q, d_k, d_v


def torch_varlen_function():
    """torch.nn.attention.varlen.varlen_attn (torch >= 2.9), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def torch_varlen_unavailable(device, window=-1):
    """Why the torch_varlen baseline cannot run here (a sentence), or None. window: --window (a windowed model
    needs a varlen_attn that takes window_size, torch >= 2.11)."""
    if device.type != "cuda":
        return "torch_varlen: torch.nn.attention.varlen.varlen_attn runs on CUDA only (this run is on the CPU)"
    if torch_varlen_function() is None:
        return f"torch_varlen: torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn (torch >= 2.9)"
    if window >= 0 and "window_size" not in _varlen_parameters(torch_varlen_function()):
        return (f"torch_varlen: torch {torch.__version__}'s varlen_attn takes no window_size (torch >= 2.11), which "
                f"--window {window} needs")
    return None


def layer_window_left(config, layer_idx):
    """A decoder layer's window left from the model config as build_model sets it (sliding_window = left + 1 and
    layer_types); -1 for a global layer or a model without windows."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if window is None or (types is not None and types[layer_idx] != "sliding_attention"):
        return -1
    return window - 1


# id(cu_seqlens) -> (cu_seqlens, longest document): read back (or set by make_nanos) once per micro-batch, not
# once per layer
_max_lengths = {}


def _longest(cu):
    if len(_max_lengths) > 8:
        _max_lengths.clear()
    cached = _max_lengths.get(id(cu))
    if cached is None or cached[0] is not cu:
        cached = _max_lengths[id(cu)] = (cu, int((cu[1:] - cu[:-1]).max().item()))
    return cached[1]


def torch_varlen_attention(module, query, key, value, attention_mask, *, scaling=None, dropout=0.0,
                           cad_cu_seqlens=None, cad_plan=None, position_ids=None, **kwargs):
    """A transformers attention function over torch.nn.attention.varlen.varlen_attn: local causal varlen
    attention, the documents from the cad_cu_seqlens keyword (else position_ids restarts); cad_plan is ignored.
    A windowed layer (layer_window_left) passes window_size=(left, 0). K/V heads are repeated to the query
    heads, since varlen_attn does not take GQA (on every torch this runs on)."""
    if dropout:
        raise ValueError("torch_varlen attention: attention dropout is not supported")
    varlen_attn = torch_varlen_function()
    batch, heads, seq, dim = query.shape
    if batch != 1:
        raise ValueError(f"torch_varlen attention: expected one packed row, got a batch of {batch}")
    if cad_cu_seqlens is None:
        from cad.hf import cu_seqlens_from_position_ids  # the package's one rule for packed documents
    cu = cad_cu_seqlens if cad_cu_seqlens is not None else cu_seqlens_from_position_ids(position_ids)
    longest = _longest(cu)
    q = query.transpose(1, 2).reshape(seq, heads, dim)
    k = key.transpose(1, 2).reshape(seq, key.shape[1], dim)
    v = value.transpose(1, 2).reshape(seq, value.shape[1], dim)
    timed = not torch.compiler.is_compiling()  # the clock's host calls stay out of compiled graphs
    if timed and torch.is_grad_enabled():
        q, k, v = _BackwardEnds.apply(q, k, v)
    repeats = heads // k.shape[1]
    if repeats > 1:
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
    params = _varlen_parameters(varlen_attn)
    left = layer_window_left(module.config, module.layer_idx)
    if "window_size" in params:
        options = {"window_size": (left, 0)}
    elif left >= 0:
        raise ValueError(f"torch_varlen attention: this torch's varlen_attn takes no window_size (layer "
                         f"{module.layer_idx} has window {left})")
    else:
        options = {"is_causal": True}  # torch 2.9/2.10
    if scaling is not None and "scale" in params:
        options["scale"] = scaling
    elif scaling is not None and abs(scaling - dim ** -0.5) > 1e-12:
        raise ValueError(f"torch_varlen attention: this torch's varlen_attn takes no scale (asked {scaling})")
    start = AttentionClock.now(q.device) if timed else None
    out = varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, longest, longest, **options)
    if timed:
        AttentionClock.seconds += AttentionClock.now(q.device) - start
        if torch.is_grad_enabled():
            out = _BackwardStarts.apply(out)
    return out.reshape(batch, seq, heads, dim), None


_PARAMETERS = {}


def _varlen_parameters(function):
    if function not in _PARAMETERS:
        import inspect
        _PARAMETERS[function] = set(inspect.signature(function).parameters)
    return _PARAMETERS[function]


def register_attention():
    """cad.hf's "cad" and "cad_local", and this example's "torch_varlen", as transformers attention functions."""
    import cad.hf
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    cad.hf.register()
    AttentionInterface.register("torch_varlen", torch_varlen_attention)
    AttentionMaskInterface.register("torch_varlen", flash_attention_mask)  # documents, never a [T, T] mask


IMPLEMENTATIONS = {"cad": "cad", "local": "cad_local", "torch_varlen": "torch_varlen"}


def build_model(args, device, dtype):
    """The transformers Llama, the same weights for every configuration (seeded, initialised on `device`)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    register_attention()
    windows = {}
    if getattr(args, "window", -1) >= 0:  # transformers' way (Gemma-3, gpt-oss): sliding_window and layer_types
        windows = dict(sliding_window=args.window + 1, layer_types=[
            "full_attention" if left < 0 else "sliding_attention" for left in layer_windows(args)])
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=max(args.context, 2048),
                         attention_dropout=0.0, use_cache=False, **windows)  # no KV cache: it keeps every K/V
    torch.manual_seed(args.seed)  # the same weights on every rank (every GPU's generator is seeded alike)
    with device:  # initialised where it runs: a CPU init of billions of weights took most of a GPU run's start
        model = AutoModelForCausalLM.from_config(config, attn_implementation=IMPLEMENTATIONS[args.attention],
                                                 dtype=dtype)
    return model.to(device)


def _checkpointed(forward):
    def run(*args, **kwargs):
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return run


def apply_checkpointing(lm, mode, reentrant):
    """--checkpointing: full = transformers' own (every decoder layer recomputed in the backward); attention /
    mlp = only each decoder layer's self_attn / mlp module recomputed (its forward wrapped in a non-reentrant
    torch.utils.checkpoint), the rest of the layer keeps its activations."""
    if mode == "full":
        kwargs = {"use_reentrant": bool(reentrant)}
        if hasattr(lm, "activation_checkpointing_enable"):  # transformers >= 5.2x; the older name warns there
            lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    elif mode in ("attention", "mlp"):
        for layer in lm.model.layers:
            part = layer.self_attn if mode == "attention" else layer.mlp
            part.forward = _checkpointed(part.forward)


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


def allocator_retries(device):
    """The caching allocator's count of allocations that failed once and were retried after it released its cache
    (0 off CUDA): each such release synchronises the host (with expandable segments, on every segment's stream)."""
    return torch.cuda.memory_stats(device).get("num_alloc_retries", 0) if device.type == "cuda" else 0


def wrap_data_parallel(module, args, device, world, dtype):
    """DDP or FSDP2 around the step module (see the module docstring); one process: as is."""
    if world == 1:
        return module
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device.type, (world,))
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype != torch.float32 else \
        MixedPrecisionPolicy()
    # With ping-pong each layer is a cad.PingPongLayer, one call for both nano-batches: FSDP2 gathers its weights
    # once before both and reduces their gradients once after both. They stay gathered from the forward to the
    # backward instead of being gathered again for the recomputation (with --ping-pong-when worthwhile: set per
    # step, set_reshard_after_forward).
    for layer in module.lm.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy,
                    reshard_after_forward=not (args.ping_pong and args.ping_pong_when == "always"))
    fully_shard(module, mesh=mesh, mp_policy=policy)  # the root: embeddings, final norm, head
    return module


def grad_norm(parameters):
    """The L2 norm of the (averaged) gradients, FSDP2's shards included; a 0-d tensor (not read back yet)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2: the shards' norms combined
        norm = norm.full_tensor()
    return norm


# ---- one micro-batch's loss, as the module the data-parallel wrapper wraps ------------------------------
class MicroBatchLoss(torch.nn.Module):
    """A transformers causal LM (`lm`) whose forward is one micro-batch's loss, so that DDP's and FSDP2's hooks
    see the whole forward, including ping-pong's nano-batch schedule and the chunked loss.

    forward(input_ids, position_ids, labels, nanos): nanos = [(tokens, cu_seqlens, plan)], one entry (the whole
    buffer) or two (ping-pong: two halves of the buffer, or two micro-batches' buffers one after the other), each
    a slice of the buffer in order; plan None for local attention, a tuple of
    plans (one per mask, cad.hf picks each layer's) for a model with windowed and global layers. The loss is
    the token-weighted mean over the micro-batch: every nano-batch's summed token losses over the micro-batch's
    count of predicted tokens. A nano-batch's last token predicts nothing, as a document's last token does
    (its next label is the next document's first token, which is -100)."""

    def __init__(self, lm, loss_chunk):
        super().__init__()
        self.lm = lm
        self.loss_chunk = loss_chunk

    def forward(self, input_ids, position_ids, labels, nanos, paired=False):
        """paired: the two nano-batches are two micro-batches (--ping-pong-nanos micro-batches): the sum of their
        own token-weighted means, as two separate calls would add up."""
        if len(nanos) == 1:
            _, cu, plan = nanos[0]
            # The transformers call: the keywords reach every layer's attention function (cad.hf).
            hidden = self.lm.model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                                   cad_cu_seqlens=cu, cad_plan=plan).last_hidden_state
            states, label_parts = [hidden], [labels]
        else:
            states, label_parts = self._ping_pong(input_ids, position_ids, labels, nanos)
        if paired:
            return sum(self._summed_token_losses(h, y) / (y[:, 1:] != -100).sum() for h, y in zip(states, label_parts))
        predicted = (labels[:, 1:] != -100).sum()  # a tensor: reading it back would sync CUDA
        total = sum(self._summed_token_losses(h, y) for h, y in zip(states, label_parts))
        return total / predicted

    def _ping_pong(self, input_ids, position_ids, labels, nanos):
        """Two nano-batches: each embedded on its own, the decoder layers (cad.PingPongLayer) through
        cad.ping_pong_layers (each layer once, for both nano-batches, each on its own CUDA stream), then the final
        norm."""
        import cad
        inner = self.lm.model
        states, extras, label_parts, at = [], [], [], 0
        for tokens, cu, plan in nanos:
            part = slice(at, at + tokens)
            at += tokens
            positions = position_ids[:, part]
            hidden = inner.embed_tokens(input_ids[:, part])
            states.append(hidden)
            extras.append(dict(position_ids=positions, position_embeddings=inner.rotary_emb(hidden, positions),
                               cad_cu_seqlens=cu, cad_plan=plan))
            label_parts.append(labels[:, part])

        for kw in extras:
            kw["attention_mask"] = None
        states = cad.ping_pong_layers(inner.layers[:inner.config.num_hidden_layers], states, extras)
        return [inner.norm(h) for h in states], label_parts

    def _summed_token_losses(self, hidden, labels):
        """Sum of the token cross-entropies (token t predicts label t + 1), --loss-chunk tokens at a time; each
        chunk's logits are recomputed in the backward instead of kept."""
        targets = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)
        hidden = hidden.reshape(-1, hidden.shape[-1])
        total = 0
        for at in range(0, hidden.shape[0], self.loss_chunk):
            part = slice(at, at + self.loss_chunk)
            total = total + torch.utils.checkpoint.checkpoint(self._chunk_loss, hidden[part], targets[part],
                                                              use_reentrant=False)
        return total

    def _chunk_loss(self, hidden, targets):
        logits = self.lm.lm_head(hidden).float()
        return torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")


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
            if len(_max_lengths) > 8:
                _max_lengths.clear()
            _max_lengths[id(cu)] = (cu, max(docs))  # torch_varlen's longest document, without a GPU read
        nanos.append((sum(docs), cu, plan))
    return nanos


def other_gpus_with_context(device):
    """The CUDA devices other than `device` on which this process holds a primary context ([] off CUDA or
    where the driver cannot be asked). A rank should touch its own GPU only: a context elsewhere costs about
    0.5 GiB of that GPU per process (a plan made on a thread whose current device was 0 once did)."""
    if device.type != "cuda":
        return []
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        if index == device.index:
            continue
        handle, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        if (driver.cuDeviceGet(ctypes.byref(handle), index) == 0 and
                driver.cuDevicePrimaryCtxGetState(handle, ctypes.byref(flags), ctypes.byref(active)) == 0 and
                active.value):
            found.append(index)
    return found


def all_gather_floats(values, world):
    t = torch.tensor(values, dtype=torch.float64)
    if world == 1:
        return [t.tolist()]
    out = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(out, t, group=_cpu_group())
    return [o.tolist() for o in out]


_GROUP = {}


def _cpu_group():
    if "g" not in _GROUP:
        _GROUP["g"] = dist.new_group(backend="gloo")
    return _GROUP["g"]


# ---- ping-pong: two nano-batches per rank ---------------------------------------------------------------
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


def plan_summary(stats, shares=None):
    """The step's plans together (every micro-batch's, both nano-batches' with ping-pong, each mask's with
    windowed and global layers), from their stats: imbalance and forward bytes sent per rank, and each plan's
    own imbalance. shares: per plan, the share of the decoder layers that run it (default 1 each: one mask).
    One plan: the plugin's imbalance. Several: max/mean over servers of all plans' forward FLOPs, each times
    its share, added up (a server runs all of them in the step). Bytes per layer: each plan's times its share,
    added up."""
    if shares is None:
        shares = [1.0] * len(stats)
    kept = [(s, w) for s, w in zip(stats, shares) if s]
    if not kept:
        return None
    stats = [s for s, _ in kept]
    imbalance = stats[0]["imbalance"]
    if len(stats) > 1:
        flops = [sum(s["servers"][i]["forward_flops"] * w for s, w in kept) for i in range(len(stats[0]["servers"]))]
        imbalance = max(flops) / (sum(flops) / len(flops)) if sum(flops) else 1.0
    sent = [sum(col) for col in zip(*([b * w for b in s["model_forward_bytes_sent_by_rank"]] for s, w in kept))]
    return {"imbalance": imbalance, "nano_imbalance": [s["imbalance"] for s in stats],
            "forward_bytes_sent_by_rank": sent, "plan_ms": sum(s.get("plan_ms", 0.0) for s in stats),
            "make_ms": sum(s.get("make_ms") or 0.0 for s in stats)}


# ---- --profile-step: where one step's GPU time goes, by kernel family ----------------------------------
KERNEL_FAMILIES = (  # first match wins; names as the CUDA profiler reports them
    ("attention", ("attention_fwd", "attention_bwd", "bwd_preprocess", "fwd_combine", "flash", "fmha", "cudnn")),
    ("cad data path", ("copy_row_ranges", "copy_row_slices", "copy_strided_rows", "sum_rows", "sum_partials",
                       "fill_uncovered", "f32_to_bf16")),
    ("nccl", ("nccl",)),
    ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "sm90_", "sm80_")),
)


def kernel_family(name):
    lowered = name.lower()
    for family, needles in KERNEL_FAMILIES:
        if any(n in lowered for n in needles):
            return family
    return "other"


def profile_summary(profiler, top=25):
    """GPU time of the profiled step by kernel family and the `top` kernels (ms), from torch.profiler's events.
    The sum is kernel time, not wall time: kernels on different streams (communication, ping-pong) overlap."""
    kernels = {}
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time_total > 0:
            entry = kernels.setdefault(event.name, [0, 0.0])
            entry[0] += 1
            entry[1] += event.device_time_total / 1e3
    families = {}
    for name, (_, ms) in kernels.items():
        family = kernel_family(name)
        families[family] = families.get(family, 0.0) + ms
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]
    return {"families_ms": families,
            "kernels": [{"name": n[:160], "calls": c, "ms": round(ms, 3), "family": kernel_family(n)}
                        for n, (c, ms) in ranked]}


# The numbered parts of a --configs name: '+tolT' (balancer tolerance), '+resN' (SMs the own tasks leave free),
# '+ctasN' (CAD's NCCL CTAs), '+hgN' (CAD's head groups).
NUMBERED_MODES = {"tol": r"tol(\d+(\.\d*)?|\.\d+)", "res": r"res\d+", "ctas": r"ctas\d+", "hg": r"hg\d+"}


def numbered_modes(modes):
    """The modes of a --configs name (its '+' parts) that are numbered, by kind (NUMBERED_MODES): one parse for
    the validation and for what each configuration sets."""
    return {kind: [m for m in modes if re.fullmatch(pattern, m)] for kind, pattern in NUMBERED_MODES.items()}


def configurations(args):
    """What to train, as (name, args): the one configuration of --attention/--balancer/--ping-pong, or each of
    --configs with --json-out's {config} filled in by its name."""
    if not args.configs:
        return [(None, args)]
    runs = []
    for name in args.configs.split(","):
        run = argparse.Namespace(**vars(args))
        base, *modes = name.split("+")
        if base == "local_balanced":  # local attention on the batches made balanced: the measured ideal
            base, run.balanced_batches = "local", True
        run.attention = base if base in ("local", "torch_varlen") else "cad"
        run.balancer = base if run.attention == "cad" else args.balancer
        run.ping_pong = "pp" in modes or "ppauto" in modes or "pp1" in modes or "ppmb" in modes
        if "ppmb" in modes:  # the step's micro-batches paired as the nano-batches (--ping-pong-nanos micro-batches)
            run.ping_pong_nanos = "micro-batches"
        if "pp1" in modes:
            run.ping_pong_lanes = 1
        if "ppauto" in modes:
            run.ping_pong_when = "worthwhile"
        if "now" in modes:
            run.plan_ahead = "off"
        if "blocking" in modes:  # CAD's exchanges launched on the calling thread (--cad-nccl-blocking)
            run.cad_nccl_blocking = True
        if "ce" in modes:  # CAD's all-to-alls by the copy engines (--cad-nccl-copy-engines)
            run.cad_nccl_copy_engines = True
        if "own" in modes:  # a rank runs the tasks on documents it holds whole in place (--cad-own-tasks on)
            run.cad_own_tasks = "on"
        if "dyn" in modes:  # the server's forward walks its units dynamically (--cad-forward-walk dynamic)
            run.cad_forward_walk = "dynamic"
        if "time" in modes:  # prefix_aware balances predicted time (--balance-time)
            run.balance_time = True
        numbered = numbered_modes(modes)
        ctas, reserve, tolerance, groups = numbered["ctas"], numbered["res"], numbered["tol"], numbered["hg"]
        if groups:  # +hg2: the server batch's heads in 2 pipelined groups (--cad-head-groups)
            run.cad_head_groups = int(groups[0][2:])
        if ctas:  # +ctas8: CTAs per NCCL operation of CAD's communicator at most (--cad-nccl-max-ctas)
            run.cad_nccl_max_ctas = int(ctas[0][4:])
        if reserve:  # +res16: SMs the own tasks' forward leaves to the collective (--cad-own-reserve-sms)
            run.cad_own_reserve_sms = int(reserve[0][3:])
        if tolerance:  # +tol0.005: the balancer's tolerance (--balancer-tolerance)
            run.balancer_tolerance = float(tolerance[0][3:])
        label = ("local_balanced" if run.balanced_batches and base == "local" else base) + ("_plannow" if "now" in modes else "") + ("_pingpong" if "pp" in modes else "") + \
            ("_pingpongmb" if "ppmb" in modes else "") + \
            ("_autopingpong" if "ppauto" in modes else "") + ("_pingpong1lane" if "pp1" in modes else "") + \
            ("_ncclblocking" if "blocking" in modes else "") + ("_own" if "own" in modes else "") + \
            ("_dyn" if "dyn" in modes else "") + ("_time" if "time" in modes else "") + \
            ("_ce" if "ce" in modes else "") + "".join("_" + m for m in tolerance + reserve + ctas + groups)
        run.json_out = args.json_out.replace("{config}", label) if args.json_out else None
        runs.append((label, run))
    return runs


def balancer_config(args):
    """cad.init's balancer_config from --balancer-tolerance and --balance-time (None: the balancer's defaults)."""
    config = {}
    if args.balancer_tolerance is not None:
        config["tolerance"] = args.balancer_tolerance
    if args.balance_time:
        config["rate_table"] = str(pathlib.Path(args.balancer_rate_table).resolve())
        if args.balancer_min_time_gain is not None:
            config["min_time_gain"] = args.balancer_min_time_gain
    return config or None


class GcPauses:
    """Python's garbage-collector pauses on this rank (gc.callbacks): milliseconds and generation-2 collections
    since the last take(). On 4 GPUs CAD's ranks reached the first layer's plan make up to 180 ms apart, a
    different rank each step (docs/multi_gpu.md, run 7); a collection over the model's and torch's heap is a
    candidate, and this says whether one ran in that step."""

    def __init__(self):
        self.ms, self.full, self._start = 0.0, 0, None
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.ms += (time.perf_counter() - self._start) * 1e3
            self.full += 1 if info.get("generation") == 2 else 0
            self._start = None

    def take(self):
        taken = (self.ms, self.full)
        self.ms, self.full = 0.0, 0
        return taken

    def close(self):
        gc.callbacks.remove(self._callback)


def launched_distributed():
    """Started by torchrun (or another launcher) with more than one rank."""
    return "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1


def train(args):
    import cad

    distributed = launched_distributed()
    if distributed:
        dist.init_process_group(args.backend)
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    lengths = json.loads(pathlib.Path(args.data).read_text())
    for label, run in configurations(args):
        if label is not None and rank == 0:
            print(f"==== configuration {label}", flush=True)
        train_one(run, rank, world, device, lengths)
        # The next configuration starts from the same empty allocator. The collector first: FSDP2's and
        # autograd's reference cycles keep a finished configuration's model, gradients and optimizer state alive
        # until a collection runs, and on 2 H200s (2026-11-26) every later configuration's peak memory was
        # 2.5-3 GiB above the one before it, whatever its attention.
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    cad.shutdown()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


def summary_of(args, world, device):
    """What every configuration's summary says about its setup."""
    return {"attention": args.attention, "balancer": args.balancer if args.attention == "cad" else None,
            "ranks": world, "context": args.context, "micro_batches": args.micro_batches, "model": args.model,
            "layers": args.layers, "steps": args.steps, "hidden": args.hidden, "intermediate": args.intermediate,
            "heads": args.heads, "kv_heads": args.kv_heads, "vocab": args.vocab, "device": str(device),
            "dtype": args.dtype, "parallel": args.parallel if world > 1 else "none (one process)",
            "checkpointing": args.checkpointing, "checkpoint_reentrant": args.checkpoint_reentrant,
            "compile": args.compile, "ping_pong": args.ping_pong,
            "ping_pong_lanes": args.ping_pong_lanes if args.ping_pong else None,
            "ping_pong_nanos": args.ping_pong_nanos if args.ping_pong else None,
            "balanced_batches": args.balanced_batches, "cad_comm_priority": args.cad_comm_priority,
            "cad_nccl_max_ctas": args.cad_nccl_max_ctas, "cad_nccl_blocking": args.cad_nccl_blocking,
            "cad_nccl_copy_engines": args.cad_nccl_copy_engines,
            "cad_own_tasks": args.cad_own_tasks, "cad_own_reserve_sms": args.cad_own_reserve_sms,
            "cad_forward_walk": args.cad_forward_walk, "cad_head_groups": args.cad_head_groups,
            "balancer_tolerance": args.balancer_tolerance,
            "balancer_rate_table": args.balancer_rate_table if args.balance_time else None,
            "balancer_min_time_gain": args.balancer_min_time_gain if args.balance_time else None,
            "plan_ahead": args.plan_ahead, "gc": args.gc,
            "peak_tflops": args.peak_tflops,
            "loss_chunk": args.loss_chunk, "window": args.window, "global_every": args.global_every,
            "windowed_layers": sum(left >= 0 for left in layer_windows(args))}


def write_json(args, result):
    if args.json_out:
        path = pathlib.Path(args.json_out)
        path.parent.mkdir(parents=True, exist_ok=True)  # a fresh output folder is normal, not an error
        path.write_text(json.dumps(result, indent=1))


def train_one(args, rank, world, device, lengths):
    """One configuration: a fresh model (the same weights every time), optimizer and CAD stack; its steps; its
    summary and --json-out (rank 0). Returns {"summary", "steps"[, "profiled_step"]} on every rank."""
    import cad

    if args.attention == "torch_varlen" and torch_varlen_unavailable(device, args.window):
        reason = torch_varlen_unavailable(device, args.window)
        result = {"summary": dict(summary_of(args, world, device), skipped=reason), "steps": []}
        if rank == 0:
            print(f"configuration skipped: {reason}", flush=True)
            write_json(args, result)
        return result
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    cad.init(balancer=args.balancer, communicator=args.communicator, timeout_ms=args.timeout_ms,
             comm_stream_priority=args.cad_comm_priority, nccl_max_ctas=args.cad_nccl_max_ctas,
             nccl_blocking_comm=args.cad_nccl_blocking, nccl_copy_engines=args.cad_nccl_copy_engines,
             own_tasks_in_place=args.cad_own_tasks == "on",
             own_tasks_reserve_sms=args.cad_own_reserve_sms, forward_walk=args.cad_forward_walk,
             head_groups=args.cad_head_groups,
             balancer_config=balancer_config(args))
    # --ping-pong-when worthwhile: unsplit until one measured step says whether splitting pays (cad.PingPongChoice).
    # The decision, made after step `decided_at` of the schedule, takes effect from the second step after it: the
    # next step's first micro-batch was asked for (its plans made ahead) while the step ran, undecided, i.e.
    # unsplit. Waiting for the decision before asking made that plan at the micro-batch's start instead, on the
    # critical path (18-34 ms in the step after the decision, 2 H200s at 64K: docs/multi_gpu.md, run 53).
    choice = cad.PingPongChoice(args.ping_pong_min_stall_share) \
        if args.ping_pong and args.ping_pong_when == "worthwhile" else None
    decided_at = None  # the schedule index after which choice decided

    def splitting(index):
        """Whether step `index` of the schedule splits its micro-batches (the same on every rank)."""
        if not args.ping_pong or choice is None:
            return bool(args.ping_pong)
        return choice.split is True and decided_at is not None and index >= decided_at + 2

    def pairing(index):
        """Whether step `index` runs its micro-batches in pairs, each pair's two as the nano-batches of one call."""
        return splitting(index) and args.ping_pong_nanos == "micro-batches"

    def groups_of(index, count):
        """The micro-batches of step `index` in the order they run: pairs (--ping-pong-nanos micro-batches) or
        one at a time."""
        size = 2 if pairing(index) else 1
        return [list(range(g, min(g + size, count))) for g in range(0, count, size)]

    def set_split(split):
        # Attention times wait for the GPU around every call, except with ping-pong on CUDA, where waiting would
        # serialise the two nano-batches' streams: there they count only the enqueue (recorded in the summary).
        synced = args.sync_attention_timing == "on" and not (split and device.type == "cuda")
        cad.timing(sync_cuda=synced)
        AttentionClock.sync = synced
        if choice is not None and hasattr(model, "set_reshard_after_forward"):  # FSDP2, see wrap_data_parallel
            for layer in model.lm.model.layers:
                layer.set_reshard_after_forward(not split)
        return synced
    if device.type == "cuda":  # the configuration's peak: model, optimizer state and every step
        torch.cuda.reset_peak_memory_stats(device)
    fsdp2 = args.parallel == "fsdp2" and world > 1
    lm = build_model(args, device, torch.float32 if fsdp2 else dtype)  # FSDP2: fp32 master weights
    params = count_matmul_parameters(lm)
    apply_checkpointing(lm, args.checkpointing, args.checkpoint_reentrant)
    if args.compile:
        for layer in lm.model.layers:
            layer.compile()
    if args.ping_pong:  # each decoder layer takes both nano-batches in one call (the data-parallel wrapper's unit)
        import cad
        lm.model.layers = torch.nn.ModuleList(cad.PingPongLayer(layer) for layer in lm.model.layers)
    model = wrap_data_parallel(MicroBatchLoss(lm, args.loss_chunk), args, device, world, dtype)
    ddp = args.parallel == "ddp" and world > 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if args.gc == "freeze":  # what exists now (model, torch, transformers) is never scanned again
        gc.collect()
        gc.freeze()
    pauses = GcPauses()
    history = []
    # --profile-step N: after the timed steps, step N's batch once more under the profiler (the timed steps
    # stay unprofiled, so every configuration's means cover the same batches).
    schedule = [(step, False) for step in range(args.steps)]
    if args.profile_step >= 0:
        schedule.append((args.profile_step, True))
    profiled_record = None

    def load(step):
        """A step's micro-batches: [every rank's documents, every rank's nano-batches, this rank's inputs, parts]
        (parts: MicroBatchLoss's nanos with their plans, asked for by `ask`)."""
        micro = []
        for mb in range(args.micro_batches):
            batch = cached_batch(lengths, args.context, world, args.seed + 1000 * step + mb)
            docs_by_rank = [docs or [args.context] for docs in batch]
            if args.balanced_batches:
                docs_by_rank = balanced_documents(docs_by_rank)
            inputs = make_inputs(docs_by_rank[rank], args.vocab, args.seed * 7919 + 31 * step + rank + 100003 * mb,
                                 device)
            micro.append([docs_by_rank, None, inputs, None])  # nano-batches and parts: ask()
        return micro

    def ask(micro, index, mb):
        """Micro-batch mb's nano-batches (split or not: splitting(index)), parts and plans (collective with CAD, in
        the same order on every rank): with --plan-ahead on, queued on CAD's planning thread; otherwise made now."""
        if micro[mb][3] is None:
            docs_by_rank = micro[mb][0]
            halves = splitting(index) and not pairing(index)
            nanos = micro[mb][1] = nano_batches(docs_by_rank, halves)
            if halves and len(nanos[rank]) < 2 and rank == 0:
                print(f"step {schedule[index][0]}: ping-pong off for micro-batch {mb}: rank(s) "
                      f"{[r for r, d in enumerate(docs_by_rank) if len(d) < 2]} hold one document, which cannot be "
                      f"split into two nano-batches; it runs as one nano-batch", flush=True)
            micro[mb][3] = make_nanos(nanos[rank], args.attention, args, device, dtype,
                                      tag=index * args.micro_batches + mb,
                                      lane=mb % args.ping_pong_lanes if pairing(index) else None)

    ahead = args.attention == "cad" and args.plan_ahead == "on"
    loaded = {}  # schedule index -> its micro-batches, loaded while the step before it ran
    # CAD's exchanges on the GPU, cumulative (cad.exchange_times): the last step's end, for this step's share.
    exchanged = {} if device.type == "cuda" and args.attention == "cad" else None
    called = {} if exchanged is not None else None  # CAD's calls on the GPU (cad.call_times), the same way
    retries_before = allocator_retries(device)
    for index, (step, profiling) in enumerate(schedule):
        micro = loaded.pop(index, None) or load(step)
        synced_timing = set_split(splitting(index))
        groups = groups_of(index, len(micro))
        if ahead:
            for mb in groups[0]:
                ask(micro, index, mb)  # usually asked for during the step before
        if device.type == "cuda":
            torch.cuda.synchronize()
        profiler = None
        if profiling:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            profiler = torch.profiler.profile(activities=activities)
            profiler.__enter__()
        pauses.take()
        start = time.perf_counter()
        cad.attention_time(reset=True)
        AttentionClock.take()
        loss_sum, attention_by_mb, plans = 0.0, [], []
        for g, group in enumerate(groups):
            # What the next micro-batches need are loaded (and, with --plan-ahead, their plans asked for) before
            # these compute; after the step's last come the next step's first. Every configuration loads at the
            # same point, so the comparison is fair.
            if g + 1 < len(groups):
                if ahead:
                    for mb in groups[g + 1]:
                        ask(micro, index, mb)
            elif index + 1 < len(schedule):
                loaded[index + 1] = load(schedule[index + 1][0])
                if ahead:
                    for mb in groups_of(index + 1, len(loaded[index + 1]))[0]:
                        ask(loaded[index + 1], index + 1, mb)
            parts = []
            for mb in group:
                ask(micro, index, mb)  # without --plan-ahead: made here, at the micro-batch's start
                parts += micro[mb][3]
                micro[mb][3] = None  # the step holds its parts only while they run
            # A pair's two micro-batches one after the other in one buffer, each its own nano-batch.
            if len(group) == 1:
                docs_by_rank, nanos = micro[group[0]][:2]
                inputs = run_order(micro[group[0]][2], docs_by_rank[rank], nanos[rank])
            else:
                inputs = {key: torch.cat([micro[mb][2][key] for mb in group], dim=1) for key in micro[group[0]][2]}
            # DDP all-reduces once per step: the last micro-batch's backward; the others only accumulate.
            quiet = model.no_sync() if ddp and g < len(groups) - 1 else contextlib.nullcontext()
            with quiet:
                loss = model(**inputs, nanos=parts, paired=len(group) == 2)
                (loss / args.micro_batches).backward()
            for _, _, plan in parts:  # a plan, a tuple of plans (one per mask), or None (local attention)
                plans += [] if plan is None else list(plan) if isinstance(plan, tuple) else [plan]
            # Per micro-batch (pair): the ranks wait for each other at least once per micro-batch (FSDP2's
            # reduce-scatter after its backward, every layer's gathers), so imbalance costs per micro-batch.
            attention_by_mb.append(cad.attention_time(reset=True) + AttentionClock.take())
            loss_sum = loss_sum + loss.detach() / args.micro_batches
            del parts, loss, inputs  # the plans go back once nothing (autograd included) refers to them
        plan_stats = [plan.stats for plan in plans]
        layers_of = dict(masks(args))  # window left -> the decoder layers that run its plans
        plan_windows = [plan.window_left for plan in plans]
        plan_shares = [layers_of[left] / args.layers for left in plan_windows]
        make_starts = [plan.make_started_at for plan in plans]
        plan_wait_ms = sum(plan.wait_ms for plan in plans)
        del plans
        norm = grad_norm(model.parameters())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        attention = sum(attention_by_mb) + cad.attention_time(reset=True) + AttentionClock.take()
        if profiler is not None:
            profiler.__exit__(None, None, None)
            profile = profile_summary(profiler)
            profile.update(rank=rank, step=step, step_s=seconds, note="timed with the profiler on: slower than the "
                           "other steps; compare families and kernels, not this step's time")
            if args.json_out:
                out = pathlib.Path(args.json_out)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.with_name(f"{out.stem}_profile_rank{rank}.json").write_text(json.dumps(profile, indent=1))
                if args.profile_trace:  # the timeline: which streams ran what when (chrome://tracing, Perfetto)
                    profiler.export_chrome_trace(str(out.with_name(f"{out.stem}_trace_rank{rank}.json")))
            if rank == 0:
                print("profile of step %d on rank 0 (kernel ms by family): %s" % (
                    step, json.dumps({k: round(v, 1) for k, v in profile["families_ms"].items()})), flush=True)
        gc_ms, gc_full = pauses.take()
        # CAD's exchanges in this step as the GPU ran them (the step ended with a synchronize: all counted).
        comm_ms = stall_ms = 0.0
        if exchanged is not None:
            now = cad.exchange_times(device) or {}
            comm_ms = now.get("comm_ms", 0.0) - exchanged.get("comm_ms", 0.0)
            stall_ms = now.get("stall_ms", 0.0) - exchanged.get("stall_ms", 0.0)
            exchanged = now
        # CAD's calls in this step as the GPU ran them: each direction's calls and the server compute inside them.
        call_ms = [0.0] * 4  # forward, forward server, backward, backward server
        if called is not None:
            now = cad.call_times(device) or {}
            keys = ("forward_ms", "forward_server_ms", "backward_ms", "backward_server_ms")
            call_ms = [now.get(k, 0.0) - called.get(k, 0.0) for k in keys]
            called = now
        # Host time from the step's start to its first plan make (which waits for every rank): a rank that
        # arrives late shows here.
        pre_plan_ms = (min(make_starts) - start) * 1e3 if make_starts and not ahead else 0.0
        stats = plan_summary(plan_stats, plan_shares)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
        retries = allocator_retries(device)
        alloc_retries, retries_before = retries - retries_before, retries
        mine = sum(sum(docs_by_rank[rank]) for docs_by_rank, _, _, _ in micro)
        gathered = all_gather_floats([float(loss_sum), seconds, attention, float(mine), peak,
                                      stats["plan_ms"] if stats else 0.0, stats["make_ms"] if stats else 0.0,
                                      pre_plan_ms, gc_ms, float(gc_full), plan_wait_ms, comm_ms, stall_ms,
                                      float(alloc_retries)] + call_ms + attention_by_mb, world)
        costs = [sum(attention_pairs(args, docs_by_rank[r]) for docs_by_rank, _, _, _ in micro) for r in range(world)]
        colocated = max(costs) / (sum(costs) / len(costs))
        imbalance = stats["imbalance"] if stats else colocated
        slowest = max(g[1] for g in gathered)
        flops = model_flops(args, params, [docs_by_rank for docs_by_rank, _, _, _ in micro])
        split = len(groups) < len(micro) or all(len(nanos[rank]) == 2 for _, nanos, _, _ in micro)
        record = {"step": step, "loss": sum(g[0] for g in gathered) / world,
                  "losses": [g[0] for g in gathered], "grad_norm": norm.item(),
                  "tokens_per_s": sum(g[3] for g in gathered) / slowest, "step_s": [g[1] for g in gathered],
                  "model_tflop": flops / 1e12, "mfu": flops / (slowest * world * args.peak_tflops * 1e12),
                  "peak_memory_gib": [g[4] for g in gathered], "plan_ms": [g[5] for g in gathered],
                  "plan_make_ms": [g[6] for g in gathered], "pre_plan_ms": [g[7] for g in gathered],
                  "gc_ms": [g[8] for g in gathered], "gc_full_collections": [int(g[9]) for g in gathered],
                  "attention_s": [g[2] for g in gathered], "imbalance": imbalance, "colocated_imbalance": colocated,
                  "plan_wait_ms": [g[10] for g in gathered], "exchange_comm_ms": [g[11] for g in gathered],
                  "exchange_stall_ms": [g[12] for g in gathered],
                  "alloc_retries": [int(g[13]) for g in gathered],
                  "call_forward_ms": [g[14] for g in gathered], "call_forward_server_ms": [g[15] for g in gathered],
                  "call_backward_ms": [g[16] for g in gathered], "call_backward_server_ms": [g[17] for g in gathered],
                  "attention_s_by_micro_batch": [[g[18 + mb] for g in gathered] for mb in range(len(attention_by_mb))],
                  "ping_pong": split, "nano_tokens": [[[sum(d) for d in n] for n in nanos] for _, nanos, _, _ in micro],
                  "profiled": profiling}
        if stats:
            record["nano_imbalance"] = stats["nano_imbalance"]
            record["plan_windows"] = plan_windows  # each plan's window left (-1: global), as nano_imbalance
            record["forward_bytes_sent_by_rank"] = stats["forward_bytes_sent_by_rank"]
        if profiling:
            profiled_record = record
        else:
            history.append(record)
        if choice is not None and choice.split is None and index >= 1 and not split and not profiling:
            choice.observe(slowest * 1e3, max(record["exchange_stall_ms"]))  # step 0 warms up
            decided_at = index
            if rank == 0:
                print(f"step {step}: {choice.reason}", flush=True)
        if rank == 0:
            mode = ("  ping-pong" if split else "") + ("  (profiled again)" if profiling else "")
            print(f"step {step:3d}  loss {record['loss']:.5f}  {slowest * 1e3:8.1f} ms  {record['tokens_per_s']:9.0f} "
                  f"tok/s  MFU {record['mfu']:6.1%}  peak {max(record['peak_memory_gib']):5.1f} GiB  attention s/rank "
                  f"[{', '.join(f'{a:.3f}' for a in record['attention_s'])}]  imbalance {imbalance:.3f} "
                  f"(colocated {colocated:.3f}){mode}"
                  + (f"  allocator retries {max(record['alloc_retries'])}" if max(record["alloc_retries"]) else ""),
                  flush=True)
    tail = history[1:] or history  # step 0 warms up
    # Which ranks opened a CUDA context on a GPU not theirs (each costs that GPU about 0.5 GiB).
    strays = [r for r, g in enumerate(all_gather_floats([float(len(other_gpus_with_context(device)))], world)) if g[0]]
    if strays and rank == 0:
        print(f"warning: ranks {strays} hold a CUDA context on a GPU other than their own", flush=True)
    summary = dict(summary_of(args, world, device), params=params, ping_pong_steps=sum(r["ping_pong"] for r in history),
                   attention_timing="synchronized" if synced_timing
                   else "enqueue only (ping-pong on CUDA, or --sync-attention-timing off)",
                   first_loss=history[0]["loss"], last_loss=history[-1]["loss"],
                   mean_tokens_per_s_after_step0=sum(r["tokens_per_s"] for r in tail) / len(tail),
                   mean_step_s_after_step0=sum(max(r["step_s"]) for r in tail) / len(tail),
                   mean_mfu_after_step0=sum(r["mfu"] for r in tail) / len(tail),
                   peak_memory_gib=max(max(r["peak_memory_gib"]) for r in history),
                   alloc_retries_after_step0=sum(max(r["alloc_retries"]) for r in tail),
                   mean_max_attention_s=sum(max(r["attention_s"]) for r in tail) / len(tail),
                   mean_imbalance=sum(r["imbalance"] for r in tail) / len(tail),
                   mean_exchange_stall_ms=sum(max(r["exchange_stall_ms"]) for r in tail) / len(tail),
                   ping_pong_decision=choice.reason if choice is not None else None,
                   ranks_with_contexts_on_other_gpus=strays)
    result = {"summary": summary, "steps": history}
    if profiled_record is not None:
        result["profiled_step"] = profiled_record
    if rank == 0:
        print("summary " + json.dumps(summary), flush=True)
        write_json(args, result)
    pauses.close()
    if args.gc == "freeze":
        gc.unfreeze()
    return result


def apply_model_defaults(args):
    """Fill what the command line left open from --model's preset (MODELS), --intermediate 0 as 3 x --hidden, and
    --dtype by --device (bf16 on CUDA, fp32 on the CPU). Returns args."""
    for key, value in MODELS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.intermediate == 0:
        args.intermediate = args.hidden * 3
    if args.dtype is None:
        args.dtype = "bf16" if args.device == "cuda" else "fp32"
    return args


# ---- the attention clock's option, one for every trainer of the project -----------------------------------
def add_attention_timing_option(parser, on_means):
    """--sync-attention-timing auto|on|off, as train_llama.py, train_pipeline.py and Megatron's train_gpt_cad.py
    take it; `on_means`: what `on` gives that trainer. resolve_attention_timing(args) turns `auto` into a choice."""
    parser.add_argument("--sync-attention-timing", choices=["auto", "on", "off"], default="auto",
                        help=f"on: {on_means}; off: no CUDA waits around attention calls, step times as a trainer "
                             "without the measurement has them, attention times count only the enqueue; auto "
                             "(default): off on CUDA, on elsewhere. The syncs slow an imbalanced step far more than "
                             "a balanced one (local attention 6-12%% slower on 2 H200s, CAD 1%%: docs/multi_gpu.md, "
                             "runs 21-22), so step times and speedups come from off")


def resolve_attention_timing(args):
    """`auto` -> off on CUDA (step times without the syncs), on elsewhere (nothing to wait for)."""
    if args.sync_attention_timing == "auto":
        args.sync_attention_timing = "off" if args.device == "cuda" else "on"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attention", choices=["local", "torch_varlen", "cad"], default="cad",
                   help="cad (CAD plans over the ranks), local (the project's kernels, no CAD: \"cad_local\") or "
                        "torch_varlen (torch.nn.attention.varlen.varlen_attn: CUDA, torch >= 2.9)")
    p.add_argument("--balancer", default="prefix_aware", help="colocated, per_doc_cp, distca, prefix_aware")
    p.add_argument("--communicator", default=None, help="host, mpi or nccl (default: host on CPU, nccl on CUDA)")
    p.add_argument("--model", choices=sorted(MODELS), default="tiny",
                   help="shape preset: tiny (hidden 128, 4 heads, 2 KV heads, 2 layers, vocab 1024) or llama3-8b "
                        "(hidden 4096, 32 heads, 8 KV heads, MLP 14336, vocab 128256, 32 layers); the options "
                        "below override it")
    p.add_argument("--context", type=int, default=2048, help="tokens per rank and micro-batch (one packed buffer)")
    p.add_argument("--micro-batches", type=int, default=1,
                   help="micro-batches per optimizer step (gradient accumulation), each its own batch and CAD plan")
    p.add_argument("--layers", type=int, default=None, help="default: the --model preset's")
    p.add_argument("--hidden", type=int, default=None, help="default: the --model preset's")
    p.add_argument("--intermediate", type=int, default=None,
                   help="MLP width (Llama's intermediate_size; Llama-3 8B: 14336); 0: 3 x --hidden (tiny's default)")
    p.add_argument("--heads", type=int, default=None, help="default: the --model preset's")
    p.add_argument("--kv-heads", type=int, default=None, help="default: the --model preset's")
    p.add_argument("--vocab", type=int, default=None, help="default: the --model preset's")
    p.add_argument("--window", type=int, default=-1,
                   help="sliding window: a windowed layer's query at document position p sees the keys [p - WINDOW, p] "
                        "(window_size=(WINDOW, 0); transformers' sliding_window = WINDOW + 1). Default -1: no "
                        "window, every layer global. Without --global-every every layer is windowed")
    p.add_argument("--global-every", type=int, default=None,
                   help="with --window: every N-th decoder layer (layers N-1, 2N-1, ...) is global (causal), the "
                        "others windowed: 6 = Gemma-3's 5 windowed : 1 global, 2 = gpt-oss's alternation. Default: "
                        "none global")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None,
                   help="compute dtype (default: fp32 on CPU, bf16 on CUDA); FSDP2 keeps fp32 master weights")
    p.add_argument("--parallel", choices=["ddp", "fsdp2"], default=None,
                   help="data parallelism: ddp (DistributedDataParallel) or fsdp2 (fully_shard per decoder layer "
                        "and the root). Default: fsdp2 on CUDA over NCCL, else ddp")
    p.add_argument("--checkpointing", choices=["none", "full", "attention", "mlp"], default="none",
                   help="activation checkpointing: full (transformers' own, every decoder layer recomputed in the "
                        "backward; non-reentrant unless --checkpoint-reentrant), attention / mlp (only each "
                        "layer's self_attn / mlp recomputed, non-reentrant)")
    p.add_argument("--checkpoint-reentrant", action="store_true",
                   help="with --checkpointing full: torch's reentrant checkpoint (use_reentrant=True)")
    p.add_argument("--compile", action="store_true", help="torch.compile every decoder layer")
    p.add_argument("--loss-chunk", type=int, default=4096,
                   help="tokens per chunk of the head and cross-entropy (each chunk's logits recomputed in the "
                        "backward instead of kept)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="peak dense bf16 TFLOP/s of one device, for MFU (default 989: H100 SXM)")
    p.add_argument("--timeout-ms", type=int, default=120000)
    p.add_argument("--data", default=os.environ.get("CAD_DATA", str(REPO.parent / "shared" / "data" /
                                                                    "doclen_pretrain.json")))
    p.add_argument("--ping-pong", action="store_true",
                   help="two nano-batches per decoder-layer call (see --ping-pong-nanos; by default every rank's "
                        "buffer split at the document boundary nearest half its tokens: whole documents; a document cut across ranks counts as one document of "
                        "each rank and stays whole in its nano-batch), one plan each, decoder layers through "
                        "cad.ping_pong; same loss and gradients as without. A micro-batch where a rank holds one "
                        "document runs unsplit, with a note (its step's record says \"ping_pong\": false)")
    p.add_argument("--ping-pong-when", choices=["always", "worthwhile"], default="always",
                   help="with --ping-pong: always split, or worthwhile: run unsplit until one measured step (after "
                        "the warm-up) says whether CAD's exchanges stall the step long enough to be worth hiding "
                        "(cad.PingPongChoice: at least --ping-pong-min-stall-share of the step), then split or not "
                        "for good from the second step after it (the next one's plans were made ahead, unsplit), "
                        "saying why (the summary's ping_pong_decision)")
    p.add_argument("--ping-pong-nanos", choices=["halves", "micro-batches"], default="halves",
                   help="with --ping-pong, what the two nano-batches are: halves (default: every micro-batch "
                        "split in two, each half balanced by a plan of its own) or micro-batches (micro-batches "
                        "2j and 2j+1 of the step run as the two nano-batches of one forward and backward, each "
                        "with its unsplit plan: no document moves that the unsplit step would not move, at the "
                        "cost of holding two micro-batches' activations at once; needs an even --micro-batches)")
    p.add_argument("--ping-pong-min-stall-share", type=float, default=0.07,
                   help="what splitting costs, as a share of the step (default 0.07: on 2 and 4 H200s at 64K-128K "
                        "tokens per GPU ping-pong lost 0.1-3%% of the step where the unsplit stall was 2.5-4.2%%, "
                        "docs/multi_gpu.md); below it ping-pong stays off")
    add_attention_timing_option(p, "CUDA synchronised around every attention call (not under ping-pong), so "
                                   "attention times are the GPU's")
    p.add_argument("--balanced-batches", action="store_true",
                   help="replace every micro-batch by its balanced twin (each rank's tokens as equal-length documents "
                        "whose causal attention work is the mean rank's): with local attention, the measured ideal "
                        "of balance at no communication cost (config 'local_balanced'); causal layers only")
    p.add_argument("--cad-comm-priority", choices=["highest", "normal"], default="highest",
                   help="CAD's CUDA communication stream priority (cad.init's comm_stream_priority)")
    p.add_argument("--cad-nccl-max-ctas", type=int, default=0,
                   help="at most this many CTAs per NCCL operation of CAD's communicator (cad.init's nccl_max_ctas; "
                        "0: NCCL's default)")
    p.add_argument("--balancer-tolerance", type=float, default=None,
                   help="the CAD balancer's tolerance (distca, prefix_aware; cad.init's balancer_config): prefix_aware "
                        "fills servers up to mean x (1 + T), default 0.02; a smaller T balances tighter and moves more "
                        "bytes (docs/balancers.md)")
    p.add_argument("--balance-time", action="store_true",
                   help="prefix_aware balances the servers' predicted attention time (forward + backward, from "
                        "--balancer-rate-table) instead of FLOPs, where that predicts a max/mean lower by more than "
                        "--balancer-min-time-gain (docs/balancers.md)")
    p.add_argument("--balancer-rate-table", default=str(REPO / "configs" / "calibration" / "h200.json"),
                   help="the kernel-rate table --balance-time predicts with (default configs/calibration/h200.json)")
    p.add_argument("--balancer-min-time-gain", type=float, default=None,
                   help="with --balance-time: keep the time-balanced plan only where it predicts a max/mean lower "
                        "than the FLOP plan's by more than this (prefix_aware's min_time_gain, default 0.015; 0: "
                        "always)")
    p.add_argument("--cad-nccl-blocking", action="store_true",
                   help="CAD's NCCL communicator blocking (cad.init's nccl_blocking_comm): exchanges launch on the "
                        "calling thread instead of NCCL's job thread")
    p.add_argument("--cad-nccl-copy-engines", action="store_true",
                   help="CAD's all-to-alls through the GPUs' copy engines and CUDA IPC (cad.init's nccl_copy_engines; "
                        "every rank on one host): no SM, so they can run beside the attention kernels")
    p.add_argument("--cad-own-tasks", choices=["on", "off"], default="off",
                   help="on: a rank runs the tasks on documents it holds whole in place on its own tensors while one "
                        "collective moves the other rows (cad.init's own_tasks_in_place; measured no faster, "
                        "docs/multi_gpu.md runs 30-32); off (default): they go through the exchange to itself")
    p.add_argument("--cad-own-reserve-sms", type=int, default=16,
                   help="SMs the own tasks' forward kernel leaves free for the collective running beside it "
                        "(cad.init's own_tasks_reserve_sms; default 16; 0: every SM)")
    p.add_argument("--cad-forward-walk", choices=["static", "dynamic"], default="static",
                   help="on GPUs, how the server's forward kernel walks its units (cad.init's forward_walk): static "
                        "(default; a fixed share per block) or dynamic (each block takes the next untaken unit)")
    p.add_argument("--cad-head-groups", type=int, default=1,
                   help="on GPUs over NCCL, each CAD call's heads in this many pipelined groups (cad.init's "
                        "head_groups; a divisor of --heads and --kv-heads): the server computes one group while the "
                        "next one's rows arrive and the last one's results leave; 1 (default): unsplit")
    p.add_argument("--ping-pong-lanes", type=int, choices=[1, 2], default=2,
                   help="with --ping-pong: 2 (default) runs each nano-batch's plans on its own CAD lane (its own "
                        "communicator and communication stream: cad.plan's lane), 1 runs both on one, where "
                        "nano-batch 1's send queues behind nano-batch 0's return")
    p.add_argument("--json-out", default=None, help="write every step's record and the summary here (rank 0); "
                   "with --configs it must contain {config}, replaced by each configuration's name")
    p.add_argument("--configs", default=None,
                   help="train several configurations one after another in this process (one start-up): a comma "
                        "list of 'local' (the project's kernels, no CAD), 'local_balanced' (local on the batches "
                        "made balanced: --balanced-batches), 'torch_varlen' (torch's varlen_attn; "
                        "skipped with a note on CPU or without it) or a balancer name (CAD: per_doc_cp, distca, "
                        "prefix_aware, colocated), each optionally with '+pp' (--ping-pong), '+pp1' (--ping-pong "
                        "--ping-pong-lanes 1), '+ppmb' (--ping-pong --ping-pong-nanos micro-batches), '+ppauto' (--ping-pong --ping-pong-when worthwhile), '+now' "
                        "(--plan-ahead off), '+blocking' (--cad-nccl-blocking), '+own' (--cad-own-tasks on), '+resN' "
                        "(--cad-own-reserve-sms N), '+dyn' (--cad-forward-walk dynamic), '+time' (--balance-time), '+ce' "
                        "(--cad-nccl-copy-engines), '+ctasN' "
                        "(--cad-nccl-max-ctas N), '+hgN' (--cad-head-groups N) and/or '+tolT' (--balancer-tolerance "
                        "T), e.g. "
                        "local,torch_varlen,prefix_aware,prefix_aware+now,distca+pp. Each starts from the same "
                        "weights; its JSON is --json-out with {config} = its name, + '_plannow' with +now, + "
                        "'_pingpong' with +pp, + '_pingpongmb' with +ppmb, + '_pingpong1lane' with +pp1, + '_autopingpong' with +ppauto, + "
                        "'_ncclblocking' with +blocking, + '_own' with +own, + '_dyn' with +dyn, + '_time' with +time, "
                        "+ '_ce' with +ce, "
                        "+ '_tolT' with +tolT, "
                        "+ '_resN' with +resN, + '_ctasN' with +ctasN, + '_hgN' with +hgN. Overrides --attention, "
                        "--balancer, --ping-pong, --ping-pong-nanos, --plan-ahead, --cad-nccl-blocking, --cad-own-tasks, "
                        "--cad-own-reserve-sms, --cad-forward-walk, --cad-nccl-max-ctas, --cad-head-groups, "
                        "--balancer-tolerance, --balance-time, --cad-nccl-copy-engines")
    p.add_argument("--plan-ahead", choices=["on", "off"], default="on",
                   help="CAD's plans: on (default): a micro-batch's plans are asked for when the micro-batch before "
                        "it starts (the next step's first during this step's last) and made on CAD's planning "
                        "thread, their collectives on a gloo group of their own (cad.plan(ahead=True)); each step "
                        "records how long its forwards still waited for them (plan_wait_ms). off: made at the "
                        "micro-batch's start, on the training thread (collective, waits for every rank)")
    p.add_argument("--gc", choices=["auto", "freeze"], default="auto",
                   help="Python's garbage collector: auto (as is), or freeze: gc.freeze() once the model and "
                        "optimizer exist, so that collections no longer scan them (every step records its "
                        "collector pauses per rank: gc_ms, gc_full_collections)")
    p.add_argument("--profile-step", type=int, default=-1,
                   help="after the timed steps, run this step's batch once more under torch.profiler and write, "
                        "per rank, its GPU kernel time by family (attention, cad data path, nccl, gemm, other) and "
                        "its top kernels to <json-out stem>_profile_rank<R>.json; its record is the JSON's "
                        "\"profiled_step\", outside \"steps\" (default -1: no profiling)")
    p.add_argument("--list-configs", action="store_true",
                   help="with --configs: print each configuration and its name in the JSON files (config<TAB>name, "
                        "one per line) and exit, training nothing")
    p.add_argument("--profile-trace", action="store_true",
                   help="with --profile-step: also write the profiled step's timeline per rank to <json-out stem>"
                        "_trace_rank<R>.json (Chrome trace format: every kernel on its stream, every host call)")
    args = apply_model_defaults(p.parse_args(argv))
    # NCCL for the gradients only where CAD uses NCCL too (one process per GPU); processes sharing a GPU
    # (communicator host or mpi) average their gradients over gloo.
    args.backend = "nccl" if args.device == "cuda" and args.communicator in (None, "nccl") else "gloo"
    if args.parallel is None:
        args.parallel = "fsdp2" if args.backend == "nccl" else "ddp"
    if args.parallel == "fsdp2" and args.device == "cuda" and args.backend != "nccl":
        p.error("--parallel fsdp2 on CUDA needs NCCL (--communicator nccl): gloo has no CUDA reduce-scatter")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must divide by --heads, and --heads by --kv-heads")
    if args.intermediate < 0:
        p.error(f"--intermediate must be positive (or 0 for 3 x --hidden), got {args.intermediate}")
    if args.layers < 1 or args.micro_batches < 1 or args.loss_chunk < 1 or args.steps < 1:
        p.error("--layers, --micro-batches, --loss-chunk and --steps must be at least 1")
    if args.balanced_batches and args.window >= 0:
        p.error("--balanced-batches balances causal attention work; it has no meaning with --window")
    if args.window < -1:
        p.error(f"--window must be -1 (no window) or at least 0 (the keys before the query a windowed layer "
                f"sees), got {args.window}")
    if args.global_every is not None:
        if args.window < 0:
            p.error("--global-every needs --window (without a window every layer is global already)")
        if args.global_every < 2:
            p.error(f"--global-every must be at least 2 (every N-th layer global, the others windowed; 1 would "
                    f"make every layer global: drop --window instead), got {args.global_every}")
    if args.ping_pong_nanos == "micro-batches" and (args.micro_batches % 2 or not (args.ping_pong or args.configs)):
        p.error(f"--ping-pong-nanos micro-batches pairs the step's micro-batches: it needs --ping-pong and an even "
                f"--micro-batches, got --micro-batches {args.micro_batches}"
                + ("" if args.ping_pong or args.configs else " without --ping-pong"))
    if not 0.0 <= args.ping_pong_min_stall_share < 1.0:
        p.error(f"--ping-pong-min-stall-share must be in [0, 1), got {args.ping_pong_min_stall_share}")
    if (args.balance_time or (args.configs and "+time" in args.configs)) and \
            not pathlib.Path(args.balancer_rate_table).is_file():
        p.error(f"--balancer-rate-table: {args.balancer_rate_table} is not a file (the kernel-rate table --balance-time "
                f"and '+time' predict with)")
    if args.balancer_min_time_gain is not None and not 0 <= args.balancer_min_time_gain <= 1:
        p.error(f"--balancer-min-time-gain must be in [0, 1], got {args.balancer_min_time_gain}")
    if args.balancer_tolerance is not None and not 0 <= args.balancer_tolerance <= 10:
        p.error(f"--balancer-tolerance must be in [0, 10], got {args.balancer_tolerance}")
    if not 1 <= args.cad_head_groups <= 64 or args.heads % args.cad_head_groups or args.kv_heads % args.cad_head_groups:
        p.error(f"--cad-head-groups must be in [1, 64] and divide --heads ({args.heads}) and --kv-heads "
                f"({args.kv_heads}), got {args.cad_head_groups}")
    if args.checkpoint_reentrant and args.checkpointing != "full":
        p.error("--checkpoint-reentrant applies to --checkpointing full only (selective checkpointing is "
                "non-reentrant)")
    if args.profile_step >= args.steps:
        p.error(f"--profile-step must name one of the {args.steps} steps (0..{args.steps - 1}), got {args.profile_step}")
    if args.list_configs and args.configs is None:
        p.error("--list-configs lists the configurations of --configs: give --configs")
    if args.configs is not None:
        names = args.configs.split(",")
        def refused(name):
            base, *modes = name.split("+")
            splits = {"pp", "pp1", "ppauto", "ppmb"} & set(modes)
            numbered = numbered_modes(modes)
            tolerances, reserves, ctas, groups = numbered["tol"], numbered["res"], numbered["ctas"], numbered["hg"]
            return (not base or any(m not in ("pp", "pp1", "ppauto", "ppmb", "now", "blocking", "own", "dyn", "time", "ce")
                                    and m not in tolerances + reserves + ctas + groups for m in modes)
                    or len(groups) > 1 or (groups and not 1 <= int(groups[0][2:]) <= 64)
                    or (groups and (args.heads % int(groups[0][2:]) or args.kv_heads % int(groups[0][2:])))
                    or (groups and base in ("local", "torch_varlen", "local_balanced"))
                    or len(reserves) > 1 or (reserves and (base in ("local", "torch_varlen", "local_balanced")
                                                           or "own" not in modes or int(reserves[0][3:]) > 64))
                    or len(ctas) > 1 or (ctas and int(ctas[0][4:]) > 64)
                    or (base in ("local", "torch_varlen", "local_balanced") and ("dyn" in modes or ctas))
                    or len(set(modes)) != len(modes) or len(splits) > 1 or (base == "local_balanced" and modes)
                    or (base in ("local", "torch_varlen", "local_balanced") and ("blocking" in modes or "own" in modes
                                                                                 or "ce" in modes))
                    or ("time" in modes and base != "prefix_aware")
                    or ("ppmb" in modes and args.micro_batches % 2)
                    or (tolerances and (base not in ("distca", "prefix_aware") or len(tolerances) > 1
                                        or float(tolerances[0][3:]) > 10)))
        bad = [n for n in names if refused(n)]
        if bad:
            p.error(f"--configs: {bad[0]!r} is not 'local', 'local_balanced', 'torch_varlen' or a balancer name, "
                    f"optionally with one of '+pp', '+pp1', '+ppauto', '+ppmb' (even "
                    f"--micro-batches), and/or '+now', and/or (a balancer) "
                    f"'+blocking', '+own' (with it '+resN', N <= 64), '+dyn', '+ce', '+ctasN' (N <= 64), '+hgN' (N "
                    f"dividing --heads and --kv-heads), and/or (distca, "
                    f"prefix_aware) one '+tolT' with T in [0, 10], and/or (prefix_aware) '+time' (local_balanced: "
                    f"none)")
        if args.json_out and "{config}" not in args.json_out:
            p.error("--json-out must contain {config} with --configs (one JSON per configuration)")
    resolve_attention_timing(args)
    return args


def run_exiting_on_failure(name, train_function, args):
    """train_function(args); under torchrun a rank that fails leaves at once, skipping the interpreter's teardown.
    On 4 GPUs (2026-11-26) a rank out of memory stayed alive until every peer's 120 s timeout had passed, most
    likely in that teardown (destroying NCCL communicators whose peers are still inside a collective). Exiting now
    lets torchrun end the peers right away. Its traceback is on stderr."""
    try:
        train_function(args)
    except BaseException:
        if not launched_distributed():
            raise
        import traceback
        traceback.print_exc()
        sys.stderr.write(f"{name}: rank {os.environ.get('RANK', '?')} failed; exiting without teardown\n")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.exit(0)


def main():
    args = parse_args()
    if args.list_configs:  # what tests/multi_gpu/run.sh expects on disk: no second copy of the naming rules
        for name, (label, _) in zip((args.configs or "").split(","), configurations(args)):
            print(f"{name}\t{label}")
        return
    run_exiting_on_failure("train_llama", train, args)


if __name__ == "__main__":
    main()
