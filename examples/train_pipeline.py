#!/usr/bin/env python3
"""Train a transformers Llama model pipeline parallel (GPipe or 1F1B) x data parallel, with core attention through
CAD balanced per pipeline tick across every rank (issue 27), or local.

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
import argparse
import contextlib
import datetime
import gc
import importlib.util
import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

HERE = pathlib.Path(__file__).resolve().parent


def _load_train_llama():
    """examples/train_llama.py as a module, loaded once per process (its attention clock and registrations are
    module state shared with the transformers attention functions it registers)."""
    name = "cad_train_llama"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "train_llama.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


base = _load_train_llama()

CONFIGS = {  # --configs name -> (attention, pool, schedule: None = --schedule's); in the comparison table's order
    "local": ("local", None, None), "torch_varlen": ("torch_varlen", None, None), "cad_tick": ("cad", "tick", None),
    "cad_stage": ("cad", "stage", None), "cad_bubble": ("cad", "bubble", None),
    "local_balanced": ("local", None, None),
    "1f1b_local": ("local", None, "1f1b"), "1f1b_torch_varlen": ("torch_varlen", None, "1f1b"),
    "1f1b_cad_tick": ("cad", "tick", "1f1b"), "1f1b_cad_stage": ("cad", "stage", "1f1b"),
    "1f1b_cad_bubble": ("cad", "bubble", "1f1b"),  # needs --checkpointing full (parse_args)
    "1f1b_local_balanced": ("local", None, "1f1b"),
}
# The measured ideal (--balanced-batches): local attention on the step's buffers made equal in attention work (every
# tick's attention at the mean, at no communication cost), not an alternative a user has.
BALANCED = ("local_balanced", "1f1b_local_balanced")


def baseline_name(config):
    """The local-attention configuration a configuration's speedup is measured against: the same schedule's."""
    return "1f1b_local" if config.startswith("1f1b_") else "local"


def balanced_name(config):
    """The configuration that measures the ideal of a configuration's schedule (local attention, balanced buffers)."""
    return "1f1b_local_balanced" if config.startswith("1f1b_") else "local_balanced"


class PipelineError(RuntimeError):
    """A tick failed; the message names the rank, its stage and replica, the tick and its micro-batch."""


# ---- the layout and the schedule -------------------------------------------------------------------------
class Layout:
    """Where this rank sits: rank = stage * dp + replica."""

    def __init__(self, rank, world, pp):
        check_layout(world, pp)
        self.rank, self.world, self.pp, self.dp = rank, world, pp, world // pp
        self.stage, self.replica = divmod(rank, self.dp)
        self.first, self.last = self.stage == 0, self.stage == pp - 1

    def rank_of(self, stage, replica):
        return stage * self.dp + replica

    def stage_ranks(self, stage):
        return [self.rank_of(stage, r) for r in range(self.dp)]

    def describe(self):
        return f"rank {self.rank} (stage {self.stage}, replica {self.replica})"


def check_layout(world, pp):
    if pp < 1:
        raise ValueError(f"--pp must be at least 1, got {pp}")
    if world % pp:
        raise ValueError(f"the world of {world} ranks is not divisible by --pp {pp} (world = PP x DP ranks)")


def ticks(micro_batches, stages):
    """Forward ticks per step (backward ticks are as many)."""
    return micro_batches + stages - 1


def forward_micro_batch(stage, tick, micro_batches):
    """The micro-batch stage `stage` runs at forward tick `tick`, or None (idle)."""
    m = tick - stage
    return m if 0 <= m < micro_batches else None


def bubble_tick(tick, micro_batches, stages):
    """Whether some stage is idle at GPipe forward tick `tick` (the fill and drain bubbles): the ticks --pool bubble
    runs CAD in."""
    return any(forward_micro_batch(s, tick, micro_batches) is None for s in range(stages))


def mirrored_tick(backward_tick, micro_batches, stages):
    """The forward tick whose micro-batches backward tick `backward_tick` runs (on every stage)."""
    return ticks(micro_batches, stages) - 1 - backward_tick


def one_f_one_b(micro_batches, stages):
    """The 1F1B timetable in ticks: per tick, per stage ("forward" | "backward", micro-batch) or None (idle).

    Stage s runs min(S - s - 1, M) warm-up forwards, then alternates one forward and one backward, then the
    remaining backwards (PipeDream-flush's order); each operation takes the first tick at which what it needs
    was done at an earlier tick (the activation from stage s - 1, the gradient from stage s + 1, or on the last
    stage its own forward), since a tick's outputs travel at its end. So at most S - s micro-batches are in
    flight on stage s (GPipe: all M), and at a tick some stages run forwards while others run backwards."""
    order = []
    for s in range(stages):
        warm = min(stages - s - 1, micro_batches)
        ops = [("forward", m) for m in range(warm)]
        for i in range(micro_batches - warm):
            ops += [("forward", warm + i), ("backward", i)]
        ops += [("backward", m) for m in range(micro_batches - warm, micro_batches)]
        order.append(ops)
    done = {}  # (stage, phase, micro-batch) -> tick
    table, nxt = [], [0] * stages
    while any(nxt[s] < len(order[s]) for s in range(stages)):
        tick = len(table)
        row = [None] * stages
        for s in range(stages):
            if nxt[s] == len(order[s]):
                continue
            phase, m = order[s][nxt[s]]
            if phase == "forward":
                need = (s - 1, "forward", m) if s > 0 else None
            else:
                need = (s + 1, "backward", m) if s < stages - 1 else (s, "forward", m)
            if need is None or done.get(need, tick) < tick:
                row[s] = (phase, m)
        for s, op in enumerate(row):
            if op is not None:
                done[(s, op[0], op[1])] = tick
                nxt[s] += 1
        table.append(row)
    return table


