"""What a cad.Plan is tied to, on one process: its CAD stack (a plan kept across cad.init() or cad.shutdown() is
refused, never handed to the new stack), the documents cu_seqlens held when it was made (refilled in place:
refused), and one validation of cu_seqlens and of the tensors' devices for the local and the CAD path. Also where
a forward's tensors wait for the backward (keep_forward_tensors): never twice."""
import pytest
import torch

import cad
import cad.hf
from reference import random_batch, sdpa_varlen


@pytest.fixture(autouse=True)
def fresh_stacks():
    cad.init(timeout_ms=20000)
    yield
    cad.shutdown()


def test_plan_refused_after_its_stack_closed():
    q, k, v, cu = random_batch([5, 9], 2, 1, 8)
    for close in (lambda: cad.init(timeout_ms=20000), cad.shutdown):
        plan = cad.plan(cu)
        cad.varlen_attn(q, k, v, cu, plan=plan)  # made on the current stack
        close()
        with pytest.raises(cad.CadError, match=f"plan #{plan.id} was made on a CAD stack that .* closed"):
            cad.varlen_attn(q, k, v, cu, plan=plan)


def test_shutdown_forgets_what_init_chose():
    """A later stack is built from the defaults, not from the settings of an init that came before a shutdown
    (a test's deliberately bad cad.init once failed the next test file run in the same process)."""
    cpu = torch.device("cpu")
    default = cad.stack_config(cpu)
    cad.init(balancer="colocated", timeout_ms=1234, log_level="info")
    chosen = cad.stack_config(cpu)
    assert chosen != default and chosen["log_level"] == "info"
    assert {"name": "balancer", "plugin": "colocated", "config": {}} in chosen["instances"]
    cad.shutdown()
    assert cad.stack_config(cpu) == cad.Context().stack_config(cpu)  # a new context's: the defaults
    q, k, v, cu = random_batch([5, 9], 2, 1, 8)  # and a stack made now works
    torch.testing.assert_close(cad.varlen_attn(q, k, v, cu, causal=True), sdpa_varlen(q, k, v, cu, True), atol=2e-5,
                               rtol=1e-5)


def test_released_plan_refused():
    q, k, v, cu = random_batch([5, 9], 2, 1, 8)
    plan = cad.plan(cu)
    cad.varlen_attn(q, k, v, cu, plan=plan)
    plan.release()
    plan.release()  # twice: nothing happens
    with pytest.raises(cad.CadError, match="released"):
        cad.varlen_attn(q, k, v, cu, plan=plan)


def test_cu_seqlens_refilled_after_plan_refused():
    q, k, v, cu = random_batch([5, 9], 2, 1, 8)
    plan = cad.plan(cu)
    cu[1] = 7  # other documents, same tensor
    with pytest.raises(cad.CadError, match=r"cu_seqlens tensor of plan #\d+ holds other documents \(\[0, 7, 14\]\)"):
        cad.varlen_attn(q, k, v, cu, plan=plan)
    cu[1] = 5  # the planned documents again: the values decide, not the version counter
    torch.testing.assert_close(cad.varlen_attn(q, k, v, cu, plan=plan), sdpa_varlen(q, k, v, cu, True), atol=2e-5,
                               rtol=1e-5)


REFILLS = {  # ways to write other documents into cu_seqlens that torch's version counter does not see
    "data.copy_": lambda cu, new: cu.data.copy_(new),
    "numpy": lambda cu, new: cu.numpy().__setitem__(slice(None), new.numpy()),
}


@pytest.mark.parametrize("refill", sorted(REFILLS))
def test_documents_refilled_behind_the_version_counter_are_refused_by_a_plan(refill):
    q, k, v, cu = random_batch([5, 9], 2, 1, 8)
    plan = cad.plan(cu, num_heads=2, num_kv_heads=1, head_dim=8, dtype=q.dtype, device="cpu")
    cad.varlen_attn(q, k, v, cu, plan=plan)
    version = cu._version
    REFILLS[refill](cu, torch.tensor([0, 11, 14], dtype=torch.int32))
    assert cu._version == version  # the counter did not move: only the values can tell
    with pytest.raises(cad.CadError, match=r"holds other documents \(\[0, 11, 14\]\) than when cad.plan"):
        cad.varlen_attn(q, k, v, cu, plan=plan)
    copy = torch.tensor([0, 5, 14], dtype=torch.int32)  # the planned documents in another tensor: accepted
    torch.testing.assert_close(cad.varlen_attn(q, k, v, copy, plan=plan), sdpa_varlen(q, k, v, copy, True), atol=2e-5,
                               rtol=1e-5)
    REFILLS[refill](copy, torch.tensor([0, 11, 14], dtype=torch.int32))  # ... and refilled: its pieces are new
    with pytest.raises(cad.CadError, match="pieces differ from those plan #"):
        cad.varlen_attn(q, k, v, copy, plan=plan)


