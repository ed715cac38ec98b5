"""Plans made ahead (cad.plan(..., ahead=True)): made on the stack's planning thread while the caller goes on,
with their collectives on a gloo group of their own, so that they never interleave with the training thread's
exchanges. Checked on 2 CPU processes: results equal sdpa's while a plan is made during another micro-batch's
forward and backward; a late rank delays only the wait for its plan, not the call that asks; plans asked for in
a different order, or by one rank only, end with a CadError naming the ranks, tags and plan on every rank
instead of a hang; a plan dropped before it was made is released; closing the stack with plans queued ends."""
import gc
import time

import pytest
import torch

import harness
from reference import random_batch, sdpa_varlen

LENGTHS = [[40, 3, 1], [5, 6, 7, 8]]
SHAPE = dict(num_heads=2, num_kv_heads=1, head_dim=16, dtype=torch.float32, device="cpu")


def _micro_batch(rank, i):
    lengths = LENGTHS[rank] if i % 2 == 0 else list(reversed(LENGTHS[rank]))
    return random_batch(lengths, 2, 1, 16, seed=10 * rank + i)


def _check(q, k, v, cu, plan, d_o):
    import cad
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = cad.varlen_attn(*leaves, cu, plan=plan)
    o.backward(d_o)
    ref = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    want = sdpa_varlen(*ref, cu, True)
    want.backward(d_o)
    for name, a, b in zip(("o", "dq", "dk", "dv"), [o] + [t.grad for t in leaves], [want] + [t.grad for t in ref]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5, msg=lambda m: f"{name}: {m}")


def _pipelined(rank, world):
    """The trainer's pattern: micro-batch i+1's plan is asked for, then micro-batch i computes (its exchanges on
    the data group while the planning thread gathers on its own)."""
    import cad
    batches = [_micro_batch(rank, i) for i in range(4)]
    plans = [cad.plan(batches[0][3], ahead=True, tag=0, **SHAPE)]
    before = cad.context().makes
    for i, (q, k, v, cu) in enumerate(batches):
        if i + 1 < len(batches):
            plans.append(cad.plan(batches[i + 1][3], ahead=True, tag=i + 1, **SHAPE))
        _check(q, k, v, cu, plans[i], torch.randn(q.shape, generator=torch.Generator().manual_seed(i)))
        assert plans[i].ready and plans[i].tag == i
    assert cad.context().makes - before == len(batches)  # the calls made none of their own
    assert plans[0].stats is not None and len(plans[0].stats["servers"]) == world


def test_plans_made_ahead_while_other_micro_batches_compute():
    harness.run(2, _pipelined)


def _late_rank(rank, world):
    """A late rank delays the wait for its plan on the others, never the call that asks for it."""
    import cad
    q, k, v, cu = _micro_batch(rank, 0)
    cad.plan(cu, ahead=True, tag=6, **SHAPE).wait()  # the stack exists (making it is collective, at its first plan)
    if rank == 1:
        time.sleep(2.0)
    start = time.monotonic()
    plan = cad.plan(cu, ahead=True, tag=7, **SHAPE)
    asked = time.monotonic() - start
    assert asked < 1.0, f"rank {rank}: asking for a plan ahead took {asked:.2f} s"
    plan.wait()
    if rank == 0:
        assert plan.wait_ms > 1000, plan.wait_ms  # it waited for rank 1 here, not in cad.plan
    _check(q, k, v, cu, plan, torch.ones(q.shape))


def test_late_rank_delays_only_the_wait():
    harness.run(2, _late_rank)


def _different_order(rank, world):
    import cad
    q, k, v, cu = _micro_batch(rank, 0)
    tags = [0, 1] if rank == 0 else [1, 0]
    plans = [cad.plan(cu, ahead=True, tag=t, **SHAPE) for t in tags]
    with pytest.raises(cad.CadError, match="ranks ask for plans in different orders: rank 0 makes plan number 1 "
                                           "with tag 0 while rank 1 makes plan number 1 with tag 1"):
        plans[0].wait()
    # The planning collectives are not trusted after a failure: later plans ahead fail with the first failure.
    with pytest.raises(cad.CadError, match="an earlier plan ahead failed"):
        plans[1].wait()
    # A stack made afresh plans ahead again.
    cad.init(timeout_ms=20000)
    plan = cad.plan(cu, ahead=True, tag=3, **SHAPE)
    _check(q, k, v, cu, plan, torch.ones(q.shape))