def one_f_one_b_bubble_tick(table, tick):
    """Whether some stage is idle at tick `tick` of a 1F1B timetable (one_f_one_b's): the ticks --pool bubble runs
    CAD in under --schedule 1f1b."""
    return any(op is None for op in table[tick])


# 1F1B --pool bubble's plan tags start here: above every other scheme's (GPipe's step x T + tick, a stage's
# step x M + m, 1F1B tick pool's (step x M + m) x S + s), so that no two plans of this process share a tag.
BUBBLE_1F1B_TAGS = 1 << 40


def bubble_1f1b_tag(step, direction, micro_batch, stage, micro_batches, stages):
    """The tag of the plan of one operation (the forward or the backward of (micro_batch, stage)) in a 1F1B bubble
    tick: the same on every rank, a different one per operation."""
    operation = (step * micro_batches + micro_batch) * stages + stage
    return BUBBLE_1F1B_TAGS + 2 * operation + (1 if direction == "backward" else 0)


# ---- the batches -----------------------------------------------------------------------------------------
def micro_batch_documents(lengths, args, dp, step):
    """Per micro-batch, per replica, the document lengths of its buffer (train_llama's recipe and seeds). With
    --balanced-batches every buffer of the step (all micro-batches and replicas) keeps its tokens but gets
    documents of equal length chosen so that its causal attention work is nearest the step's mean buffer
    (train_llama's balanced_documents over the step's buffers): then the stages' micro-batches at any tick do
    equal attention work, the ideal that CAD per tick aims at, measured rather than computed."""
    out = []
    for m in range(args.micro_batches):
        batch = base.cached_batch(lengths, args.context, dp, args.seed + 1000 * step + m)
        out.append([docs or [args.context] for docs in batch])
    if args.balanced_batches:
        flat = base.balanced_documents([docs for micro in out for docs in micro])
        out = [flat[m * dp:(m + 1) * dp] for m in range(args.micro_batches)]
    return out


def token_seed(args, step, replica, micro_batch):
    """train_llama's token seed of (step, rank, micro-batch), with the replica as the rank."""
    return args.seed * 7919 + 31 * step + replica + 100003 * micro_batch