@pytest.mark.parametrize("refill", sorted(REFILLS))
def test_documents_refilled_behind_the_version_counter_are_read_again_locally(refill):
    q, k, v, cu = random_batch([5, 9], 2, 1, 8, seed=4)
    torch.testing.assert_close(cad.varlen_attn(q, k, v, cu), sdpa_varlen(q, k, v, cu, True), atol=2e-5, rtol=1e-5)
    REFILLS[refill](cu, torch.tensor([0, 11, 14], dtype=torch.int32))
    want = sdpa_varlen(q, k, v, torch.tensor([0, 11, 14]), True)
    torch.testing.assert_close(cad.varlen_attn(q, k, v, cu), want, atol=2e-5, rtol=1e-5)  # the new documents
    REFILLS[refill](cu, torch.tensor([0, 11, 15], dtype=torch.int32))  # ... and checked again: T is 14
    with pytest.raises(cad.CadError, match=r"cu_seqlens must rise from 0 to T = 14"):
        cad.varlen_attn(q, k, v, cu)


@pytest.mark.parametrize("bad, message", [
    (torch.tensor([2, 5, 14], dtype=torch.int32), "must start at 0"),
    (torch.tensor([0.0, 5.5, 14.0]), "1-D int32"),
    (torch.tensor([[0, 5, 14]], dtype=torch.int32), "1-D int32"),
    (torch.tensor([0, 9, 5, 14], dtype=torch.int32), "must not decrease"),
])
def test_one_cu_seqlens_check_for_both_paths(bad, message):
    q, k, v, _ = random_batch([5, 9], 2, 1, 8)
    with pytest.raises(cad.CadError, match=message):
        cad.varlen_attn(q, k, v, bad)
    with pytest.raises(cad.CadError, match=message):
        cad.plan(bad)


def test_tensors_on_other_devices_refused():
    q, k, v, cu = random_batch([5, 9], 2, 1, 8)
    for name, args in (("k", (q, k.to("meta"), v)), ("v", (q, k, v.to("meta")))):
        with pytest.raises(cad.CadError, match=f"{name} is on meta"):
            cad.varlen_attn(*args, cu)
    with pytest.raises(cad.CadError, match="meta device"):
        cad.varlen_attn(q.to("meta"), k.to("meta"), v.to("meta"), cu)


def _packed(keep, forward):
    """The tensors the autograd context of one CAD forward saves, with keep_forward_tensors=`keep`."""
    cad.init(keep_forward_tensors=keep, timeout_ms=20000)
    q, k, v, cu = random_batch([5, 9, 2], 4, 2, 8, seed=1)
    plan = cad.plan(cu)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        o = forward(leaves, cu, plan)
    o.backward(torch.ones_like(o))
    torch.testing.assert_close(o, sdpa_varlen(q, k, v, cu, True), rtol=1e-5, atol=2e-5)
    for t, leaf in zip((q, k, v), leaves):
        want = t.clone().requires_grad_()
        sdpa_varlen(*(want if x is t else x for x in (q, k, v)), cu, True).backward(torch.ones_like(o))
        torch.testing.assert_close(leaf.grad, want.grad, rtol=1e-5, atol=2e-5)
    return [t for t in packed if t.dim() == 3]


def _owns_memory(t):
    return any(s != 0 for s in t.stride())


def test_kept_on_servers_means_no_copy_in_the_autograd_context():
    packed = _packed(True, lambda l, cu, plan: cad.varlen_attn(*l, cu, plan=plan))
    assert len(packed) == 4 and not any(_owns_memory(t) for t in packed)  # q, k, v, o: stand-ins only


