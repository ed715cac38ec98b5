"""Train a transformers Llama model pipeline parallel (GPipe or 1F1B) x data parallel, with core attention through
CAD balanced per pipeline tick across every rank, or local.

    torchrun --nproc-per-node 4 examples/train_pipeline.py --pp 2 --attention cad --pool tick \
        --context 1024 --layers 4 --micro-batches 4 --steps 3 --device cpu
    torchrun --nproc-per-node 2 examples/train_pipeline.py --device cuda --pp 2 --model llama3-8b --layers 4 \
        --context 32768 --micro-batches 4 --configs local,local_balanced,torch_varlen,cad_tick,cad_bubble,cad_stage \
        --json-out 'out_{config}.json'

Layout: world = PP x DP ranks, rank = stage * DP + replica (stage-major: the ranks of one stage are neighbours,
[s * DP, (s + 1) * DP)). Stage s holds the decoder layers [s * L / PP, (s + 1) * L / PP) (L must divide by PP);
stage 0 also the embeddings, the last stage the final norm, the head and the loss. Every rank builds the whole
model from the same seed (so every configuration and the non-pipelined model start from the same weights) and
drops what its stage does not run. Activations go from stage s to s + 1 of the same replica, gradients back,
with torch.distributed send/recv (gloo on CPU, NCCL on CUDA) on a group whose timeout is --timeout-ms. After the
step's backward every stage all-reduces (averages) its gradients within its data-parallel group (the DP ranks of
that stage), then AdamW.

Batches: train_llama.py's recipe. Micro-batch m of step k is the recipe batch with seed --seed + 1000 k + m over
DP buffers of --context tokens, replica r taking buffer r, with train_llama's token seeds (replica r as rank r):
so a step here trains exactly what train_llama.py trains on DP ranks with --micro-batches M. The loss is the
same: per micro-batch the token-weighted mean over its predicted tokens, the step's loss their mean over the
micro-batches (each backward scaled by 1 / M), gradients averaged over the replicas.

Schedule: GPipe, hand-written. With M micro-batches and S stages a step has T = M + S - 1 forward ticks, then T
backward ticks. At forward tick t stage s runs the forward of micro-batch t - s (if 0 <= t - s < M), else it is
idle (the fill and drain bubbles). Backward tick b mirrors forward tick T - 1 - b: stage s runs the backward of
micro-batch T - 1 - b - s (the last micro-batch first, as GPipe does). So a backward tick's calls on all stages
belong to the same micro-batches as one forward tick's, which is what lets CAD reuse that tick's plan (below).
In GPipe every call of a tick on every stage goes the same direction (forwards with forwards; backwards, with
their checkpoint recomputation, with backwards), so one collective CAD call pairs stage s's j-th layer with stage
s''s j-th layer of that tick.

--schedule 1f1b: PipeDream-flush's 1F1B in lockstep ticks (one_f_one_b): stage s runs min(S - s - 1, M) warm-up
forwards, then one forward and one backward in turn, then the rest of its backwards, each at the first tick after
what it needs; at most S - s micro-batches in flight on stage s (GPipe: M), the same 2 (M + S - 1) ticks. At one
tick some stages run forwards while others run backwards, so no single plan or call direction serves the tick.
With CAD over the world each (micro-batch, stage) has a plan of its own over every rank, with documents only from
that stage's ranks (tag (step x M + m) x S + s), asked for ahead in the timetable's order (the plans of the
forwards of tick t + 1 during tick t) and used by that stage's forward and backward of the micro-batch. Around
each tick, cad.CallOrder lists one layer's calls in stage order -- a forward's call, or a backward's (after its
recomputed forward under --checkpointing full) -- and makes, around this rank's own calls, the other stages'
calls over zero tokens of its own: every plan is balanced over every rank, so every tick is. A tick's outputs
(activations forward, gradients backward) travel at its end as one batch of sends and receives
(dist.batch_isend_irecv): in 1F1B a stage sends both ways at the same ticks. With local attention or --pool
stage the stages run the same timetable without calls in common.

Attention (--attention, or --configs): local (the project's kernels, no CAD: "cad_local"), torch_varlen
(torch.nn.attention.varlen.varlen_attn, CUDA only; skipped with a note on the CPU) or cad, with --pool:
  tick   one CAD group over ALL ranks (cad.init(group=world)); one plan per forward tick on every rank, over the
         documents of the micro-batch that rank runs at that tick (none when idle): the balancer spreads the
         attention of the tick's micro-batches over every rank of every stage, idle ones included. Backward
         tick b reuses forward tick T - 1 - b's plans (the same micro-batches on the same ranks).
  stage  CAD only within each stage's data-parallel group (cad.init(group=that group)): one plan per micro-batch
         over its DP replicas. This is the data-parallel-only path; it cannot move work between stages, and with
         DP = 1 it balances nothing (the trainer says so).
  bubble GPipe: CAD over ALL ranks as tick, but only in the forward ticks where
         some stage is idle (the fill ticks t < PP - 1 and the drain ticks t >= M) and their mirrored backward
         ticks; every other tick runs local attention ("cad_local", the local configuration's kernel), no plan and
         no CAD call. Why: in GPipe the stages are coupled only by their send/recv, so the imbalance between the
         micro-batches of a steady tick costs nothing measurable (local_balanced, every micro-batch equal in
         attention work, measured no faster than local), while pooling a steady tick couples the stages at every
         attention call; a bubble tick's idle stage is free capacity, which CAD gives half the busy stage's work.
         The stage model's attention implementation is switched per tick (attention_for_tick).
         1F1B (1f1b_cad_bubble; needs --checkpointing full): CAD over ALL ranks only in the ticks with an idle stage,
         each operation there (a forward or a backward of (micro-batch, stage)) with a plan of its own over every
         rank (documents from that stage's ranks), made through cad.CallOrder with the idle rank serving; local
         attention in the other ticks. A micro-batch's forward and backward may fall in different kinds of tick;
         the backward recomputes its forward in its own tick, with that tick's kind and plan
         (Stage.tick_attention), so the first forward's kind does not matter.
Plans are made ahead from the schedule (the tick -> micro-batch map is known before the step): the plan of forward
tick t + 1 is asked for (cad.plan(..., ahead=True, tag=<unique per tick>)) when tick t starts, the next step's
first during this step's last backward tick, and CAD's planning thread makes them meanwhile. --plan-ahead off
makes each at its tick's start instead (collective, on the training thread).

Idle ticks under --pool tick (and bubble): CAD's calls are collective over every rank, so an idle stage still takes
part in every call of the tick, in the same order as the others: per local decoder layer one attention forward (and,
at the mirrored backward tick, its backward, after its recomputation with --checkpointing full) over 0 tokens,
with the tick's plan over no documents. transformers' Llama decoder layer does not take 0 tokens (its
attention reshapes [1, 0, -1, D], which PyTorch refuses), so an idle stage calls cad.varlen_attn directly on
empty [0, heads, head_dim] tensors, chained layer to layer (and checkpointed like the layers), so that the
calls come in the layers' order. With local attention, or --pool stage (the replicas of a stage are idle
together), an idle tick does nothing.

Failures: every wait has a deadline -- send/recv the pipeline group's timeout, CAD its timeout_ms, plans made ahead
their wait limit, and on CUDA the wait for the tick's GPU work at its end (all from --timeout-ms; NCCL's own
watchdog, which would end the process without naming the tick, gets twice that). A tick that fails or stalls ends
every rank with an error naming the rank, its stage and replica, the tick and its micro-batch (or "idle"); under
torchrun a failed rank exits at once (train_llama's rule). --test-fault RANK:PHASE:TICK:KIND makes one rank fail
(raise) or stall (sleep 3 x --timeout-ms) at the start of a tick, for the tests (under 1F1B TICK counts every tick
of the step and PHASE is the rank's own operation there, an idle tick counting as forward).

Measurements (rank 0 prints one line per step, --json-out keeps every record): the step time (slowest rank); per
tick and rank the attention time (every attention call, forward and backward: local's and CAD's through
cad.varlen_attn, torch_varlen's; CUDA synchronised around each call unless --sync-attention-timing off) and the tick
time (CUDA synchronised at every tick's end); the tick's imbalance: max / mean over the ranks (every stage and
replica, idle ones included: under --pool tick they serve attention) of the attention time in that tick; the ideal
step: the step with every tick's attention at its mean instead of its max, ideal_step = step - sum over ticks of
(max - mean); tokens/s, MFU (train_llama's model FLOPs), peak memory; per tick the cost model's imbalance of the
rank's own documents (colocated) and, with CAD, of the plans' server FLOPs (planned); plan makes, plan waits and
when each tick's plan was asked for and made. --configs runs several configurations one after another in this
process (same weights, same batches) and ends with a table: step time, tokens/s, speedup over local, the ideal
speedup (local step / local ideal step) and the realised share (speedup - 1) / (ideal - 1), mean tick imbalance
measured and planned.
"""
import contextlib
import json
import pathlib
import time

