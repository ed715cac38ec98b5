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

Documents longer than a rank (--max-doc-len N, apart from --tokens-per-rank, --context's other name): the recipe's
documents scaled to N instead of to one rank, each micro-batch's laid over the ranks whole (cad.pack_documents):
every rank its pieces, positions continuous across a cut, labels across it, attention over each whole document
through a plan from pieces (cad.plan_pieces, per mask), a rank's loss its summed token losses over the step's
predicted tokens divided by the ranks (the same losses and gradients as one process over the same documents
unsplit); --memory-cap refuses a layout no plan fits before its step (cad.train.long_docs says how).

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
layer, bench/results/trainer_h200x2_2026-11-28_b8371a0). So on every rank the heavier half (causal attention work) runs first, its
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

--attention fa4: FlashAttention-4 as the local kernel (cad.fa4.varlen_attn on each rank's documents, no CAD), beside
local and torch_varlen. cad.fa4 is imported only then; where it cannot run (cad.fa4.available() says why, or the
package has no cad.fa4) the configuration is refused with that reason (cad.CadError), not skipped.

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
import contextlib
import gc
import json
import pathlib
import time

import torch

from .attention import AttentionClock, fa4_unavailable, torch_varlen_unavailable
from .batches import make_inputs, make_nanos
from .flops import attention_pairs, count_matmul_parameters, layer_windows, masks, model_flops
from . import long_docs
from .launch import all_gather_floats
from .llama_args import balancer_config
from .model import MicroBatchLoss, apply_checkpointing, build_model, grad_norm, wrap_data_parallel
from .nano import nano_batches, run_order
from .profiling import GcPauses, allocator_retries, other_gpus_with_context, profile_summary
from .recipe import balanced_documents, cached_batch


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


def summary_of(args, world, device):
    """What every configuration's summary says about its setup."""
    return {"attention": args.attention, "balancer": args.balancer if args.attention == "cad" else None,
            "ranks": world, "context": args.context, "micro_batches": args.micro_batches, "model": args.model,
            "layers": args.layers, "steps": args.steps, "hidden": args.hidden, "intermediate": args.intermediate,
            "heads": args.heads, "kv_heads": args.kv_heads, "vocab": args.vocab, "device": str(device),
            "dtype": args.dtype, "parallel": args.parallel if world > 1 else "none (one process)",
            "checkpointing": args.checkpointing, "checkpoint_reentrant": args.checkpoint_reentrant,
            "compile": args.compile, "ping_pong": args.ping_pong, "overlap": args.overlap,
            "ping_pong_lanes": args.ping_pong_lanes if args.ping_pong else None,
            "ping_pong_nanos": args.ping_pong_nanos if args.ping_pong else None,
            "balanced_batches": args.balanced_batches, "cad_comm_priority": args.cad_comm_priority,
            "cad_nccl_max_ctas": args.cad_nccl_max_ctas, "cad_nccl_blocking": args.cad_nccl_blocking,
            "cad_nccl_copy_engines": args.cad_nccl_copy_engines,
            "cad_own_tasks": args.cad_own_tasks, "cad_own_reserve_sms": args.cad_own_reserve_sms,
            "cad_forward_walk": args.cad_forward_walk, "cad_head_groups": args.cad_head_groups,
            "server_backend": args.server_backend,
            "balancer_tolerance": args.balancer_tolerance,
            "balancer_rate_table": args.balancer_rate_table if args.balance_time else None,
            "balancer_min_time_gain": args.balancer_min_time_gain if args.balance_time else None,
            "plan_ahead": args.plan_ahead, "gc": args.gc,
            "peak_tflops": args.peak_tflops,
            "loss_chunk": args.loss_chunk, "window": args.window, "global_every": args.global_every,
            "max_doc_len": args.max_doc_len, "memory_cap": args.memory_cap,
            "windowed_layers": sum(left >= 0 for left in layer_windows(args))}


def write_json(args, result):
    if args.json_out:
        path = pathlib.Path(args.json_out)
        path.parent.mkdir(parents=True, exist_ok=True)  # a fresh output folder is normal, not an error
        path.write_text(json.dumps(result, indent=1))


def train_one(args, rank, world, device, lengths, on_gradients=None):
    """One configuration: a fresh model (the same weights every time), optimizer and CAD stack; its steps; its
    summary and --json-out (rank 0). Returns {"summary", "steps"[, "profiled_step"]} on every rank.
    on_gradients(step, model): called on every rank once a step's gradients are complete (averaged over the ranks),
    before the optimizer uses them (the tests read every gradient there)."""
    import cad

    if args.attention == "torch_varlen" and torch_varlen_unavailable(device, args.window):
        reason = torch_varlen_unavailable(device, args.window)
        result = {"summary": dict(summary_of(args, world, device), skipped=reason), "steps": []}
        if rank == 0:
            print(f"configuration skipped: {reason}", flush=True)
            write_json(args, result)
        return result
    if args.attention == "fa4":  # refused, not skipped: FlashAttention-4 was asked for by name
        reason = fa4_unavailable(device)
        if reason is not None:
            raise cad.CadError(reason)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    cad.init(balancer=args.balancer, communicator=args.communicator, timeout_ms=args.timeout_ms,
             comm_stream_priority=args.cad_comm_priority, nccl_max_ctas=args.cad_nccl_max_ctas,
             nccl_blocking_comm=args.cad_nccl_blocking, nccl_copy_engines=args.cad_nccl_copy_engines,
             own_tasks_in_place=args.cad_own_tasks == "on",
             own_tasks_reserve_sms=args.cad_own_reserve_sms, forward_walk=args.cad_forward_walk,
             head_groups=args.cad_head_groups, server_backend=args.server_backend,
             balancer_config=balancer_config(args), memory_cap_bytes=args.memory_cap)
    long_docs.refuse_local(args, world, "train_llama")
    # --ping-pong-when worthwhile: unsplit until one measured step says whether splitting pays (cad.PingPongChoice).
    # The decision, made after step `decided_at` of the schedule, takes effect from the second step after it: the
    # next step's first micro-batch was asked for (its plans made ahead) while the step ran, undecided, i.e.
    # unsplit. Waiting for the decision before asking made that plan at the micro-batch's start instead, on the
    # critical path (18-34 ms in the step after the decision, 2 H200s at 64K: bench/results/trainer_h200x2_2026-11-28_b8371a0).
    choice = cad.PingPongChoice(args.ping_pong_min_stall_share) \
        if args.ping_pong and args.ping_pong_when == "worthwhile" else None
    decided_at = None  # the schedule index after which choice decided
    # --overlap auto: cad.OverlapChoice picks none, head groups or ping-pong after one measured unsplit step and
    # confirms or reverts it after the first step under it; a change takes effect at the next step (overlap_at).
    overlap = cad.OverlapChoice(heads=(args.heads, args.kv_heads)) \
        if args.overlap == "auto" and args.attention == "cad" else None
    overlap_at = {}  # schedule index -> the overlap mode from that step on

    def overlap_mode(index):
        changes = [i for i in overlap_at if i <= index]
        return overlap_at[max(changes)] if changes else "off"

    def splitting(index):
        """Whether step `index` of the schedule splits its micro-batches (the same on every rank)."""
        if overlap is not None:
            return overlap_mode(index) == "ping_pong"
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
        # FSDP2 (see wrap_data_parallel): the layers stay gathered between a split step's two nano-batch calls.
        if (choice is not None or overlap is not None) and hasattr(model, "set_reshard_after_forward"):
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
    if args.ping_pong or overlap is not None:  # each decoder layer takes both nano-batches in one call (the unit)
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
            if args.max_doc_len is not None:  # documents packed over the ranks whole (cad.train.long_docs)
                long = long_docs.long_step(lengths, args, world, step, mb)
                long_docs.check_memory(long, args, dtype)  # before the step: refused naming document, rank, bytes
                micro.append([long_docs.piece_lengths(long), None, long_docs.inputs_of(long, rank, device), None,
                              long])
                continue
            batch = cached_batch(lengths, args.context, world, args.seed + 1000 * step + mb)
            docs_by_rank = [docs or [args.context] for docs in batch]
            if args.balanced_batches:
                docs_by_rank = balanced_documents(docs_by_rank)
            inputs = make_inputs(docs_by_rank[rank], args.vocab, args.seed * 7919 + 31 * step + rank + 100003 * mb,
                                 device)
            micro.append([docs_by_rank, None, inputs, None, None])  # nano-batches and parts: ask(); not long
        return micro

    def ask(micro, index, mb):
        """Micro-batch mb's nano-batches (split or not: splitting(index)), parts and plans (collective with CAD, in
        the same order on every rank): with --plan-ahead on, queued on CAD's planning thread; otherwise made now."""
        if micro[mb][3] is None and micro[mb][4] is not None:  # pieces: one plan per mask from them
            micro[mb][1] = [[docs] for docs in micro[mb][0]]
            cu, plan = long_docs.piece_plans(micro[mb][4].layouts[rank].pieces, args.attention, args, device, dtype,
                                             tag=2 * (index * args.micro_batches + mb))
            micro[mb][3] = [(micro[mb][4].layouts[rank].tokens, cu, plan)]
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

    def apply_overlap(micro):
        """Before a step whose overlap changed: wait for the plans asked ahead for it (made on every rank, so no
        collective is left half made), drop them, rebuild the stacks with the chosen head groups (OverlapChoice.apply:
        the old plans are refused from now on), and let ask() make them again, split or not. One step pays for
        making its first plans at its start. Returns whether the stacks were rebuilt."""
        for entry in micro:
            for _, _, plan in entry[3] or []:
                for p in (plan if isinstance(plan, tuple) else (plan,)):
                    if p is not None:
                        p.wait()
            entry[3] = None
        return overlap.apply()
    loaded = {}  # schedule index -> its micro-batches, loaded while the step before it ran
    # CAD's exchanges on the GPU, cumulative (cad.exchange_times): the last step's end, for this step's share.
    exchanged = {} if device.type == "cuda" and args.attention == "cad" else None
    called = {} if exchanged is not None else None  # CAD's calls on the GPU (cad.call_times), the same way
    retries_before = allocator_retries(device)
    for index, (step, profiling) in enumerate(schedule):
        micro = loaded.pop(index, None) or load(step)
        if index in overlap_at:  # the overlap changes here: this step's plans (asked ahead) are made again
            if apply_overlap(micro) and exchanged is not None:  # new stacks count their exchanges and calls from 0
                exchanged, called = {}, {}
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
            if len(group) == 1 and micro[group[0]][4] is not None:
                inputs = micro[group[0]][2]  # pieces in the stream's order, one nano-batch
            elif len(group) == 1:
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
        if on_gradients is not None:
            on_gradients(step, model)
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
        mine = sum(sum(docs_by_rank[rank]) for docs_by_rank, *_ in micro)
        gathered = all_gather_floats([float(loss_sum), seconds, attention, float(mine), peak,
                                      stats["plan_ms"] if stats else 0.0, stats["make_ms"] if stats else 0.0,
                                      pre_plan_ms, gc_ms, float(gc_full), plan_wait_ms, comm_ms, stall_ms,
                                      float(alloc_retries)] + call_ms + attention_by_mb, world)
        costs = [sum(attention_pairs(args, docs_by_rank[r]) if long is None else
                     long_docs.piece_pairs(args, long.layouts[r].pieces) for docs_by_rank, _, _, _, long in micro)
                 for r in range(world)]
        colocated = max(costs) / (sum(costs) / len(costs))
        imbalance = stats["imbalance"] if stats else colocated
        slowest = max(g[1] for g in gathered)
        flops = model_flops(args, params, [docs_by_rank if long is None else [long.documents]
                                           for docs_by_rank, _, _, _, long in micro])
        split = len(groups) < len(micro) or all(len(nanos[rank]) == 2 for _, nanos, *_ in micro)
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
                  "ping_pong": split, "nano_tokens": [[[sum(d) for d in n] for n in nanos] for _, nanos, *_ in micro],
                  "profiled": profiling}
        if stats:
            record["nano_imbalance"] = stats["nano_imbalance"]
            record["plan_windows"] = plan_windows  # each plan's window left (-1: global), as nano_imbalance
            record["forward_bytes_sent_by_rank"] = stats["forward_bytes_sent_by_rank"]
        if profiling:
            profiled_record = record
        else:
            history.append(record)
        if overlap is not None and not overlap.final and index >= 1 and not profiling \
                and (overlap.mode is None or index >= max(overlap_at)):
            # The slowest rank's numbers (gathered above): the same decision on every rank.
            server = max(f + b for f, b in zip(record["call_forward_server_ms"], record["call_backward_server_ms"]))
            before = overlap.mode
            overlap.observe(slowest * 1e3, max(record["exchange_stall_ms"]), max(record["exchange_comm_ms"]),
                            server if called is not None else None)
            if overlap.mode != before and (before is not None or overlap.mode != "off"):
                overlap_at[index + 1] = overlap.mode
            if rank == 0:
                print(f"step {step}: {overlap.reason}", flush=True)
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
                   overlap_decision=overlap.record() if overlap is not None else None,
                   overlap_steps={schedule[i][0]: m for i, m in sorted(overlap_at.items())},
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
