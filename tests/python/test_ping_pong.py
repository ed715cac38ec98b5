"""cad.prepare_ping_pong's stream hand-over, with CUDA's streams and events stood in by recording fakes (this
machine has no GPU): a layer called from a second stream must wait for the point the first stream's call had
reached after the layer's other pre-hooks (FSDP2's weight copy-in); a call from the same stream must not."""
import sys

import pytest
import torch

import cad


class FakeStream:
    def __init__(self, name, log):
        self.name, self.log, self.device = name, log, torch.device("cuda", 0)

    def wait_event(self, event):
        self.log.append(("wait", self.name, event.recorded_on))


class FakeEvent:
    def __init__(self):
        self.recorded_on = None

    def record(self, stream):
        self.recorded_on = stream.name


def test_a_call_from_the_other_stream_waits_for_the_first_calls_pre_hooks(monkeypatch):
    log = []
    streams = {name: FakeStream(name, log) for name in ("nano0", "nano1")}
    current = ["nano0"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: streams[current[0]])
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)

    layer = torch.nn.Linear(4, 4)
    layer.register_forward_pre_hook(lambda m, args: log.append(("gather", current[0])))  # FSDP2's, registered first
    cad.prepare_ping_pong([layer])
    x = torch.ones(2, 4)
    for name in ("nano0", "nano1", "nano1", "nano0"):
        current[0] = name
        layer(x)
    assert log == [("gather", "nano0"),
                   ("gather", "nano1"), ("wait", "nano1", "nano0"),  # nano-batch 1 waits for 0's copy-in
                   ("gather", "nano1"),                              # the same stream: ordered already
                   ("gather", "nano0"), ("wait", "nano0", "nano1")]


def test_nothing_is_ordered_without_cuda():
    layer = torch.nn.Linear(4, 4)
    handles = cad.prepare_ping_pong([layer])
    assert len(handles) == 1
    torch.testing.assert_close(layer(torch.ones(2, 4)), torch.nn.functional.linear(torch.ones(2, 4), layer.weight,
                                                                                    layer.bias))


def test_what_is_not_a_module_is_refused_naming_it():
    with pytest.raises(cad.CadError, match=r"layers\[1\] must be a torch.nn.Module .* got function"):
        cad.prepare_ping_pong([torch.nn.Linear(2, 2), lambda x: x])


def test_every_ping_pong_on_a_device_runs_on_the_same_two_streams(monkeypatch):
    """The caching allocator keeps freed blocks per stream: fresh streams per call would strand every call's cache
    (and, with expandable segments, make the allocator synchronise the host when it releases it)."""
    made, used = [], []

    class CountingStream:
        def __init__(self, device=None, priority=0):
            self.device = torch.device("cuda", device if isinstance(device, int) else 0)
            made.append(self)

        def wait_stream(self, other):
            pass

    class UsingStream:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            used.append(self.stream)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(sys.modules["cad.ping_pong"], "_STREAMS", {})  # cad.ping_pong is the function
    monkeypatch.setattr(torch.cuda, "Stream", CountingStream)
    monkeypatch.setattr(torch.cuda, "stream", UsingStream)
    caller = CountingStream(0)
    made.clear()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: caller)
    stage = lambda state, i: state + [i]  # noqa: E731 -- states that are not tensors: nothing to record_stream
    for _ in range(3):
        states = cad.ping_pong([stage, stage], [[], []], device="cuda:0")
        assert states == [[0, 0], [1, 1]]
    assert len(made) == 2  # two streams for the process, not two per call
    assert used == [made[0], made[1]] * 6  # nano-batch i always on stream i
