#!/usr/bin/env python3
"""Train a transformers Llama model (random weights from a config, nothing downloaded) on packed Pretrain-recipe
batches, with attention on CAD or local, under torchrun (or as one process).

    torchrun --nproc-per-node 4 examples/train_llama.py --attention cad --balancer prefix_aware \
        --context 4096 --layers 2 --steps 10 --device cpu

Batches follow the DistCA recipe over ../shared/data/doclen_pretrain.json (the same generator as the C++
host_adapter/workload/batch_recipe.cpp, so a seed gives the batch `cad demo` uses): documents cut at 64K (long
chunks twice), 90% of the rest kept, shuffled, scaled by context/64K, packed into one buffer of --context tokens
per rank (a document cut by a buffer end continues as its own document on the next rank). Each rank's buffer is
one packed sequence (position_ids restart per document); gradients are averaged over the ranks (data parallel).
Per step: loss, tokens/s, every rank's attention time, the attention imbalance; then a summary.

--ping-pong splits every rank's buffer into two nano-batches at the document boundary nearest half its tokens
(whole documents only: a piece of a document cut across ranks is one document of its rank and stays whole in
its nano-batch). Each nano-batch has its own CAD plan (two per step, made at the step's start on every rank)
and the decoder layers run through cad.ping_pong, one stage per layer, so that on CUDA one nano-batch's
attention exchange overlaps the other's compute. The loss is the token-weighted mean over both nano-batches:
the same loss and gradients as without --ping-pong, up to rounding. A step in which some rank holds fewer than
2 documents cannot be split; that step runs as one nano-batch (one plan, layers in order), says so, and its
record has "ping_pong": false. Every rank knows every rank's documents, so all agree without communicating.
"""
import argparse
import gc
import json
import math
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

REPO = pathlib.Path(__file__).resolve().parent.parent
MASK64 = (1 << 64) - 1


# ---- the DistCA batch recipe (a port of host_adapter/workload/batch_recipe.cpp) ------------------------
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


def causal_cost(lengths):
    return sum(n * (n + 1) // 2 for n in lengths)


# ---- the model and one step ---------------------------------------------------------------------------
def build_model(args, device, dtype):
    import cad.hf
    from transformers import AutoModelForCausalLM, LlamaConfig

    cad.hf.register()
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=args.intermediate or args.hidden * 3, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=max(args.context, 2048),
                         attention_dropout=0.0)
    torch.manual_seed(args.seed)  # the same weights on every rank (every GPU's generator is seeded alike)
    implementation = "cad" if args.attention == "cad" else "cad_local"
    with device:  # initialised where it runs: a CPU init of billions of weights took most of a GPU run's start
        model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation, dtype=dtype)
    return model.to(device)


def make_inputs(doc_lengths, vocab, seed, device):
    total = sum(doc_lengths)
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (1, total), generator=g)
    position_ids = torch.cat([torch.arange(n) for n in doc_lengths]).unsqueeze(0)
    labels = input_ids.clone()
    starts = torch.tensor([0] + doc_lengths[:-1]).cumsum(0)
    labels[0, starts] = -100  # never predict a document's first token from the previous document
    return {k: t.to(device) for k, t in dict(input_ids=input_ids, position_ids=position_ids, labels=labels).items()}


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


