"""A server backend per direction (cad.server_backend.directions; the callback_attention plugin handing one direction
to an inner instance): on 2 CPU processes, "torch" forward with the reference backward and the reference forward with
"torch" backward give the all-default results (O, dQ, dK, dV) on plans whose server batches share K/V prefixes under
GQA; the choice's spellings and the plugin's config keys are refused where wrong, naming the key."""
import pytest
import torch

import harness
from reference import random_batch

# Per rank: unequal documents, so the balancer moves work and servers get shards sharing a document's K/V prefix.
LENGTHS = [[37, 2, 1], [4, 9, 5]]
CHOICES = ("default", "torch+default", "default+torch")


def _outputs(ctx, rank, causal, window):
    import cad
    q, k, v, cu = random_batch(LENGTHS[rank], 4, 2, 16, seed=rank)  # GQA: 4 query heads over 2 K/V heads
    d_o = torch.randn(q.shape, generator=torch.Generator().manual_seed(100 + rank))
    plan = ctx.plan(cu, causal=causal, window_size=window)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = cad.varlen_attn(*leaves, cu, plan=plan, causal=causal, window_size=window)
    o.backward(d_o)
    return plan, [o.detach()] + [t.grad for t in leaves]


def _per_direction(rank, world):
    import cad
    from cad import server_backend
    contexts = {c: cad.Context(server_backend=c, timeout_ms=20000) for c in CHOICES}
    # Plans through the callback instance: its inner instance ("server_mid", itself a callback instance handing its
    # forward to the reference backend) makes plans, so CAD's calls carry a plan and no segments, and the outer
    # instance gives its callbacks the plan's segment table. Both directions end in the torch callbacks.
    config = contexts["default+torch"].stack_config(torch.device("cpu"))
    instances = [dict(i) for i in config["instances"]]
    at = next(n for n, i in enumerate(instances) if i["name"] == "server")
    instances[at] = dict(instances[at], name="server_mid")
    instances.insert(at + 1, dict(instances[at], name="server", config={
        "key": "torch_cpu", "inner": "server_mid", "inner_runs": "backward"}))
    nested = cad.Context(config=dict(config, instances=instances), timeout_ms=20000)
    for causal, window in ((True, (-1, -1)), (True, (6, 0))):
        before = {k: dict(v) for k, v in server_backend.calls.items()}
        got = {}
        for c in CHOICES:
            plan, got[c] = _outputs(contexts[c], rank, causal, window)
            if c == "default":
                # A document cut into shards on a server: its segments read K/V prefix rows beyond their queries.
                assert any(sv["kv_rows"] > sv["q_rows"] for sv in plan.stats["servers"]), plan.stats
        _, got["planned"] = _outputs(nested, rank, causal, window)
        for c in CHOICES[1:] + ("planned",):
            for name, a, b in zip(("o", "dq", "dk", "dv"), got[c], got["default"]):
                torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5,
                                           msg=lambda m: f"rank {rank} {c} window {window} {name}: {m}")
        after = server_backend.calls["torch_cpu"]
        was = before.get("torch_cpu", {"forward": 0, "backward": 0})
        # Each direction went where it was given: torch ran one forward (torch+default, the nested instance) and
        # one backward (default+torch, the nested instance) per call on this rank's server batch.
        assert after["forward"] - was["forward"] == 2 and after["backward"] - was["backward"] == 2, (was, after)
    config = contexts["default+torch"].stack_config(torch.device("cpu"))
    named = {i["name"]: i for i in config["instances"]}
    assert named["server_inner"]["plugin"] == "reference"
    assert named["server"]["config"]["inner"] == "server_inner" and named["server"]["config"]["inner_runs"] == "forward"
    names = [i["name"] for i in config["instances"]]
    assert names.index("server_inner") < names.index("server") < names.index("cad")  # looked up when created
    for c in list(contexts.values()) + [nested]:
        c.close()
    _plugin_refusals(rank)


def test_one_direction_each_matches_the_default_backend_and_bad_inner_keys_are_refused():
    harness.run(2, _per_direction)


def _plugin_refusals(rank):
    """The callback instance's config refused at create, naming the key (every rank alike)."""
    import cad
    q, k, v, cu = random_batch([5, 3], 2, 2, 16, seed=rank)
    base = cad.Context(server_backend="default+torch", timeout_ms=20000).stack_config(torch.device("cpu"))
    cases = [({"inner_runs": None}, "'inner' is given without 'inner_runs'"),
             ({"inner": None}, "'inner_runs' is given without 'inner'"),
             ({"inner_runs": "sideways"}, "inner_runs"),
             ({"inner": "nowhere"}, "'inner' names 'nowhere', but the host has no attention instance"),
             ({"inner": "balancer"}, "'inner' names 'balancer', but the host has no attention instance")]
    for change, message in cases:
        config = {**base, "instances": [dict(i, config=dict(i["config"])) for i in base["instances"]]}
        server = next(i for i in config["instances"] if i["name"] == "server")
        for key, value in change.items():
            if value is None:
                server["config"].pop(key)
            else:
                server["config"][key] = value
        ctx = cad.Context(config=config, timeout_ms=20000)
        with pytest.raises(cad.CadError) as info:  # the stack is made (and refused) by the first call
            cad.varlen_attn(q, k, v, cu, plan=ctx.plan(cu))
        assert message in str(info.value), (change, str(info.value))
        ctx.close()


def test_choices_spelled_every_way_and_refused_naming_what_is_wrong():
    import cad
    from cad import server_backend
    from cad.train import llama_args
    assert server_backend.directions("fa4") == ("fa4", "fa4")
    assert server_backend.directions("default+fa4") == ("default", "fa4")
    assert server_backend.directions({"forward": "torch", "backward": "default"}) == ("torch", "default")
    assert cad.Context(server_backend="torch+torch").settings["server_backend"] == "torch"
    assert cad.Context(server_backend="default+torch").settings["server_backend"] == \
        {"forward": "default", "backward": "torch"}
    refused = [("default+fa4+torch", "has 3 parts"), ("default+flash", "the backward must be one of"),
               ({"forward": "default"}, "missing 'backward'"),
               ({"forward": "default", "backward": "fa4", "both": "x"}, "unknown 'both'"),
               ({"forward": "flash", "backward": "fa4"}, "server_backend['forward'] must be one of"),
               (7, "got int 7")]
    for choice, message in refused:
        with pytest.raises(cad.CadError, match="server_backend") as info:
            cad.Context(server_backend=choice)
        assert message in str(info.value), (choice, str(info.value))
    # FA4 is refused where it cannot run the direction it is given (here: no GPU), naming that direction.
    with pytest.raises(cad.CadError, match="'fa4' cannot run the backward on cpu"):
        server_backend.instances("default+fa4", "cpu", {"name": "server", "plugin": "reference", "config": {}})
    args = llama_args.parse_args(["--server-backend", "default+fa4"])
    assert args.server_backend == "default+fa4"
    with pytest.raises(SystemExit):
        llama_args.parse_args(["--server-backend", "default+flash"])
    runs = dict(llama_args.configurations(llama_args.parse_args(["--configs", "prefix_aware+fa4bwd,prefix_aware+fa4srv"])))
    assert runs["prefix_aware_fa4bwd"].server_backend == "default+fa4" and runs["prefix_aware_fa4srv"].server_backend == "fa4"
    with pytest.raises(SystemExit):
        llama_args.parse_args(["--configs", "fa4+fa4bwd"])
