"""cad.PingPongLayer and the nano-batch streams: a layer called once for both nano-batches (so that FSDP2's
per-call hooks run once per layer), each nano-batch on its own stream after the call's pre-hooks; CUDA's streams
and events are stood in by recording fakes (this machine has no GPU)."""
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


def _two_layers():
    torch.manual_seed(0)
    return [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]


def test_a_ping_pong_layer_is_one_call_of_its_hooks_and_computes_what_two_calls_would():
    """FSDP2's hooks (gather before, free and reduce after the backward) sit on the wrapped module: they must run
    once per layer for both nano-batches, with the same outputs and gradients as the layer called per nano-batch."""
    plain = _two_layers()
    wrapped = [cad.PingPongLayer(layer) for layer in _two_layers()]
    calls = []
    for i, layer in enumerate(wrapped):
        layer.register_forward_pre_hook(lambda m, args, kwargs, i=i: calls.append(i), with_kwargs=True)
    xs = [torch.randn(3, 4), torch.randn(5, 4)]
    expected = [plain[1](plain[0](x)) for x in xs]
    got = cad.ping_pong_layers(wrapped, xs)
    assert calls == [0, 1]  # one call per layer, not one per nano-batch
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)
    sum(e.square().sum() for e in expected).backward()
    sum(g.square().sum() for g in got).backward()
    for p, w in zip(plain, wrapped):
        torch.testing.assert_close(w.layer.weight.grad, p.weight.grad)
    # Not split: the layer as is, keywords and all.
    torch.testing.assert_close(wrapped[0](xs[0]), plain[0](xs[0]))


def test_both_nano_batch_streams_start_after_the_calls_pre_hooks(monkeypatch):
    """On CUDA (stood in by recording fakes): the layer's own pre-hooks (FSDP2's weight copy-in) run once on the
    calling stream; each nano-batch stream waits for that point, then runs its nano-batch."""
    log = []
    streams = {name: FakeStream(name, log) for name in ("caller", "nano0", "nano1")}
    current = ["caller"]

    class OnStream:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            self.before, current[0] = current[0], self.stream.name

        def __exit__(self, *exc):
            current[0] = self.before
            return False

    module = sys.modules["cad.ping_pong"]  # cad.ping_pong is the function
    monkeypatch.setattr(module, "_device_of", lambda states, device: torch.device("cuda", 0))
    monkeypatch.setattr(module, "nano_batch_streams", lambda device, context=None: (streams["nano0"], streams["nano1"]))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: streams[current[0]])
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "stream", OnStream)

    class Logging(torch.nn.Module):
        def forward(self, x, tag):
            log.append(("run", tag, current[0]))
            return x

    layer = cad.PingPongLayer(Logging())
    layer.register_forward_pre_hook(lambda m, args, kwargs: log.append(("gather", current[0])), with_kwargs=True)
    outs = layer(nano_batches=(((1,), {"tag": "a"}), ((2,), {"tag": "b"})))
    assert outs == (1, 2)
    assert log == [("gather", "caller"),
                   ("wait", "nano0", "caller"), ("run", "a", "nano0"),
                   ("wait", "nano1", "caller"), ("run", "b", "nano1")]


def test_misuse_is_refused_naming_what_was_expected():
    with pytest.raises(cad.CadError, match=r"layer must be a torch.nn.Module, got function"):
        cad.PingPongLayer(lambda x: x)
    layer = cad.PingPongLayer(torch.nn.Linear(2, 2))
    x = torch.ones(1, 2)
    with pytest.raises(cad.CadError, match=r"nano_batches must be two \(args, kwargs\) pairs"):
        layer(nano_batches=(((x,), {}),))
    with pytest.raises(cad.CadError, match=r"pass each nano-batch's arguments inside it"):
        layer(x, nano_batches=(((x,), {}), ((x,), {})))
    with pytest.raises(cad.CadError, match=r"layers\[1\] must be a cad.PingPongLayer, got Linear"):
        cad.ping_pong_layers([layer, torch.nn.Linear(2, 2)], [x, x])


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

    monkeypatch.setattr(torch.cuda, "Stream", CountingStream)
    monkeypatch.setattr(torch.cuda, "stream", UsingStream)
    caller = CountingStream(0)
    made.clear()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: caller)
    stage = lambda state, i: state + [i]  # noqa: E731 -- states that are not tensors: nothing to record_stream
    context = cad.Context()  # the streams are a context's (no module holds them): a fresh one makes its own
    for _ in range(3):
        states = cad.ping_pong([stage, stage], [[], []], device="cuda:0", context=context)
        assert states == [[0, 0], [1, 1]]
    assert len(made) == 2  # two streams for the context, not two per call
    assert used == [made[0], made[1]] * 6  # nano-batch i always on stream i
    assert sys.modules["cad.ping_pong"].nano_batch_streams("cuda:0", context) == (made[0], made[1])
    other = cad.Context()
    assert sys.modules["cad.ping_pong"].nano_batch_streams("cuda:0", other) == tuple(made[2:4])  # another context: its own two
    context.close()
    other.close()
