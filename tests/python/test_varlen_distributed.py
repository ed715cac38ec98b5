"""cad.varlen_attn through CAD (plans) on 2 and 3 CPU processes under a gloo group ("host" communicator:
torch.distributed lent through the ABI), against torch sdpa per document; bad input fails on every rank."""
import pytest
import torch

import harness
from reference import random_batch, sdpa_varlen

# Per rank: very unequal documents, so the balancer moves work between ranks.
LENGTHS = [[40, 3, 1], [5, 6, 7, 8], [1, 29]]


def _check_rank(rank, world, causal, hq, hkv, balancer, keep):
    import cad
    cad.init(balancer=balancer, keep_forward_tensors=keep, timeout_ms=20000)
    q, k, v, cu = random_batch(LENGTHS[rank], hq, hkv, 16, seed=rank)
    d_o = torch.randn(q.shape, generator=torch.Generator().manual_seed(100 + rank))
    plan = cad.plan(cu, causal=causal)
    results = []
    for fn in (lambda q, k, v: cad.varlen_attn(q, k, v, cu, plan=plan, causal=causal),
               lambda q, k, v: sdpa_varlen(q, k, v, cu, causal)):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = fn(*leaves)
        o.backward(d_o)
        results.append([o.detach()] + [t.grad for t in leaves])
    for name, a, b in zip(("o", "dq", "dk", "dv"), *results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5, msg=lambda m: f"rank {rank} {name}: {m}")
    stats = plan.stats
    assert stats is not None and len(stats["servers"]) == world and stats["imbalance"] >= 1.0
    if balancer == "prefix_aware" and world > 1:
        # the colocated cost of these ranks is far from even; the balanced plan is near 1
        assert stats["imbalance"] < 1.5, stats


def _check_both_masks(rank, world, hq, hkv, balancer, keep):
    for causal in (True, False):
        _check_rank(rank, world, causal, hq, hkv, balancer, keep)


@pytest.mark.parametrize("world", [2, 3])
def test_cad_matches_sdpa(world):
    harness.run(world, _check_both_masks, 4, 2, "prefix_aware", True)


def test_cad_resend_mode_and_other_balancer():
    harness.run(2, _check_rank, True, 2, 2, "distca", False)


def _one_plan_many_layers(rank, world):
    import cad
    q, k, v, cu = random_batch(LENGTHS[rank], 2, 1, 16, seed=rank)
    plan = cad.plan(cu)
    layers = [[t.detach().clone().requires_grad_() for t in (q, k, v)] for _ in range(3)]
    outs = [cad.varlen_attn(*l, cu, plan=plan) for l in layers]  # three forwards in flight on one plan
    for o in reversed(outs):
        o.sum().backward()
    want = sdpa_varlen(q, k, v, cu, True)
    for o in outs:
        torch.testing.assert_close(o, want, rtol=1e-5, atol=2e-5)


def test_one_plan_serves_every_layer():
    harness.run(2, _one_plan_many_layers)


def _bad_inputs(rank, world):
    # After a refused call (agreed on every rank) the stack stays usable: one process pair serves all kinds.
    for kind in ("dtype", "layout", "cu_seqlens", "other_plan"):
        _bad_input(rank, world, kind)


def _bad_input(rank, world, kind):
    import cad
    q, k, v, cu = random_batch(LENGTHS[rank], 2, 2, 16, seed=rank)
    plan = cad.plan(cu)
    cad.varlen_attn(q, k, v, cu, plan=plan)  # a good call first: the plan is made on every rank
    if rank == 1:  # one rank goes wrong; every rank must raise
        if kind == "dtype":
            q, k, v = q.double(), k.double(), v.double()
        elif kind == "layout":
            q = q.transpose(1, 2).contiguous().transpose(1, 2)
        elif kind == "cu_seqlens":
            cu = cu.clone()
            cu[-1] -= 1
        elif kind == "other_plan":
            plan = cad.plan_pieces([(1 << 40, len(q), 0, len(q))])
            plan.make(2, 2, 16, torch.float32, "cpu")
    elif kind == "other_plan":
        other = cad.plan(cu)  # the other ranks make a plan too (make_plan is collective)
        other.make(2, 2, 16, torch.float32, "cpu")
    with pytest.raises(cad.CadError) as info:
        cad.varlen_attn(q, k, v, cu, plan=plan)
    message = str(info.value)
    assert "rank 1" in message, f"{kind}: {message}"
    if kind == "dtype":  # the plugin's one check against the plan names the tensor and the plan, on every rank
        assert "tensor 'q': expected dtype fp32 (as plan #" in message, message
    print(f"rank {rank} {kind}: {message}")