# ---- the stage's model -----------------------------------------------------------------------------------
class Stage:
    """One pipeline stage of the transformers Llama: its decoder layers, stage 0's embeddings, the last stage's
    final norm, head and loss. Parameters keep their names in the whole model (model.layers.<i>...)."""

    def __init__(self, args, layout, device, dtype):
        lm = base.build_model(args, device, dtype)
        self.matmul_params = base.count_matmul_parameters(lm)  # of the whole model, for the model FLOPs
        per = args.layers // args.pp
        self.layer_ids = list(range(layout.stage * per, (layout.stage + 1) * per))
        # 1F1B --pool bubble: a backward's attention calls run under its own tick's kind and plan, not its forward's
        per_tick = args.schedule == "1f1b" and args.attention == "cad" and args.pool == "bubble"
        if args.checkpointing == "full":  # (before the embeddings go: transformers looks for them here)
            # transformers' own, non-reentrant as train_llama's; reentrant under 1F1B --pool bubble. Why: the
            # non-reentrant one backpropagates through the first forward's autograd nodes (only their saved tensors
            # are recomputed), so each attention backward would take its first forward's plan (or none, local);
            # the reentrant one runs the layer's forward again inside the backward and backpropagates through
            # that, so the recomputed forward's plan -- the backward tick's -- serves the backward call too.
            base.apply_checkpointing(lm, "full", per_tick)
        inner = lm.model
        for i in range(args.layers):  # the other stages' layers go; names of ours stay
            if i not in self.layer_ids:
                inner.layers[i] = torch.nn.Identity()
        if not layout.first:
            inner.embed_tokens = None
        if not layout.last:
            inner.norm = None
            lm.lm_head = None
        lm.train()
        self.lm, self.inner, self.layout, self.args = lm, inner, layout, args
        self.layers = [inner.layers[i] for i in self.layer_ids]
        self.tick_arguments = None  # (cu_seqlens, plan) of this rank's operation in the tick now running
        if per_tick:
            self._attention_arguments_per_tick()
        # The last stage's loss: train_llama's chunked token cross-entropy (logits recomputed per chunk).
        self.loss = base.MicroBatchLoss(lm, args.loss_chunk) if layout.last else None

    def _attention_arguments_per_tick(self):
        """1F1B --pool bubble: every attention call of the stage takes its cu_seqlens and plan from the tick now
        running (tick_attention), not from the layer's arguments. Why: activation checkpointing recomputes a layer
        with the arguments its first forward got, but a micro-batch's backward may run in another kind of tick
        than its forward (pooled under its own plan, or local), and the backward tick decides both of its calls:
        the recomputed forward and (reentrant checkpointing, see __init__) the backward."""
        for layer in self.layers:
            attention = layer.self_attn
            own_forward = attention.forward

            def forward(*args, _own_forward=own_forward, **kwargs):
                if self.tick_arguments is None:
                    raise RuntimeError("pipeline: an attention call outside a tick (no tick_attention active)")
                cu, plan = self.tick_arguments
                return _own_forward(*args, **dict(kwargs, cad_cu_seqlens=cu, cad_plan=plan))

            attention.forward = forward

    @contextlib.contextmanager
    def tick_attention(self, cu, plan):
        """The cu_seqlens and plan of this rank's operation in a tick (1F1B --pool bubble; see
        _attention_arguments_per_tick), for the calls made during the tick, recomputations included."""
        self.tick_arguments = (cu, plan)
        try:
            yield
        finally:
            self.tick_arguments = None

    def parameters(self):
        return [p for p in self.lm.parameters()]

    def named_parameters(self):
        return list(self.lm.named_parameters())

    def forward(self, hidden, inputs, cu, plan):
        """This stage's layers over one micro-batch: stage 0 embeds input_ids (hidden None), the last stage
        returns the micro-batch's loss, the others the hidden states for the next stage."""
        if self.layout.first:
            hidden = self.inner.embed_tokens(inputs["input_ids"])
        positions = inputs["position_ids"]
        extra = dict(position_ids=positions, position_embeddings=self.inner.rotary_emb(hidden, positions),
                     cad_cu_seqlens=cu, cad_plan=plan)
        for layer in self.layers:
            out = layer(hidden, attention_mask=None, **extra)
            hidden = out[0] if isinstance(out, tuple) else out  # transformers < 4.54 returns a tuple
        if not self.layout.last:
            return hidden
        labels = inputs["labels"]
        predicted = (labels[:, 1:] != -100).sum()
        return self.loss._summed_token_losses(self.inner.norm(hidden), labels) / predicted


def idle_attention(plan, layers, heads, kv_heads, head_dim, dtype, device, checkpointing):
    """An idle stage's part in a tick's CAD calls: per local decoder layer one cad.varlen_attn over 0 tokens with
    the tick's plan (over no documents), chained so that autograd runs their backwards in reverse layer order,
    each checkpointed when the layers are, so that its recomputation comes where theirs does. Returns the last
    output; its backward (at the mirrored backward tick) makes the backward calls."""
    import cad
    cu = plan.cu_seqlens

    def attention(x):
        kv = x[:, :kv_heads].contiguous()
        return cad.varlen_attn(x, kv, kv, cu, plan=plan)

    x = torch.empty(0, heads, head_dim, dtype=dtype, device=device, requires_grad=True)
    for _ in range(layers):
        x = torch.utils.checkpoint.checkpoint(attention, x, use_reentrant=False) if checkpointing else attention(x)
    return x


# ---- communication helpers -------------------------------------------------------------------------------
class Groups:
    """The process groups the trainer uses, made on every rank in the same order: the pipeline's send/recv group,
    every stage's data-parallel group, and a gloo group for the per-step records; all with --timeout-ms."""

    def __init__(self, layout, backend, timeout_ms):
        timeout = datetime.timedelta(milliseconds=timeout_ms)
        self.timeout = timeout
        # NCCL's watchdog ends the whole process when a collective passes its group's timeout, with a message that
        # names no tick; the trainer's own deadline (wait_for_device) is --timeout-ms, so NCCL's is later.
        device_timeout = timeout * 2 if backend == "nccl" else timeout
        self.pipe = dist.new_group(backend=backend, timeout=device_timeout)
        self.data = [dist.new_group(ranks=layout.stage_ranks(s), backend=backend, timeout=device_timeout)
                     for s in range(layout.pp)]
        self.mine = self.data[layout.stage]
        self.records = dist.new_group(backend="gloo", timeout=timeout)


def wait_for_device(device, timeout_s):
    """At a tick's end: wait for this rank's queued GPU work, as torch.cuda.synchronize() would, but give up after
    timeout_s. Over NCCL a peer that never sends, receives or joins a collective leaves the GPU waiting; without a
    deadline here the host would wait until NCCL's watchdog ends the process, and the error would name no tick."""
    if device.type != "cuda":
        return
    done = torch.cuda.Event()
    done.record()
    deadline = time.perf_counter() + timeout_s
    while not done.query():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"this rank's GPU work did not finish within {timeout_s:g} s (--timeout-ms): a peer's "
                               f"send, receive or collective never came")
        time.sleep(0.0002)


