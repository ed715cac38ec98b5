"""The ping-pong schedule: two nano-batches, each with its own plan, interleaved stage by stage on two CUDA
streams, so that while one nano-batch's attention traffic is in flight the other's compute runs.

This is only the host-side schedule: the CAD plugin's CUDA data path does the rest (each call only enqueues;
its communication runs on the plugin's communication stream and joins the caller's stream with events).
Autograd replays each op on the stream it ran on, so the backward interleaves the same way. On CPU (or with
one stream) the stages simply run in order.
"""
import torch

from . import _context
from ._errors import CadError


def ping_pong(stages, states, *, device=None, context=None):
    """Run every stage on both nano-batches, alternating: for stage in stages: for i in (0, 1):
    states[i] = stage(states[i], i), nano-batch i on CUDA stream i. Returns the final states, ordered after
    both streams on the current stream.

    stages: callables (state, index) -> state, e.g. one per transformer layer, each calling
    cad.varlen_attn(..., plan=plans[index]); states: the two nano-batches' inputs (e.g. hidden states).
    Each stage is called once per nano-batch: right for plain modules (and DDP, whose hooks are per parameter).
    A layer whose module hooks do per-call work on its weights (FSDP2's gather before, free and gradient
    reduce after) must see both nano-batches in one call: wrap it in PingPongLayer and use ping_pong_layers.
    context: the cad.Context whose two streams the nano-batches run on (default: the default context).
    """
    states = list(states)
    if len(states) != 2:
        raise ValueError(f"cad.ping_pong: expected two nano-batch states, got {len(states)}")
    device = _device_of(states, device)
    if device.type != "cuda":
        for stage in stages:
            for i in (0, 1):
                states[i] = stage(states[i], i)
        return states
    caller = torch.cuda.current_stream(device)
    streams = nano_batch_streams(device, context)
    for s in streams:
        s.wait_stream(caller)  # inputs were produced on the caller's stream
    for stage in stages:
        for i in (0, 1):
            with torch.cuda.stream(streams[i]):
                states[i] = stage(states[i], i)
    return _joined(states, caller, streams)


class PingPongLayer(torch.nn.Module):
    """A layer that takes both nano-batches in one call, so that the hooks of a wrapper around it (FSDP2's
    fully_shard, activation checkpointing) run once per layer and micro-batch, as they expect, not once per
    nano-batch.

        layer(*args, **kwargs)                      the wrapped layer as is (a micro-batch that is not split)
        layer(nano_batches=((args0, kwargs0),       the layer on each nano-batch, nano-batch i on CUDA stream i
                            (args1, kwargs1)))      (nano_batch_streams); returns (out0, out1)

    Why: FSDP2 gathers a layer's weights before a call, and after the call's backward frees them and
    reduce-scatters their gradients. Called once per nano-batch on two streams, the first nano-batch's backward
    freed the weights while the other stream still read them, and reduced gradients the other had not added yet
    (NaN and wrong gradient norms on 2 H200s at 64K-128K tokens per GPU). In one call, the gather happens once
    before both, and the post-backward hook, which FSDP2 attaches to all of the call's inputs, waits for both
    nano-batches' gradients. Wrap before fully_shard and checkpointing wrappers; the layer's parameters stay its
    own (state-dict keys gain the prefix "layer."). context: the cad.Context whose two nano-batch streams it runs
    on (default: the default context)."""

    def __init__(self, layer, *, context=None):
        super().__init__()
        if not isinstance(layer, torch.nn.Module):
            raise CadError(f"cad.PingPongLayer: layer must be a torch.nn.Module, got {type(layer).__name__}",
                           "INVALID_ARGUMENT")
        self.layer = layer
        self.context = context

    def forward(self, *args, nano_batches=None, **kwargs):
        if nano_batches is None:
            return self.layer(*args, **kwargs)
        if args or kwargs:
            raise CadError("cad.PingPongLayer: with nano_batches, pass each nano-batch's arguments inside it "
                           f"(got {len(args)} positional and {sorted(kwargs)} keyword arguments besides)",
                           "INVALID_ARGUMENT")
        if len(nano_batches) != 2 or any(len(nano) != 2 for nano in nano_batches):
            raise CadError("cad.PingPongLayer: nano_batches must be two (args, kwargs) pairs, got "
                           f"{[type(nano).__name__ for nano in nano_batches]}", "INVALID_ARGUMENT")
        device = _device_of([a for nano_args, _ in nano_batches for a in nano_args], None)
        if device.type != "cuda":
            return tuple(self.layer(*nano_args, **nano_kwargs) for nano_args, nano_kwargs in nano_batches)
        # Everything this call's pre-hooks did (FSDP2's copy of the gathered weights into place) is on the
        # calling stream: both nano-batch streams start after it, and after the inputs it produced.
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(device))
        outs = []
        for stream, (nano_args, nano_kwargs) in zip(nano_batch_streams(device, self.context), nano_batches):
            with torch.cuda.stream(stream):
                stream.wait_event(ready)
                outs.append(self.layer(*nano_args, **nano_kwargs))
        return tuple(outs)