def test_bad_input_fails_on_every_rank():
    harness.run(2, _bad_inputs, timeout_s=120)


def _peer_missing(rank, world):
    import time
    import cad
    cad.init(timeout_ms=1500)  # as test_plan_ahead's stall: the peer outlasts it by 3.5 s
    q, k, v, cu = random_batch(LENGTHS[rank], 2, 2, 16, seed=rank)
    plan = cad.plan(cu, num_heads=2, num_kv_heads=2, head_dim=16, dtype=torch.float32, device="cpu")
    if rank == 0:
        start = time.monotonic()
        with pytest.raises(cad.CadError, match="TIMEOUT") as info:
            cad.varlen_attn(q, k, v, cu, plan=plan)
        assert time.monotonic() - start < 30
        print(info.value)
    else:
        time.sleep(5)  # never joins: rank 0 must time out, not hang


def test_missing_peer_times_out():
    harness.run(2, _peer_missing, timeout_s=60)


def _ping_pong(rank, world, lanes=1):
    import cad
    nanos = [random_batch(LENGTHS[rank][:1] + [3], 2, 1, 16, seed=10 * rank + i) for i in (0, 1)]
    plans = [cad.plan(cu, lane=i % lanes) for i, (_, _, _, cu) in enumerate(nanos)]
    layers = 3

    def stage(state, i):  # one "layer": attention of nano-batch i through its own plan, then a residual
        _, k, v, cu = nanos[i]
        return state + cad.varlen_attn(state, k, v, cu, plan=plans[i])

    states = [q.clone().requires_grad_() for q, _, _, _ in nanos]
    out = cad.ping_pong([stage] * layers, states)
    (out[0].sum() + out[1].sum()).backward()
    for i, (q, k, v, cu) in enumerate(nanos):
        want = q
        for _ in range(layers):
            want = want + sdpa_varlen(want, k, v, cu, True)
        torch.testing.assert_close(out[i], want, rtol=1e-5, atol=1e-5)
        assert states[i].grad is not None and torch.isfinite(states[i].grad).all()
    # Each lane ran on a stack of its own (its own communicator): two lanes, two stacks; one lane, one.
    stacks = [cad.context().lane(lane).existing("cpu") for lane in (0, 1)]
    assert [p.lane.index for p in plans] == [0, 1 % lanes] and all(p.lane.context is cad.context() for p in plans)
    assert all(p.host("cpu") is stacks[p.lane.index] for p in plans)
    assert (stacks[1] is not None and stacks[1] is not stacks[0]) == (lanes == 2)


def test_ping_pong_two_nano_batches_with_their_own_plans_on_two_lanes():
    # Both on one lane: the trainer's --ping-pong-lanes 1 (tests/python/test_trainer.py), to keep CI short.
    harness.run(2, _ping_pong, 2)