def gather_floats(values, world, group):
    """Every rank's list of floats (all the same length), as a list per rank."""
    t = torch.tensor(values, dtype=torch.float64)
    if world == 1:
        return [t.tolist()]
    out = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(out, t, group=group)
    return [o.tolist() for o in out]


def average_gradients(parameters, group, dp):
    """The data-parallel all-reduce of a stage: every gradient averaged over the stage's replicas, as one flat
    buffer per dtype (one collective instead of one per tensor)."""
    if dp == 1:
        return
    by_dtype = {}
    for p in parameters:
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=group)
        flat /= dp
        for g, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(reduced)


# ---- the test hook ---------------------------------------------------------------------------------------
def parse_fault(text):
    """--test-fault RANK:PHASE:TICK:KIND -> (rank, phase, tick, kind), or None."""
    if not text:
        return None
    parts = text.split(":")
    if len(parts) != 4 or parts[1] not in ("forward", "backward") or parts[3] not in ("raise", "stall") or \
            not parts[0].isdigit() or not parts[2].isdigit():
        raise ValueError(f"--test-fault must be RANK:PHASE:TICK:KIND with PHASE forward or backward and KIND raise "
                         f"or stall, e.g. 1:forward:2:stall; got {text!r}")
    return int(parts[0]), parts[1], int(parts[2]), parts[3]


def maybe_fault(args, rank, phase, tick):
    fault = parse_fault(args.test_fault)
    if fault is None or fault[:3] != (rank, phase, tick):
        return
    if fault[3] == "raise":
        raise RuntimeError(f"test fault: rank {rank} raises at {phase} tick {tick} (--test-fault)")
    stall = 3 * args.timeout_ms / 1e3
    print(f"test fault: rank {rank} stalls for {stall:g} s at {phase} tick {tick} (--test-fault)", file=sys.stderr,
          flush=True)
    time.sleep(stall)


# ---- one configuration -----------------------------------------------------------------------------------
def launched_distributed():
    return base.launched_distributed()


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
            "sync_attention_timing": args.sync_attention_timing, "peak_tflops": args.peak_tflops}


def write_json(path, result):
    if path:
        pathlib.Path(path).write_text(json.dumps(result, indent=1))


def train_one(args, rank, world, device, lengths, capture_grads=False):
    """One configuration: a fresh model (the same weights every time), optimizer and CAD stack, its steps, its
    summary and --json-out (rank 0). Returns {"summary", "steps"} on every rank; with capture_grads also
    "grads": per step {parameter name: gradient after the data-parallel average} of this rank's stage."""
    import cad

    layout = Layout(rank, world, args.pp)
    if args.attention == "torch_varlen" and base.torch_varlen_unavailable(device):
        reason = base.torch_varlen_unavailable(device)
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
                 keep_forward_tensors=keep)
        if args.pool == "stage" and layout.dp == 1 and rank == 0:
            print("note: --pool stage with DP = 1: every CAD group is one rank, so CAD balances nothing here (the "
                  "data-parallel-only path cannot move attention between stages; --pool tick can)", flush=True)
        if args.pool == "bubble" and layout.dp > 1 and rank == 0:
            print(f"note: --pool bubble with DP = {layout.dp}: the steady ticks run local attention, so the imbalance "
                  f"between a stage's replicas there stays (cad simulate --pool bubble predicts --pool tick or stage "
                  f"ahead wherever DP > 1; docs/simulate.md)", flush=True)
    synced = args.sync_attention_timing == "on"
    cad.timing(sync_cuda=synced)
    base.AttentionClock.sync = synced
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
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

    def load(step):
        if step not in loaded:
            docs = micro_batch_documents(lengths, args, layout.dp, step)
            inputs = [base.make_inputs(docs[m][layout.replica], args.vocab, token_seed(args, step, layout.replica, m),
                                       device) for m in range(M)]
            loaded[step] = (docs, inputs)
        return loaded[step]

    def tick_documents(step, tick):
        m = forward_micro_batch(layout.stage, tick, M)
        return m, ([] if m is None else load(step)[0][m][layout.replica])

    def request(docs, tag, attention=None):
        """(plan or None, cu_seqlens, time asked) for attention over `docs` with `attention` (default
        --attention's; "local" for --pool bubble's steady ticks): local attention, train_llama's cu_seqlens on
        the device (and torch_varlen's longest document), `tag` unused; CAD, a plan over cu_seqlens on the host
        (the plan reads it there, no GPU read-back, and so does every layer's call), tagged `tag` (unique per plan
        of the CAD group, the same on every rank of it), made ahead on CAD's planning thread (--plan-ahead on)
        or now."""
        attention = attention or args.attention
        if attention != "cad":
            (_, cu, _), = base.make_nanos([docs], attention, args, device, dtype)
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
        config._attn_implementation = base.IMPLEMENTATIONS["cad" if pooled_now else "local"]
        try:
            yield
        finally:
            config._attn_implementation = base.IMPLEMENTATIONS["cad"]

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
            asked[key] = request(docs, None, attention="local")
            return
        if m is None and not pooled_tick(tick):
            asked[key] = (None, None, time.perf_counter())
            return
        # The tag: the tick (CAD over the world; under --pool bubble only its bubble ticks have plans, still one
        # tag per tick) or the micro-batch (a stage's replicas run the same micro-batches at the same ticks).
        asked[key] = request(docs, step * T + tick if pooled_tick(tick) else step * M + m)

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
            asked_1f1b[(step, m, s)] = request(docs, (step * M + m) * S + s if pooled else step * M + m)

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
            if pooled_now:
                asked_ops[(step, tick, s)] = request(docs, bubble_1f1b_tag(step, direction, m, s, M, S))
            else:
                asked_ops[(step, tick, s)] = request(docs, None, attention="local")

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
        micro_batch_documents(lengths, args, layout.dp, step)
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
        base.AttentionClock.take()
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
        record = step_record(args, step, gathered, records, stage.matmul_params, docs, layout)
        record["rank_ticks"] = records  # this rank's own view (plan ids and tags, when its plans were asked/made)
        history.append(record)
        loaded.pop(step, None)
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