def test_plans_asked_in_a_different_order_fail_on_every_rank():
    harness.run(2, _different_order)


def _one_rank_asks(rank, world):
    import cad
    cad.init(timeout_ms=1500)
    q, k, v, cu = _micro_batch(rank, 0)
    cad.plan(cu, ahead=True, tag=4, **SHAPE).wait()  # the stack exists on both ranks
    if rank == 0:
        plan = cad.plan(cu, ahead=True, tag=5, **SHAPE)
        start = time.monotonic()
        with pytest.raises(cad.CadError, match=r"rank 0 of 2: plan number 2 \(tag 5\).*did not ask for a plan ahead "
                                               r"within 1.5 s") as info:
            cad.varlen_attn(q, k, v, cu, plan=plan)
        assert info.value.status == "TIMEOUT"
        assert time.monotonic() - start < 20
    else:
        time.sleep(4.0)  # never asks


def test_a_plan_only_one_rank_asks_for_times_out():
    harness.run(2, _one_rank_asks, timeout_s=90)


def _dropped_and_closed(rank, world):
    import cad
    q, k, v, cu = _micro_batch(rank, 0)
    dropped = cad.plan(cu, ahead=True, tag=0, **SHAPE)
    dropped_id = dropped.id
    del dropped  # never collected by its owner: made anyway (the peer makes its), then released
    gc.collect()
    plan = cad.plan(cu, ahead=True, tag=1, **SHAPE)
    _check(q, k, v, cu, plan, torch.ones(q.shape))
    gc.collect()
    assert dropped_id not in cad.context().state()["plans"]
    # Closing the stack with plans queued: each ends made or failed, never hangs.
    queued = [cad.plan(cu, ahead=True, tag=t, **SHAPE) for t in (2, 3, 4)]
    start = time.monotonic()
    cad.shutdown()
    assert time.monotonic() - start < 30
    for p in queued:
        try:
            p.wait(timeout=1.0)
        except cad.CadError as exc:
            assert "closed" in str(exc) or "earlier plan ahead failed" in str(exc) or "TIMEOUT" in exc.status, exc
        with pytest.raises(cad.CadError):  # whatever it became, its stack is gone
            cad.varlen_attn(q, k, v, cu, plan=p)


def test_dropped_plans_are_released_and_closing_ends():
    harness.run(2, _dropped_and_closed, timeout_s=120)


# ---- one process --------------------------------------------------------------------------------------
@pytest.fixture
def fresh_stacks():
    import cad
    cad.init(timeout_ms=20000)
    yield cad
    cad.shutdown()


def test_one_process_plans_ahead(fresh_stacks):
    cad = fresh_stacks
    q, k, v, cu = _micro_batch(0, 0)
    plan = cad.plan(cu, ahead=True, **SHAPE)
    _check(q, k, v, cu, plan, torch.ones(q.shape))
    assert "made=True" in repr(plan)


def test_a_plan_for_cpu_0_runs_on_cpu_tensors(fresh_stacks):
    # A trainer's torch.device("cpu", 0) and the tensors' "cpu" are one device: one stack, the plan usable
    # (TorchTitan's trainer on the CPU plans for its self.device, cpu:0).
    cad = fresh_stacks
    q, k, v, cu = _micro_batch(0, 1)
    plan = cad.plan(cu, ahead=True, **dict(SHAPE, device=torch.device("cpu", 0)))
    _check(q, k, v, cu, plan, torch.ones(q.shape))


def test_plan_ahead_arguments_refused(fresh_stacks):
    cad = fresh_stacks
    _, _, _, cu = _micro_batch(0, 0)
    with pytest.raises(cad.CadError, match="ahead=True.*give num_heads"):
        cad.plan(cu, ahead=True)
    with pytest.raises(cad.CadError, match="tag must be an int"):
        cad.plan(cu, ahead=True, tag="mb0", **SHAPE)
    with pytest.raises(cad.CadError, match="tag must be an int and goes with ahead=True"):
        cad.plan(cu, tag=3, **SHAPE)