def _lanes_ahead(rank, world):
    # Plans made ahead on two lanes (each lane's own planning thread), used in the other order than made: a
    # lane's plans pair only with the same lane's on the other ranks, so the results are each plan's own.
    import cad
    batches = [random_batch(LENGTHS[rank][i:] or [5], 2, 2, 16, seed=7 * rank + i) for i in range(3)]
    plans = [cad.plan(cu, num_heads=2, num_kv_heads=2, head_dim=16, dtype=torch.float32, device="cpu", ahead=True,
                      tag=i, lane=i % 2) for i, (_, _, _, cu) in enumerate(batches)]
    for i in (2, 1, 0):
        q, k, v, cu = batches[i]
        torch.testing.assert_close(cad.varlen_attn(q, k, v, cu, plan=plans[i]), sdpa_varlen(q, k, v, cu, True),
                                   rtol=1e-5, atol=2e-5)
    assert [p.lane.index for p in plans] == [0, 1, 0] and plans[0].host("cpu") is not plans[1].host("cpu")


def test_plans_made_ahead_on_two_lanes():
    harness.run(2, _lanes_ahead)


@pytest.mark.parametrize("lane", [-1, 4, True, 1.0])
def test_a_lane_out_of_range_is_refused(lane):
    import cad
    with pytest.raises(cad.CadError, match=r"lane must be an int( in \[0, 3\])?, got"):
        cad.plan(torch.tensor([0, 4], dtype=torch.int32), lane=lane)


def _empty_rank(rank, world):
    # Rank 1 holds no tokens this step (e.g. an empty nano-batch): its tensors are [0, H, D] and [H, 0],
    # the latter with PyTorch's strides (1, 1); CAD must plan and run around it, and rank 0's result must
    # equal sdpa's.
    import cad
    cad.init(balancer="prefix_aware", timeout_ms=20000)
    lengths = [[40, 3, 1], []][rank]
    q, k, v, cu = random_batch(lengths, 2, 1, 16, seed=rank)
    plan = cad.plan(cu)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = cad.varlen_attn(*leaves, cu, plan=plan)
    o.sum().backward()
    assert o.shape == q.shape
    if rank == 0:
        want = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        ref = sdpa_varlen(*want, cu, True)
        ref.sum().backward()
        torch.testing.assert_close(o, ref, rtol=1e-5, atol=2e-5)
        for a, b in zip(leaves, want):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=2e-5)
    else:
        assert all(t.grad is not None and t.grad.numel() == 0 for t in leaves)


def test_a_rank_without_tokens():
    harness.run(2, _empty_rank)


def _disjoint_groups(rank, world):
    # Two CAD stacks at once on 4 ranks, one per half (as a pipeline's stages each balance over their own
    # data-parallel ranks): {0, 1} and {2, 3}, each made at the same point. Each half's gloo groups must be its
    # own -- torch names a group made by every rank from a counter, so without local synchronisation both halves'
    # groups got the same name and met in the same store keys (a hang) -- and each half's results equal sdpa's.
    import torch.distributed as dist
    import cad
    halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = halves[rank // 2]
    cad.init(balancer="prefix_aware", timeout_ms=20000, group=mine)
    for round_ in range(2):
        q, k, v, cu = random_batch([[40, 3, 1], [5, 6], [30, 2], [9, 9, 9]][rank], 2, 1, 16, seed=10 * round_ + rank)
        plan = cad.plan(cu, ahead=True, tag=round_, num_heads=2, num_kv_heads=1, head_dim=16, dtype=torch.float32,
                        device="cpu")
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = cad.varlen_attn(*leaves, cu, plan=plan)
        o.sum().backward()
        want = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        ref = sdpa_varlen(*want, cu, True)
        ref.sum().backward()
        torch.testing.assert_close(o, ref, rtol=1e-5, atol=2e-5)
        for a, b in zip(leaves, want):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=2e-5)
        assert len(plan.stats["servers"]) == 2
    collectives = cad.context().lane(0).existing(torch.device("cpu")).collectives
    names = [None] * world
    dist.all_gather_object(names, (collectives.group.group_name, collectives.planning_group.group_name))
    assert names[0] == names[1] and names[2] == names[3], names
    assert not set(names[0]) & set(names[2]), names  # the halves' groups are different groups


def test_disjoint_groups_each_with_a_cad_stack():
    harness.run(4, _disjoint_groups, timeout_s=120)