def base_makes():
    """Collective plan makes so far in this process (cad's counter)."""
    import cad._plan
    return cad._plan.makes_so_far()


def tick_record(phase, tick, m, tick_start, plan, asked_at, docs, layout, use_cad):
    """What one rank measured in one tick (attention time since the last take, the tick's time) and its costs."""
    import cad
    now = time.perf_counter()
    own = docs[m][layout.replica] if m is not None else []
    record = {"phase": phase, "tick": tick, "micro_batch": -1 if m is None else m, "started_at": tick_start,
              "tick_s": now - tick_start,
              "attention_s": cad.attention_time(reset=True) + base.AttentionClock.take(),
              "colocated_pairs": float(base.causal_cost(own))}
    if use_cad and plan is not None:
        record["plan_id"], record["plan_tag"] = plan.id, plan.tag
        if asked_at is not None:
            record["asked_ms"] = (asked_at - tick_start) * 1e3  # negative: asked before the tick began
        stats = plan.stats
        if stats:
            me = stats.get("rank")
            servers = stats.get("servers") or []
            if me is not None and me < len(servers):
                record["planned_flops"] = float(servers[me]["forward_flops"])
            record["plan_imbalance"] = stats["imbalance"]
    return record


# Attention work of a call by direction, in forwards (a backward's matmuls are 2.5 forwards'): in a 1F1B tick some
# stages run forwards while others run backwards, so a tick's imbalance weighs them (a recomputation is a forward).
ATTENTION_WORK = {"forward": 1.0, "backward": 2.5, "idle": 0.0}


def planned_share(plan):
    """This rank's forward FLOPs as a server of `plan` (its stats), or 0."""
    stats = plan.stats or {}
    me, servers = stats.get("rank"), stats.get("servers") or []
    return float(servers[me]["forward_flops"]) if me is not None and me < len(servers) else 0.0


def _imbalance(values):
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 1.0


def step_record(args, step, gathered, records, matmul_params, docs, layout):
    """One step over every rank: the scalars, then per tick the ranks' attention and tick times and costs."""
    world = len(gathered)
    last = [g for g in gathered if g[1] == 1.0]
    step_s = max(g[2] for g in gathered)
    per_tick = []
    saved = 0.0
    for i, r in enumerate(records):
        at = 8 + 4 * i
        attention = [g[at] for g in gathered]
        tick_s = [g[at + 1] for g in gathered]
        colocated = [g[at + 2] for g in gathered]
        planned = [g[at + 3] for g in gathered]
        mean = sum(attention) / world
        saved += max(attention) - mean
        entry = {"phase": r["phase"], "tick": r["tick"], "attention_s": attention, "tick_s": tick_s,
                 "imbalance": _imbalance(attention), "colocated_imbalance": _imbalance(colocated),
                 "micro_batch_on_rank0": r["micro_batch"]}
        if any(planned):
            entry["planned_imbalance"] = _imbalance(planned)
        if "plan_imbalance" in r:
            entry["plan_imbalance"] = r["plan_imbalance"]  # the balancer's max/mean over its group's servers
        per_tick.append(entry)
    tokens = sum(g[3] for g in gathered)
    flops = base.model_flops(args, matmul_params, docs)
    return {"step": step, "loss": sum(g[0] for g in last) / len(last), "losses": [g[0] for g in last],
            "grad_norm": sum(g[7] for g in gathered[::layout.dp]) ** 0.5,
            "step_s": [g[2] for g in gathered], "step_ms": step_s * 1e3,
            "ideal_step_ms": (step_s - saved) * 1e3, "tokens_per_s": tokens / step_s,
            "model_tflop": flops / 1e12, "mfu": flops / (step_s * world * args.peak_tflops * 1e12),
            "peak_memory_gib": [g[4] for g in gathered], "plan_wait_ms": [g[5] for g in gathered],
            "plans_made": [int(g[6]) for g in gathered],
            "mean_tick_imbalance": sum(e["imbalance"] for e in per_tick) / len(per_tick),
            "mean_colocated_imbalance": sum(e["colocated_imbalance"] for e in per_tick) / len(per_tick),
            "mean_planned_imbalance": sum(e.get("planned_imbalance", e["colocated_imbalance"]) for e in per_tick)
            / len(per_tick),
            "ticks": per_tick}


