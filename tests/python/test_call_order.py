"""cad.CallOrder on one process (a CAD stack of one rank): the calls of a tick made in the order it lists, this
rank's own from its layers and the others' made for them over zero tokens; a call that comes out of order, or
never, is refused naming both calls; the state kept for another rank's backward goes to that plan's backward,
the last layer's first. The order across ranks (1F1B pipelines) is tested by test_pipeline.py."""
import pytest
import torch

import cad
from reference import random_batch, sdpa_varlen

HEADS, KV_HEADS, DIM = 2, 1, 8


@pytest.fixture(autouse=True)
def fresh_stacks():
    cad.init(timeout_ms=20000)
    yield
    cad.shutdown()


def _plan(lengths):
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return cad.plan(cu, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=DIM, dtype=torch.float32,
                    device="cpu"), cu


def test_own_calls_between_calls_made_for_others_compute_as_without_an_order():
    q, k, v, cu = random_batch([5, 9], HEADS, KV_HEADS, DIM)
    mine, _ = _plan([5, 9])
    mine_cu = mine.cu_seqlens
    other, _ = _plan([])  # another stage's micro-batch: no token of this rank's
    calls = cad.attention_calls()
    q.requires_grad_(True)
    with cad.CallOrder([("forward", other, False), ("forward", mine, True), ("backward", other, False)], 2) as order:
        x = q
        for _ in range(2):  # two layers: each makes the slot's three calls
            x = cad.varlen_attn(x, k, v, mine_cu, plan=mine)
    assert order._position == 6
    assert cad.attention_calls() - calls == 6
    expected = sdpa_varlen(sdpa_varlen(q.detach(), k, v, cu, True), k, v, cu, True)
    torch.testing.assert_close(x.detach(), expected, rtol=1e-5, atol=1e-5)


def test_a_call_out_of_order_is_refused_naming_both():
    q, k, v, cu = random_batch([5, 9], HEADS, KV_HEADS, DIM)
    first, _ = _plan([5, 9])
    second, _ = _plan([5, 9])
    with pytest.raises(cad.CadError, match=f"call 0 of this tick is the forward call of plan #{first.id} by the "
                                           f"order every rank follows, but this rank's layers made the forward "
                                           f"call of plan #{second.id}"):
        with cad.CallOrder([("forward", first, True), ("forward", second, True)], 1):
            cad.varlen_attn(q, k, v, cu, plan=second)
    assert cad.context().state()["call_order"] is None  # the failed tick's order is gone: the next tick can start


def test_an_own_call_that_never_comes_is_refused():
    mine, _ = _plan([5, 9])
    with pytest.raises(cad.CadError, match=f"call 0 of this tick is this rank's own \\(the forward call of plan "
                                           f"#{mine.id}\\) and its layers never made it"):
        with cad.CallOrder([("forward", mine, True)], 1):
            pass
    with pytest.raises(cad.CadError, match="direction must be 'forward' or 'backward'"):
        cad.CallOrder([("sideways", mine, True)], 1)


def test_state_kept_for_another_ranks_backward_goes_to_it_last_layer_first():
    """keep_forward_tensors=True: a forward made for another rank keeps the servers' state, per layer, until the
    plan's backward calls, which take the last layer's first; at the end of that tick nothing is left."""
    cad.init(timeout_ms=20000, keep_forward_tensors=True)
    other, _ = _plan([])
    with cad.CallOrder([("forward", other, False)], 3):
        pass  # an idle rank: every call made for the other
    state = cad.context().state()
    kept = state["served"][other.id]
    assert len(kept) == 3 and all(state["saved"][k] for k in kept)
    with cad.CallOrder([("backward", other, False)], 1) as order:
        order.serve_rest()
        state = cad.context().state()
        assert state["served"][other.id] == kept[:2]  # the last layer's went first
        assert kept[2] not in state["saved"]
    state = cad.context().state()
    assert other.id not in state["served"] and not any(k in state["saved"] for k in kept)  # the rest at the end


def test_for_tick_lists_the_stages_calls_in_stage_order():
    """A 1F1B tick, stage 0 backward of micro-batch 0 and stage 1 forward of micro-batch 1, seen from stage 1: with
    recomputation stage 0's recomputed forward and backward, then stage 1's forward; stage 2 idle adds nothing."""
    plans = {(0, 0): _plan([])[0], (1, 1): _plan([5, 9])[0]}
    ops = [("backward", 0), ("forward", 1), None]
    order = cad.CallOrder.for_tick(ops, 1, plans, 3, recomputes=True)
    first, second = plans[(0, 0)].id, plans[(1, 1)].id
    assert [(d, p.id, mine) for d, p, mine in order.slot] == [
        ("forward", first, False), ("backward", first, False), ("forward", second, True)]
    assert order.repeats == 3
    order = cad.CallOrder.for_tick(ops, 0, plans, 1, recomputes=False)
    assert [(d, mine) for d, _, mine in order.slot] == [("backward", True), ("forward", False)]
    with pytest.raises(cad.CadError, match=r"stage 1 runs the forward of micro-batch 2 but `plans` has no plan for "
                                           r"\(micro-batch 2, stage 1\)"):
        cad.CallOrder.for_tick([None, ("forward", 2)], 0, plans, 1, recomputes=False)


@pytest.mark.parametrize("slot, repeats, expected", [
    ([("forward", None, True)], 1, r"slot\[0\]: plan must be a cad.Plan, got NoneType"),
    ([("forward", "PLAN", True), ("forward", "plan #1", False)], 1, r"slot\[1\]: plan must be a cad.Plan, got str"),
    ([("forward", "PLAN", True)], "2", r"repeats must be an int, got str '2'"),
    ([("forward", "PLAN", True)], 1.5, r"repeats must be an int, got float 1.5"),
    ([("forward", "PLAN", True)], -1, r"repeats must be an int in \[0, "),
    ([("forward", "PLAN", True)], 2 ** 64, r"repeats must be an int in \[0, 9223372036854775807\], got 1844674"),
    ([("forward", "PLAN", True), ("forward", "PLAN")], 1, r"slot\[1\] must be \(direction, plan, mine\), got \("),
    ([("forward", "PLAN", True), 7], 1, r"slot\[1\] must be \(direction, plan, mine\), got 7"),
    ([("forward", "PLAN", "yes")], 1, r"slot\[0\]: mine must be True or False, got 'yes'"),
    (None, 1, r"slot must be a list of \(direction, plan, mine\) entries, got NoneType"),
])
def test_bad_entries_are_refused_at_construction_naming_the_entry_and_argument(slot, repeats, expected):
    mine, _ = _plan([5, 9])
    if slot is not None:
        slot = [tuple(mine if x == "PLAN" else x for x in e) if isinstance(e, tuple) else e for e in slot]
    with pytest.raises(cad.CadError, match=expected):
        cad.CallOrder(slot, repeats)


def test_one_orders_plans_belong_to_one_context():
    mine, _ = _plan([5, 9])
    with cad.Context(timeout_ms=20000) as other:
        theirs = other.plan(mine.cu_seqlens, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=DIM,
                            dtype=torch.float32, device="cpu")
        with pytest.raises(cad.CadError, match=r"the slot's plans belong to 2 contexts"):
            cad.CallOrder([("forward", mine, True), ("forward", theirs, True)], 1)