def test_plan_ahead_needs_a_plan_communicator(fresh_stacks):
    cad = fresh_stacks
    config = cad.stack_config(torch.device("cpu"))
    assert config["instances"][-1]["config"]["plan_communicator"] == "plan_comm"
    del config["instances"][-1]["config"]["plan_communicator"]
    cad.init(config=config)
    _, _, _, cu = _micro_batch(0, 0)
    with pytest.raises(cad.CadError, match='has no "plan_communicator"') as info:
        cad.plan(cu, ahead=True, **SHAPE)
    assert info.value.status == "UNSUPPORTED"
    cad.plan(cu, **SHAPE)  # made now: still fine


def test_init_passes_the_communication_knobs_to_the_stack(fresh_stacks):
    cad = fresh_stacks
    cuda = cad.stack_config(torch.device("cuda", 0), dict(cad.context().settings, communicator="nccl",
                                                          comm_stream_priority="normal", nccl_max_ctas=8,
                                                          nccl_blocking_comm=True))
    instances = {i["name"]: i for i in cuda["instances"]}
    assert instances["comm"]["config"]["max_ctas"] == 8 and instances["comm"]["config"]["blocking_comm"] is True
    assert instances["cad"]["config"]["comm_stream_priority"] == "normal"
    default = {i["name"]: i for i in cad.stack_config(torch.device("cpu"))["instances"]}
    assert "max_ctas" not in default["comm"]["config"] and "blocking_comm" not in default["comm"]["config"]
    assert default["cad"]["config"]["comm_stream_priority"] == "highest"
    with pytest.raises(cad.CadError, match="comm_stream_priority must be 'highest' or 'normal'"):
        cad.init(comm_stream_priority="low")
    with pytest.raises(cad.CadError, match=r"nccl_max_ctas must be an int in \[0, 64\]"):
        cad.init(nccl_max_ctas=65)
    assert default["cad"]["config"]["own_tasks_in_place"] is False
    assert "server_own" not in {i["name"] for i in cuda["instances"]}
    with pytest.raises(cad.CadError, match="own_tasks_in_place must be True or False"):
        cad.init(own_tasks_in_place="yes")
    # With the tasks run in place, on GPUs they get a cuda instance of their own, whose forward leaves SMs to the
    # collective and walks its units dynamically.
    own = cad.stack_config(torch.device("cuda", 0), dict(cad.context().settings, communicator="nccl",
                                                         own_tasks_in_place=True))
    own_instances = {i["name"]: i for i in own["instances"]}
    assert own_instances["cad"]["config"]["own_tasks_in_place"] is True
    assert own_instances["server_own"]["config"] == {"reserve_sms": 16, "forward_walk": "dynamic"}
    assert own_instances["cad"]["config"]["own_server_backend"] == "server_own"
    assert own_instances["server"]["config"] == {}
    every_sm = cad.stack_config(torch.device("cuda", 0), dict(cad.context().settings, communicator="nccl",
                                                              own_tasks_in_place=True, own_tasks_reserve_sms=0))
    every_sm_instances = {i["name"]: i for i in every_sm["instances"]}
    assert every_sm_instances["server_own"]["config"] == {"reserve_sms": 0, "forward_walk": "dynamic"}
    # On the CPU the server's own instance runs them: no second instance.
    cpu_own = cad.stack_config(torch.device("cpu"), dict(cad.context().settings, own_tasks_in_place=True))
    assert "server_own" not in {i["name"] for i in cpu_own["instances"]}
    assert "own_server_backend" not in {i["name"]: i for i in cpu_own["instances"]}["cad"]["config"]
    with pytest.raises(cad.CadError, match=r"own_tasks_reserve_sms must be an int in \[0, 64\]"):
        cad.init(own_tasks_reserve_sms=-1)
    # The server's forward walk: the cuda backend's forward_walk, only on GPUs and only where it is not the default.
    dynamic = cad.stack_config(torch.device("cuda", 0), dict(cad.context().settings, communicator="nccl",
                                                             forward_walk="dynamic"))
    assert {i["name"]: i for i in dynamic["instances"]}["server"]["config"] == {"forward_walk": "dynamic"}
    assert default["server"]["config"] == {}
    with pytest.raises(cad.CadError, match="forward_walk must be 'static' or 'dynamic'"):
        cad.init(forward_walk="greedy")
    # Head groups: the plugin's head_groups, given only where it is not its default.
    grouped = cad.stack_config(torch.device("cuda", 0), dict(cad.context().settings, communicator="nccl", head_groups=2))
    assert {i["name"]: i for i in grouped["instances"]}["cad"]["config"]["head_groups"] == 2
    assert "head_groups" not in default["cad"]["config"]
    for bad in (0, 65, 2.0, True):
        with pytest.raises(cad.CadError, match=r"head_groups must be an int in \[1, 64\]"):
            cad.init(head_groups=bad)
    # The copy engines: the nccl plugin's copy_engines, given only where asked for.
    by_copy_engines = cad.stack_config(torch.device("cuda", 0), dict(cad.context().settings, communicator="nccl",
                                                                     nccl_copy_engines=True))
    assert {i["name"]: i for i in by_copy_engines["instances"]}["comm"]["config"]["copy_engines"] is True
    assert "copy_engines" not in default["comm"]["config"]
    with pytest.raises(cad.CadError, match="nccl_copy_engines must be True or False"):
        cad.init(nccl_copy_engines=1)