def summarise(history):
    """Means over the steps after the first (a warm-up), or over the one step there is."""
    tail = history[1:] or history

    def mean(key):
        return sum(r[key] for r in tail) / len(tail)

    return {"first_loss": history[0]["loss"], "last_loss": history[-1]["loss"],
            "mean_step_ms_after_step0": mean("step_ms"), "mean_ideal_step_ms_after_step0": mean("ideal_step_ms"),
            "mean_tokens_per_s_after_step0": mean("tokens_per_s"), "mean_mfu_after_step0": mean("mfu"),
            "mean_tick_imbalance": mean("mean_tick_imbalance"),
            "mean_planned_imbalance": mean("mean_planned_imbalance"),
            "mean_colocated_imbalance": mean("mean_colocated_imbalance"),
            "mean_plan_wait_ms": sum(max(r["plan_wait_ms"]) for r in tail) / len(tail),
            "peak_memory_gib": max(max(r["peak_memory_gib"]) for r in history)}


# ---- the comparison table --------------------------------------------------------------------------------
def comparison(summaries):
    """Rows of the table from each configuration's summary (name -> summary); speedups over the local attention of
    the same schedule ("local", or "1f1b_local" for the 1f1b_ configurations)."""
    rows = []
    # Attention times without CUDA waits around the calls (--sync-attention-timing off) count only the enqueue:
    # no ideal and no measured tick imbalance from them.
    timed = lambda s: s.get("sync_attention_timing", "on") == "on"  # noqa: E731
    # The best alternative a user has: the fastest run with local attention (ours or torch's varlen, either
    # schedule; lockstep 1F1B can be slower than GPipe, so its own local alone would flatter CAD under 1F1B).
    local_steps = [s["mean_step_ms_after_step0"] for n, s in summaries.items()
                   if CONFIGS.get(n, ("",))[0] in ("local", "torch_varlen") and n not in BALANCED
                   and "skipped" not in s]
    fastest_local = min(local_steps) if local_steps else None
    for name, s in summaries.items():
        local = summaries.get(baseline_name(name))
        ideal = None
        balanced = summaries.get(balanced_name(name))
        if local and "skipped" not in local and balanced and "skipped" not in balanced:
            # measured: the same schedule's local attention on balanced buffers (preferred: no timing syncs needed)
            ideal = local["mean_step_ms_after_step0"] / balanced["mean_step_ms_after_step0"]
        elif local and "skipped" not in local and timed(local):
            ideal = local["mean_step_ms_after_step0"] / local["mean_ideal_step_ms_after_step0"]
        if "skipped" in s:
            rows.append({"config": name, "skipped": s["skipped"]})
            continue
        row = {"config": name, "step_ms": s["mean_step_ms_after_step0"], "ideal_step_ms":
               s["mean_ideal_step_ms_after_step0"], "tokens_per_s": s["mean_tokens_per_s_after_step0"],
               "tick_imbalance": s["mean_tick_imbalance"] if timed(s) else None,
               "planned_imbalance": s["mean_planned_imbalance"],
               "colocated_imbalance": s["mean_colocated_imbalance"], "peak_memory_gib": s["peak_memory_gib"]}
        if local and "skipped" not in local:
            row["speedup"] = local["mean_step_ms_after_step0"] / s["mean_step_ms_after_step0"]
            row["ideal"] = ideal
            row["realised_share"] = (row["speedup"] - 1) / (ideal - 1) if ideal and ideal > 1 + 1e-9 else None
        if fastest_local is not None:
            row["speedup_vs_fastest_local"] = fastest_local / s["mean_step_ms_after_step0"]
        rows.append(row)
    return rows


