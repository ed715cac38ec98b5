"""cad.Context: one owner of CAD's state per group. Two contexts in one process -- over two different process
groups, and over the same ranks in two groups -- each make their own stacks and plans and compute what the local
reference computes; closing one leaves the other working. Also what a plan fixes (mask, shapes, dtype, context)
and that a plan given its shapes is made when it is planned, not inside the first layer."""
import pytest
import torch

import cad
import harness
from reference import random_batch, sdpa_varlen, sdpa_varlen_window

SHAPE = dict(num_heads=4, num_kv_heads=2, head_dim=8, dtype=torch.float32)


def _forward_backward(q, k, v, cu, plan, want_window=None):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = cad.varlen_attn(*leaves, cu, plan=plan)
    d_o = torch.randn(q.shape, generator=torch.Generator().manual_seed(int(cu[-1])))
    o.backward(d_o)
    ref = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    if want_window is None:
        want = sdpa_varlen(*ref, cu, True)
    else:
        want = sdpa_varlen_window(*ref, cu, True, want_window)
    want.backward(d_o)
    for name, a, b in zip(("o", "dq", "dk", "dv"), [o] + [t.grad for t in leaves], [want] + [t.grad for t in ref]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5, msg=lambda m: f"{name}: {m}")


def _two_contexts(rank, world):
    import torch.distributed as dist
    halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes both (torch's rule)
    half = cad.Context(halves[rank // 2], timeout_ms=20000, balancer="colocated")
    whole = cad.Context(timeout_ms=20000)  # the same ranks as the default context, in a group of its own
    try:
        assert half.group is halves[rank // 2] and half.rank == rank % 2 and whole.rank == rank
        assert half.id != whole.id != cad.context().id
        # Each rank a different micro-batch per context; plans of both contexts in flight at once, used in turns.
        batches = {ctx: random_batch([3 + rank, 6, 2 * rank + 1] if ctx is half else [9 - rank, rank + 1], 4, 2, 8,
                                     seed=10 * rank + i) for i, ctx in enumerate((half, whole))}
        plans = {ctx: ctx.plan(batches[ctx][3], **SHAPE) for ctx in (half, whole)}
        windowed = half.plan(batches[half][3], window_size=(2, 0), **SHAPE)
        for ctx, plan in plans.items():
            assert plan.context is ctx and plan.ready  # made at cad.plan: shapes given
        for _ in range(2):  # two "layers", alternating between the groups
            for ctx in (half, whole):
                _forward_backward(*batches[ctx], plans[ctx])
            _forward_backward(*batches[half], windowed, want_window=(2, 0))
        assert len(plans[half].stats["servers"]) == 2 and len(plans[whole].stats["servers"]) == 4
        assert half.makes == 2 and whole.makes == 1  # no call made a plan of its own
        assert not cad.context().state()["stacks"]  # the default context made no stack
        half_stacks, whole_stacks = half.state()["stacks"], whole.state()["stacks"]
        assert len(half_stacks) == len(whole_stacks) == 1
        assert set(map(id, half_stacks.values())).isdisjoint(map(id, whole_stacks.values()))
        # A plan of one context is refused after that context closed; the other's goes on.
        whole.close()
        with pytest.raises(cad.CadError, match=f"plan #{plans[whole].id} was made on a CAD stack"):
            cad.varlen_attn(*batches[whole][:4], plan=plans[whole])
        _forward_backward(*batches[half], plans[half])
        # Made ahead on a lane of its own, named by the context's Lane object.
        lane = half.lane(1)
        ahead = half.plan(batches[half][3], ahead=True, tag=7, lane=lane, **SHAPE)
        assert ahead.lane is lane and ahead.lane == 1
        _forward_backward(*batches[half], ahead)
        assert ahead.host("cpu") is lane.existing("cpu") is not half.lane(0).existing("cpu")
        dist.barrier()
    finally:
        half.close()
        whole.close()


def test_two_contexts_over_two_groups_in_one_process():
    harness.run(4, _two_contexts, timeout_s=240)


# ---- one process ------------------------------------------------------------------------------------------------
@pytest.fixture
def fresh_stacks():
    cad.init(timeout_ms=20000)
    yield
    cad.shutdown()


def test_a_plan_with_shapes_is_made_when_planned_and_one_without_at_its_first_call(fresh_stacks):
    q, k, v, cu = random_batch([5, 9], 4, 2, 8)
    before = cad.context().makes
    plan = cad.plan(cu, **SHAPE)  # no device: cu_seqlens' (the CPU here)
    assert plan.ready and cad.context().makes == before + 1
    assert (plan.num_heads, plan.num_kv_heads, plan.head_dim, plan.dtype) == (4, 2, 8, torch.float32)
    cad.varlen_attn(q, k, v, cu, plan=plan)
    assert cad.context().makes == before + 1
    lazy = cad.plan(cu)
    assert not lazy.ready and cad.context().makes == before + 1 and lazy.num_heads is None
    cad.varlen_attn(q, k, v, cu, plan=lazy)  # made here, from the call's tensors (not ahead)
    assert lazy.ready and cad.context().makes == before + 2 and lazy.num_heads == 4


@pytest.mark.parametrize("change, expected", [  # the package's words, before anything crosses ctypes
    (lambda q, k, v: (q[:, :2].contiguous(), k, v), r"tensor 'q' has 2 heads \(dim 1 of \(14, 2, 8\)\), but plan #\d+ "
                                                    r"was made for num_heads=4, .*\(num_heads=4\)"),
    (lambda q, k, v: (q, k[:, :1].contiguous(), v), r"tensor 'k' has 1 heads .*\(num_kv_heads=2\)"),
    (lambda q, k, v: (q, k, v[..., :4].contiguous()), r"tensor 'v' has head dim 4 .*\(head_dim=8\)"),
    (lambda q, k, v: (q.double(), k.double(), v.double()), r"tensor 'q' is torch.float64, but plan #\d+ .*"
                                                           r"\(dtype=torch.float32\)"),
    (lambda q, k, v: (q, k, v.bfloat16()), r"tensor 'v' is torch.bfloat16, .*\(dtype=torch.float32\)"),
])
def test_tensors_that_do_not_match_the_plan_are_refused_naming_the_tensor(fresh_stacks, change, expected):
    q, k, v, cu = random_batch([5, 9], 4, 2, 8)
    plan = cad.plan(cu, **SHAPE)
    with pytest.raises(cad.CadError, match=expected):
        cad.varlen_attn(*change(q, k, v), cu, plan=plan)
    torch.testing.assert_close(cad.varlen_attn(q, k, v, None, plan=plan), sdpa_varlen(q, k, v, cu, True),
                               rtol=1e-5, atol=2e-5)  # and the plan still works (cu_seqlens=None: the plan's own)


def test_a_mismatch_with_the_plan_is_refused_before_the_plugin_is_called(fresh_stacks, monkeypatch):
    from cad import _host
    q, k, v, cu = random_batch([5, 9], 4, 2, 8)
    plan = cad.plan(cu, **SHAPE)
    calls = []
    monkeypatch.setattr(_host.Host, "forward", lambda self, args: calls.append(args))
    with pytest.raises(cad.CadError, match=r"tensor 'k' has 1 heads") as refused:
        cad.varlen_attn(q, k[:, :1].contiguous(), v[:, :1].contiguous(), cu, plan=plan)
    assert refused.value.status == "INVALID_ARGUMENT" and not calls  # nothing crossed ctypes


def test_rows_that_differ_from_the_plan_are_left_to_the_plugin_which_agrees_on_the_refusal(fresh_stacks):
    q, k, v, cu = random_batch([5, 9], 4, 2, 8)
    plan = cad.plan(cu, **SHAPE)
    with pytest.raises(cad.CadError, match=r"forward on rank 0: tensor 'q'.* 13.* 14"):  # the agreed refusal
        cad.varlen_attn(q[:13].contiguous(), k[:13].contiguous(), v[:13].contiguous(), None, plan=plan)


def test_partial_shapes_are_refused_naming_what_is_missing(fresh_stacks):
    _, _, _, cu = random_batch([5, 9], 4, 2, 8)
    with pytest.raises(cad.CadError, match=r"give num_heads, num_kv_heads, head_dim and dtype together, or none "
                                           r"\(missing: dtype\)"):
        cad.plan(cu, num_heads=4, num_kv_heads=2, head_dim=8)
    with pytest.raises(cad.CadError, match=r"ahead=True.*missing: num_heads, num_kv_heads, head_dim, dtype"):
        cad.plan(cu, ahead=True)


def test_the_packages_modules_import_each_other_without_a_circle():
    import ast
    import pathlib
    package = pathlib.Path(cad.__file__).parent
    graph = {}
    for path in package.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        graph[path.stem] = deps
    done, path = set(), []

    def visit(module):
        assert module not in path, f"import circle: {' -> '.join(path[path.index(module):] + [module])}"
        if module in done or module not in graph:
            return
        path.append(module)
        for dep in sorted(graph[module]):
            visit(dep)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    assert {"_context", "_ops", "_plans"} <= done