def test_init_passes_the_balancers_config_to_the_stack(fresh_stacks, capfd):
    cad = fresh_stacks
    assert {i["name"]: i for i in cad.stack_config(torch.device("cpu"))["instances"]}["balancer"]["config"] == {}
    cad.init(balancer="prefix_aware", balancer_config={"tolerance": 0.005})
    instances = {i["name"]: i for i in cad.stack_config(torch.device("cpu"))["instances"]}
    assert instances["balancer"] == {"name": "balancer", "plugin": "prefix_aware", "config": {"tolerance": 0.005}}
    _, _, _, cu = _micro_batch(0, 0)
    cad.plan(cu, **SHAPE)  # the plugin takes it (its own tests cover what the tolerance does) ...
    capfd.readouterr()
    cad.init(balancer="prefix_aware", balancer_config={"tolerence": 0.005})
    cad.plan(cu, **SHAPE)  # ... and reads it: a misspelt key is named, with the one meant
    assert "did you mean 'tolerance'" in "".join(capfd.readouterr())
    with pytest.raises(cad.CadError, match="balancer_config must be a dict"):
        cad.init(balancer_config=[("tolerance", 0.1)])


def test_plan_communicator_must_be_an_instance_of_its_own(fresh_stacks):
    cad = fresh_stacks
    config = cad.stack_config(torch.device("cpu"))
    config["instances"][-1]["config"]["plan_communicator"] = "comm"
    cad.init(config=config)
    _, _, _, cu = _micro_batch(0, 0)
    with pytest.raises(cad.CadError, match="'plan_communicator' names 'comm', the data communicator itself"):
        cad.plan(cu, **SHAPE)


def _groups_destroyed_at_shutdown(rank, world):
    import cad
    import torch.distributed as dist
    q, k, v, cu = random_batch([5, 3] if rank == 0 else [7, 1], 4, 2, 8, seed=rank)
    plan = cad.plan(cu, num_heads=4, num_kv_heads=2, head_dim=8, dtype=q.dtype, device=q.device, ahead=True, tag=0)
    cad.varlen_attn(q, k, v, cu, plan=plan)
    collectives = cad.context().lane(0).existing(q.device).collectives
    groups = [collectives.group, collectives.planning_group]
    assert all(g is not None for g in groups)
    mapped = dist.distributed_c10d._world.pg_map
    assert all(g in mapped for g in groups)
    cad.shutdown()
    # The package's own gloo groups are gone (their worker threads with them), the user's default group is not.
    assert not any(g in mapped for g in groups), "the CAD stack's gloo groups outlived cad.shutdown()"
    assert collectives.group is None and collectives.planning_group is None
    assert dist.is_initialized() and dist.get_world_size() == world
    dist.barrier()


def test_shutdown_destroys_the_groups_the_package_made():
    harness.run(2, _groups_destroyed_at_shutdown)