def comparison_table(summaries):
    """The table as markdown text."""
    lines = ["| config | step ms | tokens/s | speedup vs local (same schedule) | ideal | realised share | "
             "tick imbalance measured | planned (after) | colocated (before) | peak GiB | speedup vs fastest local |",
             "|" + "---|" * 11]
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for row in comparison(summaries):
        if "skipped" in row:
            lines.append(f"| {row['config']} | skipped: {row['skipped']} |" + " |" * 9)
            continue
        lines.append(f"| {row['config']} | {row['step_ms']:.1f} | {row['tokens_per_s']:.0f} | "
                     f"{fmt(row.get('speedup'), '.3f')} | {fmt(row.get('ideal'), '.3f')} | "
                     f"{fmt(row.get('realised_share'), '.2f')} | {fmt(row['tick_imbalance'], '.3f')} | "
                     f"{row['planned_imbalance']:.3f} | {row['colocated_imbalance']:.3f} | "
                     f"{row['peak_memory_gib']:.1f} | {fmt(row.get('speedup_vs_fastest_local'), '.3f')} |")
    return "\n".join(lines)


# ---- the command line ------------------------------------------------------------------------------------
def configurations(args):
    """(name, args) of every configuration to train: --configs, else the one of --attention/--pool."""
    if not args.configs:
        return [(None, args)]
    runs = []
    for name in args.configs.split(","):
        run = argparse.Namespace(**vars(args))
        run.attention, pool, schedule = CONFIGS[name]
        run.pool = pool or args.pool
        run.schedule = schedule or args.schedule
        run.balanced_batches = args.balanced_batches or name in BALANCED
        run.json_out = args.json_out.replace("{config}", name) if args.json_out else None
        runs.append((name, run))
    return runs


