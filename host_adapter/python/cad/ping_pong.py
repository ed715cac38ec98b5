"""The ping-pong schedule: two nano-batches, each with its own plan, interleaved stage by stage on two CUDA
streams, so that while one nano-batch's attention traffic is in flight the other's compute runs.

This is only the host-side schedule: the CAD plugin's CUDA data path does the rest (each call only enqueues;
its communication runs on the plugin's communication stream and joins the caller's stream with events).
Autograd replays each op on the stream it ran on, so the backward interleaves the same way. On CPU (or with
one stream) the stages simply run in order.
"""
import torch


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
    streams = [torch.cuda.Stream(device), torch.cuda.Stream(device)]
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