import torch
import torch.distributed as dist

from . import long_docs
from .attention import IMPLEMENTATIONS, AttentionClock, torch_varlen_unavailable
from .batches import make_inputs, make_nanos
from .pipeline_report import ATTENTION_WORK, base_makes, planned_share, step_record, summarise, tick_record
from .pipeline_stage import Groups, PipelineError, Stage, average_gradients, gather_floats, idle_attention, \
    maybe_fault, micro_batch_documents, token_seed, wait_for_device
from .schedule import Layout, bubble_1f1b_tag, bubble_tick, forward_micro_batch, mirrored_tick, one_f_one_b, \
    one_f_one_b_bubble_tick, ticks


def summary_of(args, layout, device):
    return {"attention": args.attention, "pool": args.pool if args.attention == "cad" else None,
            "balancer": args.balancer if args.attention == "cad" else None, "pp": args.pp, "dp": layout.dp,
            "ranks": layout.world, "rank_layout": "rank = stage * dp + replica", "schedule": args.schedule,
            "balanced_batches": args.balanced_batches,
            "context": args.context, "micro_batches": args.micro_batches,
            "ticks_per_step": len(one_f_one_b(args.micro_batches, args.pp)) if args.schedule == "1f1b" else
            2 * ticks(args.micro_batches, args.pp), "model": args.model, "layers": args.layers,
            "layers_per_stage": args.layers // args.pp, "hidden": args.hidden, "intermediate": args.intermediate,
            "heads": args.heads, "kv_heads": args.kv_heads, "vocab": args.vocab, "steps": args.steps,
            "device": str(device), "dtype": args.dtype, "checkpointing": args.checkpointing,
            "plan_ahead": args.plan_ahead, "keep_forward_tensors": args.keep_forward_tensors,
            "sync_attention_timing": args.sync_attention_timing, "peak_tflops": args.peak_tflops,
            "max_doc_len": args.max_doc_len, "memory_cap": args.memory_cap}


