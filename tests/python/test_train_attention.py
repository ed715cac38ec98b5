"""cad.train.attention: --attention fa4 (FlashAttention-4 through cad.fa4, imported only when chosen) is refused
with cad.fa4's reason where it cannot run, and where it can its transformers attention function hands
cad.fa4.varlen_attn the THD tensors, documents, longest document and window that give cad_local's loss and
gradients; choosing another attention never imports cad.fa4. The FlashAttention-4 kernels need a GPU: here
cad.fa4 is a stand-in module (monkeypatched into sys.modules) that computes with cad.varlen_attn."""
import sys
import types

import pytest
import torch

import cad
from cad.train import attention
from cad.train.batches import make_inputs, make_nanos
from cad.train.llama import train_one
from cad.train.llama_args import parse_args
from cad.train.model import MicroBatchLoss, build_model

TINY = ["--layers", "2", "--hidden", "64", "--intermediate", "96", "--context", "64"]


def _stand_in(available=(True, ""), calls=None):
    """A cad.fa4 with cad.fa4's interface: available(device) -> (bool, reason) and varlen_attn(q, k, v,
    cu_seqlens, max_seqlen, causal, window_size, softmax_scale) -> o, here cad.varlen_attn (local, autograd)."""
    def varlen_attn(q, k, v, cu_seqlens, max_seqlen, causal=True, window_size=(-1, -1), softmax_scale=None):
        assert q.dim() == k.dim() == v.dim() == 3 and q.shape[0] == k.shape[0] == int(cu_seqlens[-1])
        assert max_seqlen == int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        if calls is not None:
            calls.append((tuple(q.shape), tuple(k.shape), causal, tuple(window_size), softmax_scale))
        return cad.varlen_attn(q, k, v, cu_seqlens, causal=causal, window_size=window_size,
                               softmax_scale=softmax_scale)
    return types.SimpleNamespace(available=lambda device=None: available, varlen_attn=varlen_attn)


def test_refused_with_the_reason_where_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "cad.fa4", _stand_in(available=(False, "needs an sm_100 GPU (found none)")))
    assert attention.fa4_unavailable(torch.device("cpu")) == \
        "--attention fa4: FlashAttention-4 is not available here: needs an sm_100 GPU (found none)"
    args = parse_args(["--attention", "fa4", *TINY])
    with pytest.raises(cad.CadError, match="needs an sm_100 GPU"):
        train_one(args, 0, 1, torch.device("cpu"), [])  # refused before anything is built


def test_refused_where_cad_has_no_fa4(monkeypatch):
    monkeypatch.setitem(sys.modules, "cad.fa4", None)  # import cad.fa4 raises ImportError
    reason = attention.fa4_unavailable(torch.device("cpu"))
    assert reason.startswith("--attention fa4: this cad package has no FlashAttention-4 binding")


def test_fa4_is_imported_only_when_chosen(monkeypatch):
    monkeypatch.delitem(sys.modules, "cad.fa4", raising=False)
    args = parse_args(["--attention", "local", *TINY])
    build_model(args, torch.device("cpu"), torch.float32)
    assert "cad.fa4" not in sys.modules
    assert parse_args(["--configs", "local,fa4", *TINY]).configs == "local,fa4"


def _one_micro_batch(args, choice, docs):
    args.attention = choice
    cpu = torch.device("cpu")
    lm = build_model(args, cpu, torch.float32)
    loss = MicroBatchLoss(lm, loss_chunk=16)(**make_inputs(docs, args.vocab, 5, cpu),
                                             nanos=make_nanos([docs], choice, args, cpu, torch.float32))
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in lm.parameters()]


@pytest.mark.parametrize("window", [[], ["--window", "3", "--global-every", "2"]], ids=["causal", "windowed"])
def test_fa4_trains_as_cad_local(monkeypatch, window):
    calls = []
    monkeypatch.setitem(sys.modules, "cad.fa4", _stand_in(calls=calls))
    args = parse_args([*TINY, *window])
    docs = [20, 7, 30, 7]
    attention.AttentionClock.take()
    loss_a, grads_a = _one_micro_batch(args, "fa4", docs)
    assert attention.AttentionClock.take() > 0
    loss_b, grads_b = _one_micro_batch(args, "local", docs)
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    heads, kv_heads, dim = args.heads, args.kv_heads, args.hidden // args.heads
    windows = [(3, 0), (-1, -1)] if window else [(-1, -1), (-1, -1)]
    assert [c[:4] for c in calls] == [((64, heads, dim), (64, kv_heads, dim), True, w) for w in windows]


def test_refused_by_the_package_binding_on_the_cpu():
    """The package's own cad.fa4 says why FlashAttention-4 cannot run on the CPU, and the trainer refuses with it."""
    fa4 = pytest.importorskip("cad.fa4")
    ok, why = fa4.available(torch.device("cpu"))
    assert not ok and why
    assert attention.fa4_unavailable(torch.device("cpu")).endswith(why)
    with pytest.raises(cad.CadError, match="--attention fa4: FlashAttention-4 is not available here"):
        train_one(parse_args(["--attention", "fa4", *TINY]), 0, 1, torch.device("cpu"), [])