def average_gradients(model, world, backend):
    """Average the gradients over the ranks; returns their L2 norm afterwards (a 0-d tensor, not yet read back
    so that a CUDA step is not synchronised here)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if world == 1:
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    flat = torch.cat([g.reshape(-1) for g in grads])
    on_host = backend == "gloo" and flat.is_cuda
    buffer = flat.cpu() if on_host else flat
    dist.all_reduce(buffer)
    buffer /= world
    if on_host:
        flat.copy_(buffer)
    at = 0
    for g in grads:
        g.copy_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()
    return torch.linalg.vector_norm(flat.float())


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
    """Per rank, its nano-batches (lists of document lengths): two with ping-pong where every rank can be split,
    else one (the whole buffer). Every rank computes this from the same batch, so all agree."""
    cuts = [split_point(docs) for docs in docs_by_rank] if ping_pong else [None]
    if None in cuts:
        return [[docs] for docs in docs_by_rank]
    return [[docs[:k], docs[k:]] for docs, k in zip(docs_by_rank, cuts)]


def nano_forward(model, inputs, nanos, attention, dtype):
    """The loss of this rank's micro-batch run as its nano-batches (one or two), and their plans.

    Each nano-batch is embedded on its own, the decoder layers run through cad.ping_pong (two nano-batches) or
    in order (one), and each nano-batch's summed token losses are divided by the micro-batch's count of
    predicted tokens: their sum is the token-weighted mean, what model(**inputs).loss computes in one piece.
    A nano-batch's last token predicts nothing, as a document's last token does (its next label is the next
    document's first token, which is -100)."""
    import cad
    inner, config = model.model, model.config
    device = inputs["input_ids"].device
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cus = [torch.tensor([0] + docs, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device) for docs in nanos]
    # Collective: every rank makes nano-batch 0's plan, then nano-batch 1's, before enqueueing any compute (a
    # plan reads its cu_seqlens back to the host once; layers pass the same tensor, so nothing else is read).
    plans = [cad.plan(cu, num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
                      head_dim=head_dim, dtype=dtype, device=device) if attention == "cad" else None for cu in cus]
    states, extras, labels, at = [], [], [], 0
    for docs, cu, plan in zip(nanos, cus, plans):
        tokens = slice(at, at + sum(docs))
        at += sum(docs)
        positions = inputs["position_ids"][:, tokens]
        hidden = inner.embed_tokens(inputs["input_ids"][:, tokens])
        states.append(hidden)
        extras.append(dict(position_ids=positions, position_embeddings=inner.rotary_emb(hidden, positions),
                           cad_cu_seqlens=cu, cad_plan=plan))
        labels.append(inputs["labels"][:, tokens])

    def stage(layer):
        def run(hidden, i):
            out = layer(hidden, attention_mask=None, **extras[i])
            return out[0] if isinstance(out, tuple) else out  # transformers < 4.54 returns a tuple
        return run

    stages = [stage(layer) for layer in inner.layers[:config.num_hidden_layers]]
    if len(states) == 2:
        states = cad.ping_pong(stages, states)
    else:
        for run in stages:
            states[0] = run(states[0], 0)
    predicted = sum((y[:, 1:] != -100).sum() for y in labels)  # a tensor: reading it back would sync CUDA
    loss = 0
    for hidden, y in zip(states, labels):
        logits = model.lm_head(inner.norm(hidden)).float()
        targets = torch.nn.functional.pad(y, (0, 1), value=-100)[:, 1:]  # token t predicts token t + 1
        loss = loss + torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                        ignore_index=-100, reduction="sum") / predicted
    return loss, plans


def plan_summary(plans):
    """The step's plans together: imbalance and forward bytes sent per rank, and each plan's own imbalance.
    One plan: the plugin's imbalance. Two: max/mean over servers of both plans' forward FLOPs added up (a
    server runs both nano-batches' work in the step)."""
    stats = [p.stats for p in plans if p is not None and p.stats]
    if not stats:
        return None
    imbalance = stats[0]["imbalance"]
    if len(stats) > 1:
        flops = [sum(s["servers"][i]["forward_flops"] for s in stats) for i in range(len(stats[0]["servers"]))]
        imbalance = max(flops) / (sum(flops) / len(flops)) if sum(flops) else 1.0
    sent = [sum(col) for col in zip(*(s["model_forward_bytes_sent_by_rank"] for s in stats))]
    return {"imbalance": imbalance, "nano_imbalance": [s["imbalance"] for s in stats],
            "forward_bytes_sent_by_rank": sent, "plan_ms": sum(s.get("plan_ms", 0.0) for s in stats),
            "make_ms": sum(s.get("make_ms") or 0.0 for s in stats)}


