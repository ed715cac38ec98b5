"""The ping-pong schedule: two nano-batches, each with its own plan, interleaved stage by stage on two CUDA
streams, so that while one nano-batch's attention traffic is in flight the other's compute runs.

This is only the host-side schedule: the CAD plugin's CUDA data path does the rest (each call only enqueues;
its communication runs on the plugin's communication stream and joins the caller's stream with events).
Autograd replays each op on the stream it ran on, so the backward interleaves the same way. On CPU (or with
one stream) the stages simply run in order.
"""
import torch

from ._errors import CadError


def ping_pong(stages, states, *, device=None):
    """Run every stage on both nano-batches, alternating: for stage in stages: for i in (0, 1):
    states[i] = stage(states[i], i), nano-batch i on CUDA stream i. Returns the final states, ordered after
    both streams on the current stream.

    stages: callables (state, index) -> state, e.g. one per transformer layer, each calling
    cad.varlen_attn(..., plan=plans[index]); states: the two nano-batches' inputs (e.g. hidden states).
    """
    states = list(states)
    if len(states) != 2:
        raise ValueError(f"cad.ping_pong: expected two nano-batch states, got {len(states)}")
    if device is None:
        first = next((s for s in states if isinstance(s, torch.Tensor)), None)
        device = first.device if first is not None else torch.device("cpu")
    device = torch.device(device)
    if device.type != "cuda":
        for stage in stages:
            for i in (0, 1):
                states[i] = stage(states[i], i)
        return states
    caller = torch.cuda.current_stream(device)
    streams = nano_batch_streams(device)
    for s in streams:
        s.wait_stream(caller)  # inputs were produced on the caller's stream
    for stage in stages:
        for i in (0, 1):
            with torch.cuda.stream(streams[i]):
                states[i] = stage(states[i], i)
    for i in (0, 1):
        caller.wait_stream(streams[i])
        if isinstance(states[i], torch.Tensor):
            states[i].record_stream(caller)  # its memory is used on the caller's stream from here on
    return states


# device index -> its two nano-batch streams, made at the first ping_pong on that device and kept for the process.
_STREAMS = {}


def nano_batch_streams(device):
    """The two CUDA streams ping_pong runs nano-batches 0 and 1 on: the same two at every call on a device.

    Why not fresh streams per call: the caching allocator keeps a freed block for the stream it was allocated on,
    and torch.cuda.Stream() hands out the next stream of a pool of 32. Fresh streams per micro-batch left each
    step's activations cached for streams no later step used, so memory filled with stranded blocks until an
    allocation failed and the allocator released its cache; with expandable segments that release synchronises
    the host on every segment's stream (a +pp step on 2 H200s: the main thread sat hundreds of ms inside single
    small ops, in short cudaStreamSynchronize calls, while the peer's exchange kernel waited for it)."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _STREAMS:
        _STREAMS[index] = (torch.cuda.Stream(index), torch.cuda.Stream(index))
    return _STREAMS[index]


def prepare_ping_pong(layers):
    """Make layers that gather their weights in a forward pre-hook safe to run on both nano-batch streams; call
    once, after wrapping them (FSDP2's fully_shard). Returns the hook handles.

    FSDP2 gathers a layer's weights when it is first called and copies them into place on the calling stream:
    nano-batch 0's. Nano-batch 1's call, on the other stream, finds them gathered and reads them at once, with
    nothing ordering it after that copy. Every layer's CAD call used to synchronise the host (a cu_seqlens
    read-back), which hid this; without it, the read raced the copy (a NaN loss on 2 H200s). The hook added
    here runs after the layer's own pre-hooks: it records where the calling stream stands and makes a call
    from another stream wait there -- for those hooks' work, not the other nano-batch's compute."""
    layers = list(layers)
    for i, layer in enumerate(layers):
        if not isinstance(layer, torch.nn.Module):
            raise CadError(f"cad.prepare_ping_pong: layers[{i}] must be a torch.nn.Module (a layer its stages call), "
                           f"got {type(layer).__name__}", "INVALID_ARGUMENT")
    return [layer.register_forward_pre_hook(_StreamHandOver(), with_kwargs=True) for layer in layers]


class _StreamHandOver:
    """A layer's forward pre-hook: a call on another stream than the previous one waits for the point the
    previous call had reached after its pre-hooks (CUDA only; elsewhere nothing to order)."""

    def __init__(self):
        self.event, self.stream = None, None

    def __call__(self, module, args, kwargs):
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        stream = torch.cuda.current_stream()
        if self.event is not None and self.stream != stream and self.stream.device == stream.device:
            stream.wait_event(self.event)
        self.event, self.stream = torch.cuda.Event(), stream
        self.event.record(stream)
        return None


class PingPongChoice:
    """Whether splitting micro-batches into two nano-batches pays, decided from a measured step instead of
    assumed: ping-pong can hide at most the time the calling streams stall on CAD's exchanges, and splitting
    costs compute efficiency (smaller kernels, two streams; measured on 2 H200s at 64K-128K tokens per GPU:
    6-7% of the step, docs/multi_gpu.md). So a trainer runs unsplit, gives one unsplit step's time and stall to
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
