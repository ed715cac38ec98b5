"""A transformers Llama model trained on packed batches: "cad" (CAD plans over 2 ranks) gives the same losses
and gradients as "cad_local" (the same kernels, no distribution) for two optimizer steps."""
import torch

import harness

DOCS = [[37, 5, 1, 21], [9, 60]]  # per rank; unequal attention work


def _train(rank, implementation, ahead=False):
    """Two optimizer steps. ahead: each step's plan is asked for with cad.hf.plan_ahead while the step before it
    computes (step 0's before the loop), as a trainer loading micro-batch i+1 would. ahead="moved": the forward
    gets a copy of the position_ids plan_ahead was given, as FSDP2's root module hands it a device copy."""
    import cad.hf
    from transformers import AutoModelForCausalLM, LlamaConfig

    cad.hf.register()
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation, dtype=torch.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    batches = []
    for step in range(2):
        docs = DOCS[rank] if step == 0 else DOCS[rank][::-1]
        ids = torch.randint(0, 97, (1, sum(docs)), generator=g)
        batches.append((ids, torch.cat([torch.arange(n) for n in docs]).unsqueeze(0)))
    plans = [cad.hf.plan_ahead(model, position_ids=batches[0][1], tag=0)] if ahead else []
    out = []
    for step, (ids, positions) in enumerate(batches):
        if ahead and step + 1 < len(batches):
            plans.append(cad.hf.plan_ahead(model, position_ids=batches[step + 1][1], tag=step + 1))
        given = positions.clone() if ahead == "moved" else positions
        loss = model(input_ids=ids, position_ids=given, labels=ids).loss
        loss.backward()
        if ahead:  # the forward found its plan (made on the planning thread), made none at its first layer
            assert cad.hf.current_plan() is plans[step] and plans[step].ready
        out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        optimizer.step()
        optimizer.zero_grad()
    return out


def _compare(rank, world):
    local = _train(rank, "cad_local")
    for ahead in (False, True, "moved"):
        distributed = _train(rank, "cad", ahead)
        for step, ((loss_a, grads_a), (loss_b, grads_b)) in enumerate(zip(local, distributed)):
            torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"ahead={ahead} step {step} loss: {m}")
            for name in grads_a:
                torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=1e-6,
                                           msg=lambda m: f"ahead={ahead} step {step} grad {name}: {m}")
        import cad.hf
        assert cad.hf.current_plan().stats["imbalance"] < 1.3


def _local_matches_sdpa(rank, world):
    # "cad_local" itself against transformers' own sdpa attention with the same packed batch.
    import cad.hf
    from transformers import AutoModelForCausalLM, LlamaConfig

    cad.hf.register()
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(3))
    losses = []
    for implementation in ("cad_local", "sdpa"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation, dtype=torch.float32)
        losses.append(model(input_ids=ids, labels=ids).loss)  # one document: plain causal attention
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)


def test_llama_cad_equals_local_two_steps():
    harness.run(2, _compare, timeout_s=150)


def test_cad_local_equals_sdpa():
    _local_matches_sdpa(0, 1)


def test_cu_seq_lens_kwargs_equal_position_ids():
    # The documents may come as flash-attention kwargs instead of position_ids restarts: same loss.
    import cad.hf
    from transformers import AutoModelForCausalLM, LlamaConfig

    cad.hf.register()
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="cad_local", dtype=torch.float32)
    docs = [11, 4, 17]
    ids = torch.randint(0, 97, (1, sum(docs)), generator=torch.Generator().manual_seed(5))
    positions = torch.cat([torch.arange(n) for n in docs]).unsqueeze(0)
    cu = torch.tensor([0, 11, 15, 32], dtype=torch.int32)
    by_positions = model(input_ids=ids, position_ids=positions, labels=ids).loss
    by_kwargs = model(input_ids=ids, position_ids=positions, labels=ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                      max_length_q=17, max_length_k=17).loss
    one_document = model(input_ids=ids, labels=ids).loss  # no restarts: one causal document
    torch.testing.assert_close(by_kwargs, by_positions)
    assert abs(one_document.item() - by_positions.item()) > 1e-4  # the document boundaries did matter


def test_documents_and_plan_passed_by_the_caller():
    # A forward run in pieces (ping-pong's nano-batches) hands each attention call its own documents and plan
    # (cad_cu_seqlens, cad_plan): they are used as given, not derived from position_ids.
    import types

    import pytest

    import cad
    import cad.hf
    from reference import random_batch, sdpa_varlen

    q, k, v, cu = random_batch([7, 3, 12], 4, 2, 16, seed=3)
    as_hf = [t.unsqueeze(0).transpose(1, 2) for t in (q, k, v)]  # [1, heads, tokens, dim], as transformers passes
    module = types.SimpleNamespace(is_causal=True, layer_idx=0)
    out, _ = cad.hf.cad_local_attention(module, *as_hf, None, cad_cu_seqlens=cu, scaling=0.25,
                                        position_ids=torch.arange(22).unsqueeze(0))  # one document if derived
    torch.testing.assert_close(out.reshape(q.shape), sdpa_varlen(q, k, v, cu, True, scale=0.25))
    with pytest.raises(cad.CadError, match="cad_plan was passed without the cad_cu_seqlens"):
        cad.hf.cad_local_attention(module, *as_hf, None, cad_plan=object())
    with pytest.raises(cad.CadError, match="cad_cu_seqlens was passed without its cad_plan"):
        cad.hf.cad_attention(module, *as_hf, None, cad_cu_seqlens=cu)
