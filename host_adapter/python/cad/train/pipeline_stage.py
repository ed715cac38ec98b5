"""A pipeline stage and what it needs around it: the step's recipe batches per micro-batch and replica, the
stage's slice of the Llama (Stage), an idle stage's part in a tick's CAD calls, the process groups, the deadline on
a tick's GPU work, the data-parallel gradient average, and the --test-fault hook."""
import contextlib
import datetime
import sys
import time

import torch
import torch.distributed as dist

from .model import MicroBatchLoss, apply_checkpointing, build_model
from .flops import count_matmul_parameters
from .recipe import balanced_documents, cached_batch


class PipelineError(RuntimeError):
    """A tick failed; the message names the rank, its stage and replica, the tick and its micro-batch."""


def micro_batch_documents(lengths, args, dp, step):
    """Per micro-batch, per replica, the document lengths of its buffer (the Llama trainer's recipe and seeds). With
    --balanced-batches every buffer of the step (all micro-batches and replicas) keeps its tokens but gets
    documents of equal length chosen so that its causal attention work is nearest the step's mean buffer
    (recipe.balanced_documents over the step's buffers): then the stages' micro-batches at any tick do
    equal attention work, the ideal that CAD per tick aims at, measured rather than computed."""
    out = []
    for m in range(args.micro_batches):
        batch = cached_batch(lengths, args.context, dp, args.seed + 1000 * step + m)
        out.append([docs or [args.context] for docs in batch])
    if args.balanced_batches:
        flat = balanced_documents([docs for micro in out for docs in micro])
        out = [flat[m * dp:(m + 1) * dp] for m in range(args.micro_batches)]
    return out


def token_seed(args, step, replica, micro_batch):
    """train_llama's token seed of (step, rank, micro-batch), with the replica as the rank."""
    return args.seed * 7919 + 31 * step + replica + 100003 * micro_batch


class Stage:
    """One pipeline stage of the transformers Llama: its decoder layers, stage 0's embeddings, the last stage's
    final norm, head and loss. Parameters keep their names in the whole model (model.layers.<i>...)."""

    def __init__(self, args, layout, device, dtype):
        lm = build_model(args, device, dtype)
        self.matmul_params = count_matmul_parameters(lm)  # of the whole model, for the model FLOPs
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
            apply_checkpointing(lm, "full", per_tick)
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
        self.loss = MicroBatchLoss(lm, args.loss_chunk) if layout.last else None

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
        if "targets" in inputs:  # documents packed over the replicas whole (cad.train.long_docs): shifted labels
            hidden = self.inner.norm(hidden)
            return self.loss._summed_token_losses(hidden, inputs["targets"], shifted=True) / inputs["predicted"]
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
