"""CAD under every way a trainer runs a layer's forward twice or wraps it, on 2 gloo ranks: torch.utils.checkpoint
(reentrant and not), transformers' gradient checkpointing with the plan derived from position_ids or passed by
the caller, selective recompute (attention only, MLP only), DDP, FSDP2 and torch.compile of a layer. In each case
the losses and gradients must equal the same model with local attention ("cad_local"), and the backward must make
no plan of its own (a plan make is collective: inside the backward it would be a second, unplanned collective)."""
import functools

import torch

import harness

DOCS = [[37, 5, 1, 21], [9, 60]]  # per rank; unequal attention work, equal tokens
# Imported once by the ranks' forkserver (tests/python/harness.py): every case builds a transformers Llama, and
# test_compiled_layers compiles its layers (AOTAutograd; torch._dynamo is in harness.BASE).
PRELOAD = (*harness.TRANSFORMERS, "torch._functorch.aot_autograd")


def _config():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def _batch(rank, step):
    docs = DOCS[rank] if step == 0 else DOCS[rank][::-1]
    g = torch.Generator().manual_seed(10 * rank + step)
    ids = torch.randint(0, 97, (1, sum(docs)), generator=g)
    positions = torch.cat([torch.arange(n) for n in docs]).unsqueeze(0)
    cu = torch.tensor([0] + torch.tensor(docs).cumsum(0).tolist(), dtype=torch.int32)
    return ids, positions, cu


def _selective(model, part):
    """Recompute only each layer's `part` ("self_attn" or "mlp") in the backward."""
    from torch.utils.checkpoint import checkpoint
    for layer in model.model.layers:
        module = getattr(layer, part)
        forward = module.forward
        module.forward = functools.partial(checkpoint, forward, use_reentrant=False)


def _train(rank, implementation, mode, wrap, explicit_plan, steps=2):
    import cad
    import cad.hf
    from transformers import AutoModelForCausalLM

    cad.hf.register()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(), attn_implementation=implementation, dtype=torch.float32)
    if mode in ("reentrant", "non_reentrant"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": mode == "reentrant"})
        model.train()
    elif mode in ("self_attn", "mlp"):
        _selective(model, mode)
    if wrap == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    elif wrap == "compile":
        for layer in model.model.layers:
            layer.compile(backend="aot_eager", dynamic=True)
    out = []
    for step in range(steps):
        ids, positions, cu = _batch(rank, step)
        kwargs = {}
        if explicit_plan and implementation == "cad":
            kwargs = dict(cad_plan=cad.plan(cu), cad_cu_seqlens=cu)
        made = _plan_makes()
        # use_cache=False: a KV cache would grow again in every recomputed attention (as transformers itself
        # sets it under gradient checkpointing)
        loss = model(input_ids=ids, position_ids=positions, labels=ids, use_cache=False, **kwargs).loss
        made_in_forward = _plan_makes() - made
        loss.backward()
        made_in_backward = _plan_makes() - made - made_in_forward
        assert made_in_backward == 0, f"{made_in_backward} plan(s) made inside the backward ({mode}, {wrap})"
        grads = {}
        for n, p in model.named_parameters():
            g = p.grad
            if hasattr(g, "full_tensor"):  # FSDP2: a sharded DTensor
                g = g.full_tensor()
            grads[n.replace("_orig_mod.", "").replace("module.", "")] = g.detach().clone()
            p.grad = None
        out.append((loss.detach(), grads))
    return out


def _plan_makes():
    import cad
    return cad.context().makes


def _compare(rank, world, cases):
    """Each case (recompute mode, wrapper, explicit plan) in turn, in the same processes (one start-up)."""
    for mode, wrap, explicit_plan in cases:
        local = _train(rank, "cad_local", mode, wrap, explicit_plan)
        distributed = _train(rank, "cad", mode, wrap, explicit_plan)
        case = f"{mode}, {wrap}, {'explicit' if explicit_plan else 'derived'} plan"
        for step, ((loss_a, grads_a), (loss_b, grads_b)) in enumerate(zip(local, distributed)):
            torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"{case}: step {step} loss: {m}")
            assert grads_a.keys() == grads_b.keys()
            for name in grads_a:
                torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=1e-6,
                                           msg=lambda m: f"{case}: step {step} grad {name}: {m}")


def test_activation_checkpointing():
    # transformers' gradient checkpointing, reentrant and not, with the plan derived from position_ids (the
    # case that failed with "plan #1 was released or never existed") and passed by the caller.
    harness.run(2, _compare, [(mode, None, explicit) for mode in ("non_reentrant", "reentrant")
                              for explicit in (False, True)], timeout_s=240, preload=PRELOAD)


def test_selective_recompute():
    harness.run(2, _compare, [("self_attn", None, False), ("mlp", None, False), ("self_attn", None, True)],
                timeout_s=240, preload=PRELOAD)


def test_data_parallel_wrappers_with_checkpointing():
    harness.run(2, _compare, [("non_reentrant", "ddp", False), ("non_reentrant", "fsdp2", False),
                              ("reentrant", "fsdp2", True), (None, "fsdp2", False)], timeout_s=240, preload=PRELOAD)


def test_compiled_layers():
    harness.run(2, _compare, [(None, "compile", True), ("non_reentrant", "compile", False)], timeout_s=300,
                preload=PRELOAD)