def train(args):
    import cad
    distributed = launched_distributed()
    if distributed:
        # (NCCL: twice --timeout-ms, so that the trainer's own deadlines, which name the tick, come first)
        timeout = datetime.timedelta(milliseconds=args.timeout_ms * (2 if args.backend == "nccl" else 1))
        dist.init_process_group(args.backend, timeout=timeout)
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    lengths = json.loads(pathlib.Path(args.data).read_text())
    summaries = {}
    for label, run in configurations(args):
        if label is not None and rank == 0:
            print(f"==== configuration {label}", flush=True)
        summaries[label or args.attention] = train_one(run, rank, world, device, lengths)["summary"]
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    if rank == 0 and len(summaries) > 1:
        print(comparison_table(summaries), flush=True)
    cad.shutdown()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return summaries


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pp", type=int, default=2, help="pipeline stages; the world must divide by it (DP = world / PP)")
    p.add_argument("--attention", choices=["local", "torch_varlen", "cad"], default="cad")
    p.add_argument("--pool", choices=["tick", "stage", "bubble"], default="tick",
                   help="with --attention cad: tick = one CAD group over every rank, a plan per tick; stage = CAD "
                        "within each stage's data-parallel group only; bubble = CAD over every rank in the ticks "
                        "with an idle stage only (GPipe's fill and drain; an idle stage's free capacity), local "
                        "attention in the steady ticks (there the micro-batches' imbalance costs GPipe nothing, "
                        "measured); with --schedule 1f1b it needs --checkpointing full")
    p.add_argument("--balancer", default="prefix_aware", help="colocated, per_doc_cp, distca, prefix_aware")
    p.add_argument("--communicator", choices=["host", "nccl"], default=None,
                   help="CAD's: host (torch.distributed's gloo, CPU) or nccl (CUDA); default: host on CPU, nccl on "
                        "CUDA")
    p.add_argument("--model", choices=sorted(base.MODELS), default="tiny",
                   help="shape preset (train_llama's): tiny or llama3-8b; the options below override it")
    p.add_argument("--context", type=int, default=2048, help="tokens per micro-batch and replica (one packed buffer)")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per step")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe",
                   help="gpipe: all forward ticks, then all backward ticks; 1f1b: one forward, one backward (at most "
                        "PP - stage micro-batches in flight), forwards and backwards at the same tick on different "
                        "stages (CAD over the world: cad.CallOrder)")
    for name in ("layers", "hidden", "heads", "kv-heads", "vocab"):
        p.add_argument(f"--{name}", type=int, default=None, help="default: the --model preset's")
    p.add_argument("--intermediate", type=int, default=None, help="MLP width; 0: 3 x --hidden (tiny's default)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="default: fp32 on CPU, bf16 on CUDA")
    p.add_argument("--checkpointing", choices=["none", "full"], default="none",
                   help="full: every decoder layer recomputed in the backward (transformers' own, non-reentrant; "
                        "reentrant under --schedule 1f1b --pool bubble, whose backwards run their own tick's plan)")
    p.add_argument("--keep-forward-tensors", choices=["auto", "on", "off"], default="auto",
                   help="CAD's (cad.init): where a forward's Q/K/V/O wait for its backward -- on the servers (on), the "
                        "owners (off), or on the servers only for a recomputed forward (auto)")
    p.add_argument("--loss-chunk", type=int, default=4096, help="tokens per chunk of the head and cross-entropy")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="for MFU (default 989: H100 SXM bf16)")
    p.add_argument("--timeout-ms", type=int, default=120000,
                   help="every wait's deadline: send/recv, CAD's collectives, plans made ahead")
    p.add_argument("--data", default=os.environ.get("CAD_DATA", str(base.REPO.parent / "shared" / "data" /
                                                                    "doclen_pretrain.json")))
    p.add_argument("--plan-ahead", choices=["on", "off"], default="on",
                   help="on: each tick's plan asked for one tick ahead and made on CAD's planning thread; off: made "
                        "at its tick's start")
    base.add_attention_timing_option(p, "CUDA synchronised around every attention call, so attention times are "
                                        "the GPU's (and the ideal can be computed)")
    p.add_argument("--json-out", default=None,
                   help="every step's record and the summary (rank 0); with --configs it must contain {config}")
    p.add_argument("--configs", default=None,
                   help="train several configurations in turn in this process, same weights and batches: a comma "
                        "list of local, torch_varlen, cad_tick, cad_stage, cad_bubble (--schedule's; cad_bubble: "
                        "CAD in the ticks with an idle stage only, local attention in the steady ones) and "
                        "1f1b_local, 1f1b_torch_varlen, 1f1b_cad_tick, 1f1b_cad_stage, 1f1b_cad_bubble (1F1B; "
                        "1f1b_cad_bubble needs --checkpointing full), and local_balanced, "
                        "1f1b_local_balanced (the measured ideal: --balanced-batches); ends with a comparison table")
    p.add_argument("--balanced-batches", action="store_true",
                   help="the measured ideal: every buffer of a step keeps its tokens but holds equal-length documents "
                        "with its causal attention work nearest the step's mean buffer (the local_balanced "
                        "configurations set it)")
    p.add_argument("--test-fault", default=None,
                   help="for tests: RANK:PHASE:TICK:KIND, PHASE forward|backward, KIND raise (that rank raises at "
                        "the tick's start) or stall (sleeps 3 x --timeout-ms there)")
    args = base.apply_model_defaults(p.parse_args(argv))
    if args.device == "cuda" and args.communicator == "host":
        p.error("--communicator host on CUDA: the stages' send/recv of CUDA tensors needs NCCL (one process per GPU)")
    if args.device == "cpu" and args.communicator == "nccl":
        p.error("--communicator nccl needs --device cuda")
    args.backend = "nccl" if args.device == "cuda" else "gloo"
    # train_llama's helpers read these (make_nanos, model_flops): one global causal mask, no ping-pong
    args.window, args.global_every, args.ping_pong = -1, None, False
    if args.pp < 1 or args.layers < 1 or args.micro_batches < 1 or args.steps < 1 or args.context < 1:
        p.error("--pp, --layers, --micro-batches, --steps and --context must be at least 1")
    if args.layers % args.pp:
        p.error(f"--layers {args.layers} is not divisible by --pp {args.pp} (each stage holds layers / pp decoder "
                f"layers)")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must divide by --heads, and --heads by --kv-heads")
    if "WORLD_SIZE" in os.environ:
        try:
            check_layout(int(os.environ["WORLD_SIZE"]), args.pp)
        except ValueError as exc:
            p.error(str(exc))
    try:
        parse_fault(args.test_fault)
    except ValueError as exc:
        p.error(str(exc))
    if args.configs is not None:
        bad = [n for n in args.configs.split(",") if n not in CONFIGS]
        if bad:
            p.error(f"--configs: {bad[0]!r} is not one of {', '.join(CONFIGS)}")
        if args.json_out and "{config}" not in args.json_out:
            p.error("--json-out must contain {config} with --configs (one JSON per configuration)")
    # --pool bubble under 1F1B pools only the ticks with an idle stage, where a micro-batch's forward and backward
    # may fall in different kinds of tick: only a backward that recomputes its forward (--checkpointing full)
    # makes all of its attention calls in its own tick, under that tick's kind. GPipe's bubble ticks mirror each
    # other, so it runs with or without checkpointing.
    for name, run in configurations(args):
        if run.attention == "cad" and run.pool == "bubble" and run.schedule == "1f1b":
            which = f" ({name})" if name else ""
            if run.checkpointing != "full":
                p.error(f"--pool bubble{which} with --schedule 1f1b needs --checkpointing full: a micro-batch's "
                        f"forward and backward can fall in different kinds of tick (pooled or local), so the "
                        f"backward's attention calls must all be made in its own tick, its forward's recomputed "
                        f"there")
            if run.keep_forward_tensors == "on":
                # the servers would keep every pooled first forward's tensors for a backward that never comes
                # under that plan (the backward recomputes under its own), until cad.shutdown
                p.error(f"--pool bubble{which} with --schedule 1f1b takes --keep-forward-tensors auto or off, not "
                        f"on: its backwards recompute their forwards under plans of their own, so a forward's kept "
                        f"tensors would never be used")
    base.resolve_attention_timing(args)
    return args


def main():
    # As train_llama: a failed rank leaves at once (its traceback and the tick's message on stderr).
    base.run_exiting_on_failure("train_pipeline", train, parse_args())


if __name__ == "__main__":
    main()
