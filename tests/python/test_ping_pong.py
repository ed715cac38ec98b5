"""cad.prepare_ping_pong's stream hand-over, with CUDA's streams and events stood in by recording fakes (this
machine has no GPU): a layer called from a second stream must wait for the point the first stream's call had
reached after the layer's other pre-hooks (FSDP2's weight copy-in); a call from the same stream must not."""
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