def ping_pong_layers(layers, states, kwargs=({}, {})):
    """The two nano-batch states through every layer, each layer a PingPongLayer called once with both: layer i
    runs nano-batch 0 on stream 0 and nano-batch 1 on stream 1, so one nano-batch's attention exchange overlaps
    the other's compute. kwargs[i]: keyword arguments of every layer call for nano-batch i (its positions, its
    CAD plan). A layer may return a tuple (transformers' decoder layers before 4.54): its first element goes on.
    Returns the final states, ordered after both streams on the current stream."""
    states = list(states)
    if len(states) != 2 or len(kwargs) != 2:
        raise ValueError(f"cad.ping_pong_layers: expected two nano-batch states and two kwargs, got {len(states)} "
                         f"and {len(kwargs)}")
    for i, layer in enumerate(layers):
        if not isinstance(layer, PingPongLayer):
            raise CadError(f"cad.ping_pong_layers: layers[{i}] must be a cad.PingPongLayer, got "
                           f"{type(layer).__name__}", "INVALID_ARGUMENT")
    device = _device_of(states, None)
    caller = torch.cuda.current_stream(device) if device.type == "cuda" else None
    for layer in layers:
        outs = layer(nano_batches=[((state,), kw) for state, kw in zip(states, kwargs)])
        states = [out[0] if isinstance(out, tuple) else out for out in outs]
    if caller is None:
        return states
    joined = []  # each layer's pair of streams (its context's), once
    for layer in layers:
        pair = nano_batch_streams(device, layer.context)
        if all(pair is not seen for seen in joined):
            joined.append(pair)
            states = _joined(states, caller, pair)
    return states


def _device_of(states, device):
    if device is None:
        first = next((s for s in states if isinstance(s, torch.Tensor)), None)
        device = first.device if first is not None else torch.device("cpu")
    return torch.device(device)


def _joined(states, caller, streams):
    """The final states, usable on the caller's stream: it waits for both nano-batch streams, and the states'
    memory is marked as used there (the caching allocator frees it for reuse only after the caller's work)."""
    for i in (0, 1):
        caller.wait_stream(streams[i])
        if isinstance(states[i], torch.Tensor):
            states[i].record_stream(caller)
    return states


def nano_batch_streams(device, context=None):
    """The two CUDA streams nano-batches 0 and 1 run on: the same two at every call on a device, kept by `context`
    (a cad.Context; default: the default context, cad.context()) for its life.

    Why not fresh streams per call: the caching allocator keeps a freed block for the stream it was allocated on,
    and torch.cuda.Stream() hands out the next stream of a pool of 32, so fresh streams per micro-batch would
    leave each step's activations cached for streams no later step uses."""
    return (context if context is not None else _context.default()).nano_batch_streams(device)


class PingPongChoice:
    """Whether splitting micro-batches into two nano-batches pays, decided from a measured step instead of
    assumed: ping-pong can hide at most the time the calling streams stall on CAD's exchanges, and splitting
    costs compute efficiency (smaller kernels, NCCL kernels sharing SMs with the other stream's compute; measured
    on 2 and 4 H200s at 64K-128K tokens per GPU, bench/results/trainer_h200x2_2026-11-27_{00fd4de,13b3af9}, trainer_h200x4_2026-11-27_00fd4de: the compute kernels take 2.8%
    longer split, and ping-pong lost 0.1-3% of the step where the unsplit stall was 2.5-4.2% of it). The default
    threshold, 7%, keeps it off wherever it lost. So a trainer runs unsplit, gives one unsplit step's time and stall to
    observe(), and from then on splits only if the stall is at least `min_stall_share` of the step; `reason`
    says why either way (print it).

        choice = cad.PingPongChoice()
        ... each step: split = choice.split is True; after an unsplit step (not the warm-up):
        choice.observe(step_ms, stall_ms)  # stall_ms: cad.exchange_times()'s "stall_ms" over the step
    """

    def __init__(self, min_stall_share=0.07):
        if not 0.0 <= float(min_stall_share) < 1.0:
            raise ValueError(f"PingPongChoice: min_stall_share must be in [0, 1), got {min_stall_share!r}")
        self.min_stall_share = float(min_stall_share)
        self.split = None  # None until observe(); then True or False for good
        self.reason = "undecided: no unsplit step observed yet"

    def observe(self, step_ms, stall_ms):
        """Decide from one unsplit step: its time and the exchanges' stall in it (ms; the slowest rank's, the
        same numbers on every rank so that every rank decides alike). Later calls change nothing."""
        if self.split is not None:
            return self.split
        share = stall_ms / step_ms if step_ms > 0 else 0.0
        self.split = share >= self.min_stall_share
        verdict = "on" if self.split else "off"
        self.reason = (f"ping-pong {verdict}: the exchanges stalled the step for {stall_ms:.1f} ms of {step_ms:.1f} ms "
                       f"({share:.1%}), {'at least' if self.split else 'under'} the {self.min_stall_share:.0%} that "
                       f"splitting into two nano-batches costs" + ("" if self.split else "; nothing worth hiding"))
        return self.split