def test_re_sent_means_the_context_keeps_them_as_local_attention_does():
    for keep in (False, "auto"):  # auto: a forward outside any backward re-sends
        packed = _packed(keep, lambda l, cu, plan: cad.varlen_attn(*l, cu, plan=plan))
        assert len(packed) == 4 and all(_owns_memory(t) for t in packed)


def test_auto_keeps_a_recomputed_forward_on_the_servers():
    from torch.utils.checkpoint import checkpoint
    # Under checkpointing the context's tensors come from the recomputation inside the backward: with "auto"
    # that forward's tensors stay on the servers, and the context holds stand-ins.
    seen = []

    def attention(q, k, v, cu, plan):
        seen.append(torch._C._current_graph_task_id() != -1)  # before: a recomputation may stop after the op
        return cad.varlen_attn(q, k, v, cu, plan=plan)

    _packed("auto", lambda l, cu, plan: checkpoint(attention, *l, cu, plan, use_reentrant=False))
    assert seen == [False, True]  # the forward, then its recomputation inside the backward
    assert not cad.context().state()["saved"]  # every kept state went back after its backward


def test_a_second_backward_of_a_kept_forward_is_refused():
    # retain_graph=True lets autograd run a forward's backward twice; the servers' kept state served the first
    # and is gone, and the context holds only stand-ins: the second must be refused, not re-send stand-ins.
    cad.init(keep_forward_tensors=True, timeout_ms=20000)
    q, k, v, cu = random_batch([5, 9, 2], 4, 2, 8, seed=2)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = cad.varlen_attn(*leaves, cu, plan=cad.plan(cu))
    o.backward(torch.ones_like(o), retain_graph=True)
    with pytest.raises(cad.CadError, match="kept state of this forward .* is gone"):
        o.backward(torch.ones_like(o))


def test_keep_forward_tensors_takes_only_its_three_values():
    with pytest.raises(cad.CadError, match="keep_forward_tensors must be True, False or 'auto', got 'yes'"):
        cad.init(keep_forward_tensors="yes")


def test_a_copy_of_the_plans_cu_seqlens_is_read_back_once(monkeypatch):
    # FSDP2's root module moves every tensor of its forward's arguments to the GPU, so the attention calls get a
    # device copy of the plan's cu_seqlens: reading it back at every layer synchronised the host each time.
    from cad import _documents
    reads = []
    checked = _documents._checked
    monkeypatch.setattr(_documents, "_checked", lambda t, what: reads.append(what) or checked(t, what))
    q, k, v, cu = random_batch([5, 9, 3], 2, 1, 8)
    plan = cad.plan(cu)
    reads.clear()
    copy = cu.clone()
    outs = [cad.varlen_attn(q, k, v, copy, plan=plan) for _ in range(4)]  # four layers, one tensor
    assert len(reads) == 1
    own = cad.varlen_attn(q, k, v, cu, plan=plan)
    assert len(reads) == 1  # the plan's own tensor is never read again
    for out in outs:
        torch.testing.assert_close(out, own, rtol=0, atol=0)
    copy[1] = 7  # refilled in place: read again, and its other documents are refused by the plan
    with pytest.raises(cad.CadError, match="pieces differ from those plan #"):
        cad.varlen_attn(q, k, v, copy, plan=plan)
    assert len(reads) == 2


@pytest.mark.parametrize("refill", sorted(REFILLS))
def test_hf_documents_refilled_behind_the_version_counter_are_derived_again(refill):
    # cad.hf derives a micro-batch's documents once per position_ids tensor; refilled without the version counter
    # moving, the old documents were served (the attention then ran over the wrong documents, without a word).
    import types
    q, k, v, _ = random_batch([5, 9], 2, 1, 8, seed=6)
    module = types.SimpleNamespace(is_causal=True)
    positions = torch.cat([torch.arange(5), torch.arange(9)]).unsqueeze(0)

    def attend():
        out, _ = cad.hf.cad_local_attention(module, *(t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)), None,
                                            position_ids=positions)
        return out.reshape(q.shape)

    torch.testing.assert_close(attend(), sdpa_varlen(q, k, v, torch.tensor([0, 5, 14]), True), atol=2e-5, rtol=1e-5)
    REFILLS[refill](positions, torch.cat([torch.arange(11), torch.arange(3)]).unsqueeze(0))
    torch.testing.assert_close(attend(), sdpa_varlen(q, k, v, torch.tensor([0, 11, 14]), True), atol=2e-5, rtol=1e-5)