def write_json(path, result):
    if path:
        pathlib.Path(path).write_text(json.dumps(result, indent=1))


def train_one(args, rank, world, device, lengths, capture_grads=False):
    """One configuration: a fresh model (the same weights every time), optimizer and CAD stack, its steps, its
    summary and --json-out (rank 0). Returns {"summary", "steps"} on every rank; with capture_grads also
    "grads": per step {parameter name: gradient after the data-parallel average} of this rank's stage."""
    import cad

    layout = Layout(rank, world, args.pp)
    if args.attention == "torch_varlen" and torch_varlen_unavailable(device):
        reason = torch_varlen_unavailable(device)
        result = {"summary": dict(summary_of(args, layout, device), skipped=reason), "steps": []}
        if rank == 0:
            print(f"configuration skipped: {reason}", flush=True)
            write_json(args.json_out, result)
        return result
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    groups = Groups(layout, args.backend, args.timeout_ms) if world > 1 else None
    if groups is not None and args.schedule == "1f1b":
        # 1F1B's batched sends and receives: over NCCL, the first call on a communicator must include every rank
        # of its group, and at tick 0 only the first two stages exchange.
        dist.barrier(group=groups.pipe)
    use_cad = args.attention == "cad"
    if use_cad:
        # One CAD stack per process, spanning the world (tick, bubble) or this stage's replicas (stage).
        group = None if args.pool in ("tick", "bubble") or world == 1 else groups.mine
        keep = {"auto": "auto", "on": True, "off": False}[args.keep_forward_tensors]
        cad.init(balancer=args.balancer, communicator=args.communicator, timeout_ms=args.timeout_ms, group=group,
                 keep_forward_tensors=keep, memory_cap_bytes=args.memory_cap)
        if args.pool == "stage" and layout.dp == 1 and rank == 0:
            print("note: --pool stage with DP = 1: every CAD group is one rank, so CAD balances nothing here (the "
                  "data-parallel-only path cannot move attention between stages; --pool tick can)", flush=True)
        if args.pool == "bubble" and layout.dp > 1 and rank == 0:
            print(f"note: --pool bubble with DP = {layout.dp}: the steady ticks run local attention, so the imbalance "
                  f"between a stage's replicas there stays (cad simulate --pool bubble predicts --pool tick or stage "
                  f"ahead wherever DP > 1; docs/simulate.md)", flush=True)
    synced = args.sync_attention_timing == "on"
    cad.timing(sync_cuda=synced)
    AttentionClock.sync = synced
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    long_docs.refuse_local(args, layout.dp, "train_pipeline")
    stage = Stage(args, layout, device, dtype)
    parameters = stage.parameters()
    optimizer = torch.optim.AdamW(parameters, lr=args.lr)
    M, S = args.micro_batches, args.pp
    T = ticks(M, S)
    head_dim = args.hidden // args.heads
    ahead = args.plan_ahead == "on"
    history, captured = [], []
    loaded = {}    # step -> (documents per micro-batch and replica, this replica's inputs per micro-batch)
    asked = {}     # (step, forward tick) -> (cad.Plan or None, cu_seqlens, time asked)

    pieces = {}    # --max-doc-len: (step, micro-batch) -> this replica's pieces, document ids unique per micro-batch
    documents = {}  # --max-doc-len: step -> per micro-batch [the documents as packed] (the model FLOPs count them)

    def load(step):
        if step not in loaded and args.max_doc_len is not None:  # over the stage's replicas whole (long_docs)
            longs = [long_docs.long_step(lengths, args, layout.dp, step, m) for m in range(M)]
            for long in longs:
                long_docs.check_memory(long, args, dtype)  # before the step: refused naming document, rank, bytes
            for m, long in enumerate(longs):
                # A tick's plan over every rank holds several micro-batches' pieces: ids are made unique by m.
                pieces[(step, m)] = tuple((m << 32 | d, n, o, k) for d, n, o, k in long.layouts[layout.replica].pieces)
            documents[step] = [[long.documents] for long in longs]
            loaded[step] = ([long_docs.piece_lengths(long) for long in longs],
                            [long_docs.inputs_of(long, layout.replica, device) for long in longs])
        if step not in loaded:
            docs = micro_batch_documents(lengths, args, layout.dp, step)
            inputs = [make_inputs(docs[m][layout.replica], args.vocab, token_seed(args, step, layout.replica, m),
                                       device) for m in range(M)]
            loaded[step] = (docs, inputs)
        return loaded[step]

    def tick_documents(step, tick):
        m = forward_micro_batch(layout.stage, tick, M)
        return m, ([] if m is None else load(step)[0][m][layout.replica])

    def pieces_of(step, m):
        """--max-doc-len: the pieces this rank runs micro-batch m of `step` with (none: idle); otherwise None."""
        if args.max_doc_len is None:
            return None
        return () if m is None else pieces[(step, m)]

    def request(docs, tag, attention=None, pieces=None):
        """(plan or None, cu_seqlens, time asked) for attention over `docs` with `attention` (default
        --attention's; "local" for --pool bubble's steady ticks): local attention, train_llama's cu_seqlens on
        the device (and torch_varlen's longest document), `tag` unused; CAD, a plan over cu_seqlens on the host
        (the plan reads it there, no GPU read-back, and so does every layer's call), tagged `tag` (unique per plan
        of the CAD group, the same on every rank of it), made ahead on CAD's planning thread (--plan-ahead on)
        or now."""
        attention = attention or args.attention
        if pieces is not None:  # a plan from pieces (CAD), or the pieces' boundaries (local, one replica)
            cu, plan = long_docs.piece_plans(pieces, attention, args, device, dtype, tag=tag)
            return plan, cu, time.perf_counter()
        if attention != "cad":
            (_, cu, _), = make_nanos([docs], attention, args, device, dtype)
            return None, cu, time.perf_counter()
        cu = torch.tensor([0] + docs, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        plan = cad.plan(cu, num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=head_dim, dtype=dtype,
                        device=device, ahead=ahead, tag=tag if ahead else None)
        return plan, cu, time.perf_counter()

    def pooled_tick(tick):
        """Whether GPipe forward tick `tick` (and the backward tick mirroring it) runs CAD over every rank: every
        tick under --pool tick, only the bubble ticks (some stage idle) under --pool bubble."""
        return use_cad and (args.pool == "tick" or (args.pool == "bubble" and bubble_tick(tick, M, S)))

    @contextlib.contextmanager
    def attention_for_tick(pooled_now):
        """The stage model's attention implementation during a tick: under --pool bubble "cad" in a pooled tick
        (pooled_now: GPipe, a bubble tick or the backward tick mirroring one; 1F1B, a tick with an idle stage),
        "cad_local" (the local configuration's kernel) in a steady one; other pools keep the model's own.
        transformers' attention modules look the implementation up in the model's config at every call
        (LlamaAttention.forward reads config._attn_implementation; every layer shares the model's config object),
        so setting it here switches every layer of the stage. With --checkpointing full a backward's
        recomputation calls the layers' forward again, which looks the implementation up then: so in GPipe the
        backward tick must set what its forward tick set (a steady tick recomputed under "cad" would have
        cu_seqlens but no plan, and raise); in 1F1B the backward tick's own kind decides, with its own plan
        (Stage.tick_attention). Restored after the tick."""
        if not (use_cad and args.pool == "bubble"):
            yield
            return
        config = stage.lm.config
        config._attn_implementation = IMPLEMENTATIONS["cad" if pooled_now else "local"]
        try:
            yield
        finally:
            config._attn_implementation = IMPLEMENTATIONS["cad"]

    def ask(step, tick):
        """The plan (and cu_seqlens) this rank runs forward tick `tick` of `step` with, asked for once: with CAD
        over the world one per pooled tick (over no documents when idle), with CAD per stage one per active tick;
        made ahead on CAD's planning thread (--plan-ahead on) or now. Local attention (and --pool bubble's steady
        ticks): cu_seqlens on the device."""
        key = (step, tick)
        if key in asked or tick >= T or step >= args.steps:
            return
        m, docs = tick_documents(step, tick)
        if use_cad and args.pool == "bubble" and not pooled_tick(tick):  # a steady tick: no plan, the local kernel
            asked[key] = request(docs, None, attention="local", pieces=pieces_of(step, m))
            return
        if m is None and not pooled_tick(tick):
            asked[key] = (None, None, time.perf_counter())
            return
        # The tag: the tick (CAD over the world; under --pool bubble only its bubble ticks have plans, still one
        # tag per tick) or the micro-batch (a stage's replicas run the same micro-batches at the same ticks).
        asked[key] = request(docs, step * T + tick if pooled_tick(tick) else step * M + m, pieces=pieces_of(step, m))

    pending_sends = []

    def send(tensor, to):
        pending_sends.append((dist.isend(tensor.contiguous(), dst=to, group=groups.pipe), tensor))

    def flush_sends():
        while pending_sends:
            work, _ = pending_sends.pop(0)
            work.wait(timeout=groups.timeout)

    def recv(shape, source):
        buffer = torch.empty(shape, dtype=dtype, device=device)
        dist.irecv(buffer, src=source, group=groups.pipe).wait(timeout=groups.timeout)
        return buffer

    @contextlib.contextmanager
    def tick_context(phase, tick, m):
        what = f"micro-batch {m}" if m is not None else "idle"
        started = time.perf_counter()
        try:
            yield
        except PipelineError:
            raise
        except Exception as exc:
            raise PipelineError(f"pipeline: {layout.describe()}: {phase} tick {tick} ({what}) of step "
                                f"{current['step']} failed after {time.perf_counter() - started:.1f} s: "
                                f"{type(exc).__name__}: {exc}") from exc

    # ---- 1F1B (--schedule 1f1b): the timetable's ticks, one operation per stage each --------------------------
    table = one_f_one_b(M, S) if args.schedule == "1f1b" else None
    pooled = use_cad and args.pool == "tick"
    bubble_1f1b = table is not None and use_cad and args.pool == "bubble"
    asked_1f1b = {}  # (step, micro-batch, stage) -> (cad.Plan or None, cu_seqlens, time asked)
    asked_ops = {}   # --pool bubble: (step, tick, stage) -> (cad.Plan or None, cu_seqlens, time asked)

    def ask_1f1b(step, tick):
        """The plans of the forwards that tick `tick` of `step` starts (a backward runs with its forward's plan),
        asked for once, in the timetable's order on every rank. CAD over the world (--pool tick): a plan per
        (micro-batch, stage) over every rank, with documents only from that stage's ranks (their replica's), so
        each spreads one stage's attention of one micro-batch over all ranks. CAD per stage: this stage's plan
        over its replicas. Local attention: cu_seqlens on the device. --pool bubble: see ask_bubble_1f1b."""
        if tick >= len(table) or step >= args.steps:
            return
        if bubble_1f1b:
            ask_bubble_1f1b(step, tick)
            return
        for s, op in enumerate(table[tick]):
            if op is None or op[0] != "forward" or (step, op[1], s) in asked_1f1b:
                continue
            m = op[1]
            if not pooled and s != layout.stage:
                continue
            docs = load(step)[0][m][layout.replica] if s == layout.stage else []
            asked_1f1b[(step, m, s)] = request(docs, (step * M + m) * S + s if pooled else step * M + m,
                                               pieces=pieces_of(step, m if s == layout.stage else None))

    def ask_bubble_1f1b(step, tick):
        """--pool bubble under 1F1B (--checkpointing full): in a tick with an idle stage every operation (the
        forward or the backward of (micro-batch, stage)) gets a plan of its own over every rank, with documents
        only from that stage's ranks, asked for on every rank in stage order (tag bubble_1f1b_tag: one per
        operation, the same on every rank). A backward's plan serves its recomputed forward and its backward: the
        backward tick decides both, however the forward ran. In a steady tick this stage's own operation runs
        local attention: cu_seqlens on the device, no plan, nothing asked of the other ranks."""
        pooled_now = one_f_one_b_bubble_tick(table, tick)
        for s, op in enumerate(table[tick]):
            if op is None or (step, tick, s) in asked_ops or not (pooled_now or s == layout.stage):
                continue
            direction, m = op
            docs = load(step)[0][m][layout.replica] if s == layout.stage else []
            own = pieces_of(step, m if s == layout.stage else None)
            if pooled_now:
                asked_ops[(step, tick, s)] = request(docs, bubble_1f1b_tag(step, direction, m, s, M, S), pieces=own)
            else:
                asked_ops[(step, tick, s)] = request(docs, None, attention="local", pieces=own)

    def exchange_1f1b(tick, outgoing, docs):
        """At the end of tick `tick`: this stage's output of the tick goes to its neighbour and the neighbours'
        outputs of the same tick come in, as one batch of sends and receives (in 1F1B a stage sends forward and
        backward at the same ticks: single sends waiting for their receives could wait for each other)."""
        ops, inbox = [], {}
        if outgoing is not None:
            to = layout.stage + (1 if outgoing[0] == "activation" else -1)
            ops.append(dist.P2POp(dist.isend, outgoing[2].contiguous(), layout.rank_of(to, layout.replica),
                                  group=groups.pipe))
        before = table[tick][layout.stage - 1] if not layout.first else None
        after = table[tick][layout.stage + 1] if not layout.last else None
        for source, op, kind in ((layout.stage - 1, before, "forward"), (layout.stage + 1, after, "backward")):
            if op is not None and op[0] == kind:
                m = op[1]
                buffer = torch.empty((1, sum(docs[m][layout.replica]), args.hidden), dtype=dtype, device=device)
                inbox[("activation" if kind == "forward" else "gradient", m)] = buffer
                ops.append(dist.P2POp(dist.irecv, buffer, layout.rank_of(source, layout.replica), group=groups.pipe))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait(timeout=groups.timeout)
        return inbox

    recomputes = args.checkpointing == "full"

    def step_1f1b(step, docs, inputs):
        """One step on the 1F1B timetable. Returns (this rank's tick records, the last stage's losses, {tick: the
        plan of this rank's forward at that tick (--pool bubble: of its operation)}, every plan this step's calls
        used)."""
        records, losses, kept, inbox, step_plans, own_plans, bubble_plans = [], [], {}, {}, {}, {}, []
        for t, ops in enumerate(table):
            op = ops[layout.stage]
            phase, m = op if op is not None else ("idle", None)
            with tick_context(phase, t, m):
                tick_start = time.perf_counter()
                maybe_fault(args, rank, "backward" if phase == "backward" else "forward", t)
                ask_1f1b(step, t)  # asked for during the tick before (or the step before), unless --plan-ahead off
                if ahead:  # the next tick's plans (after the last tick: the next step's first), made meanwhile
                    if t + 1 < len(table):
                        ask_1f1b(step, t + 1)
                    else:
                        ask_1f1b(step + 1, 0)
                pooled_now = pooled or (bubble_1f1b and one_f_one_b_bubble_tick(table, t))
                if bubble_1f1b:  # this tick's operations' own plans (a bubble tick) or this stage's cu_seqlens
                    tick_plans = {(o[1], s): asked_ops.pop((step, t, s)) for s, o in enumerate(ops)
                                  if (step, t, s) in asked_ops}
                    plan, cu, asked_at = tick_plans.get((m, layout.stage), (None, None, None))
                    plans = {k: v[0] for k, v in tick_plans.items()}
                    bubble_plans += [p for p in plans.values() if p is not None]
                else:
                    for s, o in enumerate(ops):  # the forwards this tick starts: their plans, kept for the backwards
                        if o is not None and o[0] == "forward" and (step, o[1], s) in asked_1f1b:
                            step_plans[(o[1], s)] = asked_1f1b.pop((step, o[1], s))
                    plan, cu, asked_at = step_plans.get((m, layout.stage), (None, None, None))
                    plans = {k: v[0] for k, v in step_plans.items()}
                order = contextlib.nullcontext()
                if pooled_now:  # every rank makes every plan's calls of this tick, in the stages' order (an idle
                    # rank all of them, as a server, when the block ends)
                    order = cad.CallOrder.for_tick(ops, layout.stage, plans, len(stage.layers), recomputes)
                # (--pool bubble: the tick's attention implementation and this rank's operation's arguments, also
                # for the recomputation inside a backward)
                arguments = stage.tick_attention(cu, plan) if bubble_1f1b else contextlib.nullcontext()
                outgoing = None
                with order, attention_for_tick(pooled_now), arguments:
                    if phase == "forward":
                        hidden = None
                        if not layout.first:
                            hidden = inbox.pop(("activation", m)).requires_grad_(True)
                        out = stage.forward(hidden, inputs[m], cu, plan)
                        if layout.last:
                            losses.append(out.detach())
                        else:
                            outgoing = ("activation", m, out.detach())
                        kept[m] = (hidden, out)
                    elif phase == "backward":
                        hidden, out = kept.pop(m)
                        if layout.last:
                            (out / M).backward()
                        else:
                            torch.autograd.backward(out, inbox.pop(("gradient", m)))
                        if not layout.first:
                            outgoing = ("gradient", m, hidden.grad)
                        del hidden, out
                # this rank's plan of the tick: its forward's (a backward reuses it), or under --pool bubble its
                # operation's own (forward or backward)
                recorded = plan if phase == "forward" or bubble_1f1b else None
                if recorded is not None:
                    own_plans[t] = recorded
                wait_for_device(device, args.timeout_ms / 1e3)
                record = tick_record(phase, t, m, tick_start, recorded, asked_at if recorded is not None else None,
                                     docs, layout, use_cad)
                # A tick mixes forwards and backwards: the cost model weighs each by its attention work
                work = ATTENTION_WORK[phase] + (1.0 if phase == "backward" and recomputes else 0.0)
                record["colocated_pairs"] *= work
                if pooled_now:  # this rank serves a share of every call of the tick (a recomputation: a forward)
                    record["planned_flops"] = sum(ATTENTION_WORK[d] * planned_share(p) for d, p, _ in order.slot)
                elif plan is not None:  # CAD per stage: its share of this stage's plan
                    record["planned_flops"] = work * planned_share(plan)
                records.append(record)
                if groups is not None:
                    inbox.update(exchange_1f1b(t, outgoing, docs))
        used = bubble_plans if bubble_1f1b else [p for p, _, _ in step_plans.values() if p is not None]
        return records, losses, own_plans, used

    # Every step's documents now, outside the timed steps: the pure-Python recipe walks the whole length file for
    # each micro-batch (cached_batch remembers them for the later configurations, which would otherwise not pay).
    for step in range(args.steps):
        if args.max_doc_len is None:
            micro_batch_documents(lengths, args, layout.dp, step)
        else:
            for m in range(M):
                long_docs.long_step(lengths, args, layout.dp, step, m)
    current = {"step": 0}
    makes_before = base_makes()
    for step in range(args.steps):
        current["step"] = step
        docs, inputs = load(step)
        if ahead:  # usually asked for during the step before
            (ask_1f1b if table else ask)(step, 0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        cad.attention_time(reset=True)
        AttentionClock.take()
        start = time.perf_counter()
        if table:
            records, losses, used_plans, step_plans = step_1f1b(step, docs, inputs)
        else:
            records = []   # per tick of this rank: dict
            kept = {}      # micro-batch -> (stage input or None, stage output or loss)
            idle = {}      # forward tick -> the idle chain's output
            used_plans = {}
            losses = []
            tick_shape = lambda m: (1, sum(docs[m][layout.replica]), args.hidden)  # noqa: E731
            # ---- forward ticks
            for t in range(T):
                m = forward_micro_batch(layout.stage, t, M)
                with tick_context("forward", t, m), attention_for_tick(pooled_tick(t)):
                    tick_start = time.perf_counter()
                    maybe_fault(args, rank, "forward", t)
                    ask(step, t)  # asked for during the tick before (or at the step before), unless --plan-ahead off
                    if ahead:
                        ask(step, t + 1)  # one tick ahead: made on CAD's planning thread while this tick computes
                    plan, cu, asked_at = asked.pop((step, t))
                    outgoing = None
                    if m is not None:
                        hidden = None
                        if not layout.first:  # waiting for the stage before is part of this tick
                            hidden = recv(tick_shape(m), layout.rank_of(layout.stage - 1, layout.replica))
                            hidden.requires_grad_(True)
                        out = stage.forward(hidden, inputs[m], cu, plan)
                        if layout.last:
                            losses.append(out.detach())
                        else:
                            outgoing = out.detach()
                        kept[m] = (hidden, out)
                    elif plan is not None:
                        idle[t] = idle_attention(plan, len(stage.layers), args.heads, args.kv_heads, head_dim, dtype,
                                                 device, args.checkpointing == "full")
                    wait_for_device(device, args.timeout_ms / 1e3)
                    records.append(tick_record("forward", t, m, tick_start, plan, asked_at, docs, layout, use_cad))
                    if plan is not None:
                        used_plans[t] = plan
                    # Sent once the tick is timed: over NCCL a send completes only when the next stage receives it,
                    # at its next tick's start, which is that tick's wait, not this one's.
                    if outgoing is not None:
                        flush_sends()
                        send(outgoing, layout.rank_of(layout.stage + 1, layout.replica))
            # ---- backward ticks (mirrored: backward tick b runs forward tick T - 1 - b's micro-batches)
            for b in range(T):
                t = mirrored_tick(b, M, S)
                m = forward_micro_batch(layout.stage, t, M)
                with tick_context("backward", b, m), attention_for_tick(pooled_tick(t)):  # t: the mirrored forward tick
                    tick_start = time.perf_counter()
                    maybe_fault(args, rank, "backward", b)
                    if b == T - 1 and ahead:
                        ask(step + 1, 0)  # the next step's first plan, while this last tick computes
                    outgoing = None
                    if m is not None:
                        hidden, out = kept.pop(m)
                        if layout.last:
                            (out / M).backward()
                        else:
                            grad = recv(out.shape, layout.rank_of(layout.stage + 1, layout.replica))
                            torch.autograd.backward(out, grad)
                        if not layout.first:
                            outgoing = hidden.grad
                        del hidden, out
                    elif t in idle:
                        out = idle.pop(t)
                        torch.autograd.backward(out, torch.zeros_like(out))
                        del out
                    wait_for_device(device, args.timeout_ms / 1e3)
                    records.append(tick_record("backward", b, m, tick_start, used_plans.get(t), None, docs, layout,
                                               use_cad))
                    if outgoing is not None:  # (after the tick's timing, as in the forward)
                        flush_sends()
                        send(outgoing, layout.rank_of(layout.stage - 1, layout.replica))
            step_plans = list(used_plans.values())
            del kept, idle
        try:
            flush_sends()
            average_gradients(parameters, groups.mine if groups else None, layout.dp)
        except Exception as exc:
            raise PipelineError(f"pipeline: {layout.describe()}: step {step}: the gradient all-reduce after the "
                                f"backward ticks failed: {type(exc).__name__}: {exc}") from exc
        if capture_grads:
            captured.append({n: p.grad.detach().clone() for n, p in stage.named_parameters() if p.grad is not None})
        # this stage's squared gradient norm, read back after the step is timed (one host sync, not one per tensor)
        norm_sq = torch.stack([p.grad.float().pow(2).sum() for p in parameters if p.grad is not None]).sum()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        plan_wait_ms = sum(p.wait_ms for p in used_plans.values())
        # the plans this step's ticks ran with (each made once, ahead or at its tick, never by a layer)
        plans_made = sum(1 for p in step_plans if p.make_ms is not None)
        # the plans' own timing, relative to their tick's start: asked (before), make started
        for r in records:
            plan = used_plans.get(r["tick"]) if r["phase"] == "forward" else None
            if plan is not None and plan.make_started_at is not None:
                r["make_started_ms"] = (plan.make_started_at - r["started_at"]) * 1e3
            r.pop("started_at")
        del used_plans, step_plans
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
        tokens = float(sum(sum(docs[m][layout.replica]) for m in range(M)))
        loss_sum = float(sum(losses)) / M if losses else 0.0
        mine = [loss_sum, 1.0 if layout.last else 0.0, seconds, tokens if layout.first else 0.0, peak,
                plan_wait_ms, float(plans_made), float(norm_sq)]
        for r in records:
            mine += [r["attention_s"], r["tick_s"], r["colocated_pairs"], r.get("planned_flops", 0.0)]
        gathered = gather_floats(mine, world, groups.records if groups else None)
        record = step_record(args, step, gathered, records, stage.matmul_params, docs, layout,
                             flops_documents=documents.pop(step, None))
        record["rank_ticks"] = records  # this rank's own view (plan ids and tags, when its plans were asked/made)
        history.append(record)
        loaded.pop(step, None)
        for m in range(M):
            pieces.pop((step, m), None)
        if rank == 0:
            print(f"step {step:3d}  loss {record['loss']:.5f}  {record['step_ms']:8.1f} ms  ideal "
                  f"{record['ideal_step_ms']:8.1f} ms  {record['tokens_per_s']:9.0f} tok/s  MFU {record['mfu']:6.1%}  "
                  f"tick imbalance {record['mean_tick_imbalance']:.3f} "
                  f"(planned {record['mean_planned_imbalance']:.3f}, "
                  f"colocated {record['mean_colocated_imbalance']:.3f})  plans {record['plans_made']}  "
                  f"peak {max(record['peak_memory_gib']):5.1f} GiB", flush=True)
    asked.clear()
    # every collective plan make of this configuration on this rank (cad's counter): equal to the plans the ticks
    # ran with when no layer had to make one of its own
    summary = dict(summary_of(args, layout, device), plan_makes_total=base_makes() - makes_before,
                   **summarise(history))
    result = {"summary": summary, "steps": history}
    if rank == 0:
        print("summary " + json.dumps(summary), flush=True)
        write_json(args.json_out, result)
    if capture_grads:
        result["grads"] = captured
    return result