# ---- --profile-step: where one step's GPU time goes, by kernel family ----------------------------------
KERNEL_FAMILIES = (  # first match wins; names as the CUDA profiler reports them
    ("attention", ("attention_fwd", "attention_bwd", "bwd_preprocess", "fwd_combine", "flash", "fmha", "cudnn")),
    ("cad data path", ("copy_row_ranges", "copy_strided_rows", "sum_rows", "sum_partials", "fill_uncovered",
                       "f32_to_bf16")),
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


def configurations(args):
    """What to train, as (name, args): the one configuration of --attention/--balancer/--ping-pong, or each of
    --configs with --json-out's {config} filled in by its name."""
    if not args.configs:
        return [(None, args)]
    runs = []
    for name in args.configs.split(","):
        run = argparse.Namespace(**vars(args))
        balancer, _, mode = name.partition("+")
        run.attention = "local" if balancer == "local" else "cad"
        run.balancer = args.balancer if balancer == "local" else balancer
        run.ping_pong = mode == "pp"
        label = balancer + ("_pingpong" if run.ping_pong else "")
        run.json_out = args.json_out.replace("{config}", label) if args.json_out else None
        runs.append((label, run))
    return runs


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
    # NCCL for the gradients only where CAD uses NCCL too (one process per GPU); processes sharing a GPU
    # (communicator host or mpi) average their gradients over gloo.
    backend = "nccl" if args.device == "cuda" and args.communicator in (None, "nccl") else "gloo"
    if distributed:
        dist.init_process_group(backend)
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
        train_one(run, rank, world, device, backend, lengths)
        if device.type == "cuda":  # the next configuration starts from the same empty allocator
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    cad.shutdown()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


def train_one(args, rank, world, device, backend, lengths):
    """One configuration: a fresh model (the same weights every time), optimizer and CAD stack; its steps; its
    summary and --json-out."""
    import cad
    import cad.hf

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    cad.init(balancer=args.balancer, communicator=args.communicator, timeout_ms=args.timeout_ms)
    # Attention times wait for the GPU around every call, except with ping-pong on CUDA, where waiting would
    # serialise the two nano-batches' streams: there they count only the enqueue (recorded in the summary).
    synced_timing = not (args.ping_pong and device.type == "cuda")
    cad.timing(sync_cuda=synced_timing)
    model = build_model(args, device, dtype)
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
    for step, profiling in schedule:
        batch = sample_batch(lengths, args.context, world, args.seed + 1000 * step)
        docs_by_rank = [docs or [args.context] for docs in batch]
        mine = docs_by_rank[rank]
        nanos = nano_batches(docs_by_rank, args.ping_pong)
        split = len(nanos[rank]) == 2
        if args.ping_pong and not split and rank == 0:
            print(f"step {step}: ping-pong off for this step: rank(s) "
                  f"{[r for r, d in enumerate(docs_by_rank) if len(d) < 2]} hold one document, which cannot be "
                  f"split into two nano-batches; the step runs as one nano-batch", flush=True)
        inputs = make_inputs(mine, args.vocab, args.seed * 7919 + 31 * step + rank, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
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
        if args.ping_pong or args.plan_first:  # the step's plan(s) made before any layer runs
            loss, plans = nano_forward(model, inputs, nanos[rank], args.attention, dtype)
        else:
            loss = model(**inputs).loss
            plans = [cad.hf.current_plan()] if args.attention == "cad" else []
        loss.backward()
        grad_norm = average_gradients(model, world, backend)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        attention = cad.attention_time(reset=True)
        if profiler is not None:
            profiler.__exit__(None, None, None)
            profile = profile_summary(profiler)
            profile.update(rank=rank, step=step, step_s=seconds, note="timed with the profiler on: slower than the "
                           "other steps; compare families and kernels, not this step's time")
            if args.json_out:
                out = pathlib.Path(args.json_out)
                out.with_name(f"{out.stem}_profile_rank{rank}.json").write_text(json.dumps(profile, indent=1))
            if rank == 0:
                print("profile of step %d on rank 0 (kernel ms by family): %s" % (
                    step, json.dumps({k: round(v, 1) for k, v in profile["families_ms"].items()})), flush=True)
        gc_ms, gc_full = pauses.take()
        # Host time from the step's start to its first plan make (which waits for every rank): a rank that
        # arrives late shows here.
        starts = [p.make_started_at for p in plans if p is not None and p.make_started_at is not None]
        pre_plan_ms = (min(starts) - start) * 1e3 if starts else 0.0
        stats = plan_summary(plans)
        # The step's plans go back now: kept until the next step's were made, they doubled the plans' device
        # memory (server-batch scratch and wire buffers) at every step's start.
        for p in plans:
            if p is not None:
                p.release()
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
        plan_ms = stats["plan_ms"] if stats else 0.0
        make_ms = stats["make_ms"] if stats else 0.0
        gathered = all_gather_floats([loss.item(), seconds, attention, float(sum(mine)), peak, plan_ms, make_ms,
                                      pre_plan_ms, gc_ms, float(gc_full)], world)
        costs = [causal_cost(b) for b in docs_by_rank]
        colocated = max(costs) / (sum(costs) / len(costs))
        imbalance = stats["imbalance"] if stats else colocated
        record = {"step": step, "loss": sum(g[0] for g in gathered) / world,
                  "losses": [g[0] for g in gathered], "grad_norm": grad_norm.item(),
                  "tokens_per_s": sum(g[3] for g in gathered) / max(g[1] for g in gathered),
                  "step_s": [g[1] for g in gathered],
                  "peak_memory_gib": [g[4] for g in gathered], "plan_ms": [g[5] for g in gathered],
                  "plan_make_ms": [g[6] for g in gathered], "pre_plan_ms": [g[7] for g in gathered],
                  "gc_ms": [g[8] for g in gathered], "gc_full_collections": [int(g[9]) for g in gathered],
                  "attention_s": [g[2] for g in gathered], "imbalance": imbalance, "colocated_imbalance": colocated,
                  "ping_pong": split, "nano_tokens": [[sum(d) for d in n] for n in nanos],
                  "profiled": profiling}
        if stats:
            record["nano_imbalance"] = stats["nano_imbalance"]
            record["forward_bytes_sent_by_rank"] = stats["forward_bytes_sent_by_rank"]
        if profiling:
            profiled_record = record
        else:
            history.append(record)
        if rank == 0:
            mode = ("  ping-pong" if split else "") + ("  (profiled again)" if profiling else "")
            print(f"step {step:3d}  loss {record['loss']:.5f}  {record['tokens_per_s']:9.0f} tok/s  attention s/rank "
                  f"[{', '.join(f'{a:.3f}' for a in record['attention_s'])}]  imbalance {imbalance:.3f} "
                  f"(colocated {colocated:.3f}){mode}", flush=True)
    if rank == 0:
        tail = history[1:] or history  # step 0 warms up
        summary = {"attention": args.attention, "balancer": args.balancer if args.attention == "cad" else None,
                   "ranks": world, "context": args.context, "layers": args.layers, "steps": args.steps,
                   "hidden": args.hidden, "intermediate": args.intermediate or args.hidden * 3,
                   "device": str(device), "dtype": args.dtype, "ping_pong": args.ping_pong,
                   "ping_pong_steps": sum(r["ping_pong"] for r in history),
                   "attention_timing": "synchronized" if synced_timing else "enqueue only (ping-pong on CUDA)",
                   "first_loss": history[0]["loss"], "last_loss": history[-1]["loss"],
                   "mean_tokens_per_s_after_step0": sum(r["tokens_per_s"] for r in tail) / len(tail),
                   "mean_step_s_after_step0": sum(max(r["step_s"]) for r in tail) / len(tail),
                   "mean_max_attention_s": sum(max(r["attention_s"]) for r in tail) / len(tail),
                   "mean_imbalance": sum(r["imbalance"] for r in tail) / len(tail), "gc": args.gc,
                   "plan_first": args.plan_first or args.ping_pong}
        print("summary " + json.dumps(summary), flush=True)
        if args.json_out:
            result = {"summary": summary, "steps": history}
            if profiled_record is not None:
                result["profiled_step"] = profiled_record
            pathlib.Path(args.json_out).write_text(json.dumps(result, indent=1))
    pauses.close()
    if args.gc == "freeze":
        gc.unfreeze()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attention", choices=["local", "cad"], default="cad")
    p.add_argument("--balancer", default="prefix_aware", help="colocated, per_doc_cp, distca, prefix_aware")
    p.add_argument("--communicator", default=None, help="host, mpi or nccl (default: host on CPU, nccl on CUDA)")
    p.add_argument("--context", type=int, default=2048, help="tokens per rank and step")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=0,
                   help="MLP width (Llama's intermediate_size; Llama-3 8B: 14336); default 3 x --hidden")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="default: fp32 on CPU, bf16 on CUDA")
    p.add_argument("--timeout-ms", type=int, default=120000)
    p.add_argument("--data", default=os.environ.get("CAD_DATA", str(REPO.parent / "shared" / "data" /
                                                                    "doclen_pretrain.json")))
    p.add_argument("--ping-pong", action="store_true",
                   help="split every rank's buffer into two nano-batches at the document boundary nearest half "
                        "its tokens (whole documents; a document cut across ranks counts as one document of "
                        "each rank and stays whole in its nano-batch), one plan each, decoder layers through "
                        "cad.ping_pong; same loss and gradients as without. A step where a rank holds one "
                        "document runs unsplit, with a note (its record says \"ping_pong\": false)")
    p.add_argument("--json-out", default=None, help="write every step's record and the summary here (rank 0); "
                   "with --configs it must contain {config}, replaced by each configuration's name")
    p.add_argument("--configs", default=None,
                   help="train several configurations one after another in this process (one start-up): a comma "
                        "list of 'local' (local attention) or a balancer name (CAD), each optionally with '+pp' "
                        "(--ping-pong), e.g. local,prefix_aware,distca+pp. Each starts from the same "
                        "weights; its JSON is --json-out with {config} = local or the balancer, "
                        "+ '_pingpong' with ping-pong. Overrides --attention, --balancer, --ping-pong")
    p.add_argument("--plan-first", action="store_true",
                   help="make the step's CAD plan before the embedding (as --ping-pong does for its two plans) "
                        "instead of at the first layer's attention call; the same losses. For comparing where "
                        "ranks wait for each other at the plan's collectives")
    p.add_argument("--gc", choices=["auto", "freeze"], default="auto",
                   help="Python's garbage collector: auto (as is), or freeze: gc.freeze() once the model and "
                        "optimizer exist, so that collections no longer scan them (every step records its "
                        "collector pauses per rank: gc_ms, gc_full_collections)")
    p.add_argument("--profile-step", type=int, default=-1,
                   help="after the timed steps, run this step's batch once more under torch.profiler and write, "
                        "per rank, its GPU kernel time by family (attention, cad data path, nccl, gemm, other) and "
                        "its top kernels to <json-out stem>_profile_rank<R>.json; its record is the JSON's "
                        "\"profiled_step\", outside \"steps\" (default -1: no profiling)")
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "bf16" if args.device == "cuda" else "fp32"
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must divide by --heads, and --heads by --kv-heads")
    if args.intermediate < 0:
        p.error(f"--intermediate must be positive (or 0 for 3 x --hidden), got {args.intermediate}")
    if args.profile_step >= args.steps:
        p.error(f"--profile-step must name one of the {args.steps} steps (0..{args.steps - 1}), got {args.profile_step}")
    if args.configs is not None:
        names = args.configs.split(",")
        bad = [n for n in names if not n.partition("+")[0] or n.partition("+")[2] not in ("", "pp")]
        if bad:
            p.error(f"--configs: {bad[0]!r} is not 'local' or a balancer name, optionally with '+pp'")
        if args.json_out and "{config}" not in args.json_out:
            p.error("--json-out must contain {config} with --configs (one JSON per configuration)")
    return args


def main():
    args = parse_args()
    try:
        train(args)
    except BaseException:
        if not launched_distributed():
            raise
        # A failed rank leaves at once, skipping the interpreter's teardown. On 4 GPUs (2026-11-26) a rank out
        # of memory stayed alive until every peer's 120 s timeout had passed, most likely in that teardown
        # (destroying NCCL communicators whose peers are still inside a collective). Exiting now lets torchrun
        # end the peers right away.
        import traceback
        traceback.print_exc()
        sys.stderr.write(f"train_llama: rank {os.environ.get('RANK', '?')} failed; exiting without teardown\n")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
