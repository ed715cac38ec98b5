"""CAD as Megatron-Core's core attention under tensor, pipeline and context parallelism, on 4 gloo ranks (one launch,
the layouts one after another, after test_cad_megatron_cp.py's CP 2 x DP 2 checks of the attention layer), a
GPTModel on Megatron's local spec (2 layers, GQA 4/2, learned absolute positions unless said):
- TP 2 x DP 2: each TP index runs CAD over its data-parallel pair with its head slice (2 query heads, 1 KV head);
  without sequence parallelism, which Megatron's local (torch) norms refuse (bench_gpu_tp.sh runs it on TE's
  spec); per document losses and every rank's gradients equal Megatron's own attention (DotProductAttention per
  document), and the two TP ranks of a pair make the same plan;
- PP 2 x DP 2: each stage's layer runs CAD over that stage's pair, in 1F1B order (stage 0: F0 F1 B0 B1, stage 1:
  F0 B0 F1 B1, activations and their gradients passed between the stages); losses and gradients equal Megatron's
  attention on the same schedule;
- TP 2 x CP 2: the step's documents laid over the two context-parallel ranks of each TP index by
  cad_megatron_cp.pack_for_context_parallel (one document cut across them, positions continuous), attended whole;
  per document losses and the gradients summed over the group equal the TP 2 x DP 2 run of Megatron's attention
  on the same documents held whole (each data-parallel rank some of them), with learned absolute positions and
  with RoPE (each token's angle from its position in its document, cad_megatron_rope);
- TP 1 x CP 2 (x DP 2) with RoPE: the same over all 4 ranks (three documents cut), equal to one rank running
  every document whole through Megatron's attention (TP 1 x CP 1); with positions restarting at each cut the cut
  documents' losses differ (what Megatron's own THD RoPE would give there).
Very unequal documents per rank, so that the balancer moves work. CPU, fp32; skipped where megatron.core cannot be
imported (run_tests.sh installs it)."""
import sys

import pytest
import torch

pytest.importorskip("megatron.core",
                    reason="megatron-core is not installed (pip install megatron-core; run_tests.sh does it)")

from test_cad_megatron import HERE, _run  # noqa: E402 -- the ranks' launcher (gloo)

sys.path.insert(0, str(HERE))
HEADS, GROUPS, HEAD_DIM, VOCAB = 4, 2, 16, 96
# Per data-parallel replica (84 and 40 tokens, even: sequence parallelism splits them over 2 TP ranks). Laid in
# order over 2 context-parallel ranks (62 tokens each), the 50-token document is cut at its 28th token.
DOCS = [[30, 3, 1, 50], [5, 6, 7, 8, 1, 9, 4]]
FLAT = DOCS[0] + DOCS[1]


def _config(tp=1, pp=1, cp=1):
    from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig(
        num_layers=2, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, num_query_groups=GROUPS,
        ffn_hidden_size=128, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, attention_dropout=0.0, hidden_dropout=0.0,
        params_dtype=torch.float32, pipeline_dtype=torch.float32, use_cpu_initialization=True,
        masked_softmax_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        persist_layer_norm=False, gradient_accumulation_fusion=False, cross_entropy_loss_fusion=False,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        context_parallel_size=cp)


def _models(config, reference=True, rope=False, cad=True):
    """(Megatron's attention, CAD's) GPTModels of this rank's stage with the same weights (seeded; reference=False:
    CAD's only, where Megatron's local attention refuses the layout; cad=False: Megatron's only). rope: rotary
    position embeddings (Megatron's RotaryEmbedding, computed on the CPU) instead of learned absolute ones."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    import cad_megatron
    reference_spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    reference_spec.submodules.self_attention.submodules.core_attention = cad_megatron.PerDocumentDotProductAttention
    from cad_megatron_rope import rope_on_cpu
    specs = [reference_spec if reference else None, cad_megatron.cad_gpt_layer_spec(normalization="RMSNorm") if cad
             else None]
    models = []
    for spec in specs:
        if spec is None:
            models.append(None)
            continue
        torch.manual_seed(0)
        models.append(GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=128,
                               position_embedding_type="rope" if rope else "learned_absolute",
                               share_embeddings_and_output_weights=False,
                               pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage()))
        if rope:
            rope_on_cpu(models[-1])
    if reference and cad:
        models[1].load_state_dict(models[0].state_dict())
    return models


def _stream():
    """The step's tokens, the same on every rank: document i of FLAT is stream[sum(FLAT[:i]) : sum(FLAT[:i + 1])]."""
    return torch.randint(0, VOCAB, (sum(FLAT),), generator=torch.Generator().manual_seed(5))


def _whole_documents(replica):
    """Replica `replica`'s documents whole: (ids, labels, positions, loss mask, first document's index in FLAT)."""
    docs, first = DOCS[replica], 0 if replica == 0 else len(DOCS[0])
    start = sum(FLAT[:first])
    tokens = _stream()[start:start + sum(docs)]
    labels = torch.cat([tokens[1:], tokens[:1]])
    mask = torch.ones(sum(docs))
    mask[torch.tensor(docs).cumsum(0) - 1] = 0.0  # a document's last token predicts nothing
    positions = torch.cat([torch.arange(n) for n in docs])
    return tokens[None], labels[None], positions[None], mask, first


def _document_losses(token_loss, mask, doc_of_token):
    """[len(FLAT)] float64: each document's summed token loss (this rank's tokens of it)."""
    out = torch.zeros(len(FLAT), dtype=torch.float64)
    return out.index_add(0, doc_of_token, (token_loss.reshape(-1) * mask).double())


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _close(what, got, want):
    assert got.keys() == want.keys(), f"{what}: gradients of {sorted(set(got) ^ set(want))} differ in presence"
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{what} {name}: {m}")


def _same_on_tensor_parallel_ranks(what, stats):
    """Every rank of this rank's TP group made the same plan: its servers' tasks, bytes and balance (a plan's stats
    without its timings)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    value = {k: v for k, v in stats.items() if not k.endswith("_ms")}
    values = [None] * ps.get_tensor_model_parallel_world_size()
    dist.all_gather_object(values, value, group=ps.get_tensor_model_parallel_group())
    assert all(v == values[0] for v in values), f"{what}: the TP ranks' plans differ: {values}"


def _step(model, batch, packed, config=None):
    """Loss summed over the batch's predicted tokens, backward; (document losses, gradients, the batch's plans)."""
    import cad_megatron
    ids, labels, positions, mask, first = batch
    model.zero_grad(set_to_none=True)
    if config is not None:
        packed = cad_megatron.attach_plan(packed, config, ahead=True, tag=0)
    token_loss = model(ids, positions, None, labels=labels, packed_seq_params=packed)
    (token_loss.reshape(-1) * mask).sum().backward()
    doc_of_token = torch.repeat_interleave(torch.arange(len(packed_docs(batch))) + first,
                                           torch.tensor(packed_docs(batch)))
    return _document_losses(token_loss.detach(), mask, doc_of_token), _grads(model), cad_megatron.plans_of(packed)


def packed_docs(batch):
    return DOCS[0] if batch[4] == 0 else DOCS[1]


def _tp2_dp2(rank):
    """TP 2 x DP 2: CAD equals Megatron's attention on every rank; returns the reference's document losses and
    gradients summed over the data-parallel group (what TP 2 x CP 2 must reproduce)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    import cad_megatron
    ps.initialize_model_parallel(2, 1)
    cad_megatron.megatron_cpu_support()
    cad_megatron.init_cad(timeout_ms=60000)
    group, ranks = cad_megatron.cad_group()
    tp_rank, replica = ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_rank()
    assert ranks == tuple(dist.get_process_group_ranks(ps.get_data_parallel_group())) and len(ranks) == 2
    assert rank in ranks and all(r % 2 == tp_rank for r in ranks), (rank, ranks)  # one TP index's ranks
    config = _config(tp=2)
    reference, ours = _models(config)
    core = ours.decoder.layers[0].self_attention.core_attention
    assert (core.num_heads, core.num_kv_heads) == (HEADS // 2, GROUPS // 2)  # this TP rank's head slice
    batch = _whole_documents(replica)
    packed, _ = cad_megatron.packed_seq_params(DOCS[replica], "cpu")
    want = _step(reference, batch, packed)
    for attach in (None, config):  # plans made by the first layer, then attached ahead by the loop
        got = _step(ours, batch, cad_megatron.packed_seq_params(DOCS[replica], "cpu")[0], attach)
        what = f"TP2xDP2 rank {rank} ({'attached' if attach else 'first layer'})"
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5, msg=lambda m: f"{what} losses: {m}")
        _close(what, got[1], want[1])
        assert len(got[2]) == 1 and len(got[2][0].stats["servers"]) == 2, got[2]
        assert got[2][0].stats["imbalance"] < 1.1, got[2][0].stats
        _same_on_tensor_parallel_ranks(what, got[2][0].stats)
    rope_reference, _ = _models(config, rope=True, cad=False)
    rope_want = _step(rope_reference, batch, cad_megatron.packed_seq_params(DOCS[replica], "cpu")[0])
    out = [_summed(want, group), _summed(rope_want, group)]
    cad_megatron.shutdown_cad()
    ps.destroy_model_parallel()
    return out


def _summed(result, group):
    """(document losses, gradients) of a _step summed over `group` (every document whole on one of its ranks)."""
    import torch.distributed as dist
    losses, grads = result[0].clone(), result[1]
    dist.all_reduce(losses, group=group)
    for g in grads.values():
        dist.all_reduce(g, group=group)
    return losses, grads


def _pp2_dp2(rank):
    """PP 2 x DP 2, 2 micro-batches in 1F1B order: CAD equals Megatron's attention on both stages."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    import cad_megatron
    ps.initialize_model_parallel(1, 2)
    cad_megatron.megatron_cpu_support()
    cad_megatron.init_cad(timeout_ms=60000)
    stage, replica = ps.get_pipeline_model_parallel_rank(), ps.get_data_parallel_rank()
    assert len(cad_megatron.cad_group()[1]) == 2
    config = _config(pp=2)
    batches = [_whole_documents(replica), _whole_documents(1 - replica)]  # micro-batch 1: the other replica's
    hidden = (1, config.hidden_size)

    def run(model, with_plans):
        model.zero_grad(set_to_none=True)
        packs = [cad_megatron.packed_seq_params(packed_docs(b), "cpu")[0] for b in batches]
        if with_plans:
            packs = [cad_megatron.attach_plan(p, config, ahead=True, tag=i) for i, p in enumerate(packs)]
        losses, sends = [], []  # sends do not wait for their receiver (1F1B's sends cross its receives)
        if stage == 0:  # F0 F1 B0 B1
            outs = []
            for b, p in zip(batches, packs):
                outs.append(model(b[0], b[2], None, packed_seq_params=p))
                sends.append(dist.isend(outs[-1].detach().contiguous(), ps.get_pipeline_model_parallel_next_rank()))
            for out in outs:
                grad = torch.empty_like(out)
                dist.recv(grad, ps.get_pipeline_model_parallel_next_rank())
                out.backward(grad)
        else:  # F0 B0 F1 B1
            for b, p in zip(batches, packs):
                x = torch.empty(sum(packed_docs(b)), *hidden)
                dist.recv(x, ps.get_pipeline_model_parallel_prev_rank())
                x.requires_grad_()
                model.set_input_tensor(x)
                token_loss = model(None, b[2], None, labels=b[1], packed_seq_params=p)
                (token_loss.reshape(-1) * b[3]).sum().backward()
                losses.append(token_loss.detach().reshape(-1) * b[3])
                sends.append(dist.isend(x.grad.contiguous(), ps.get_pipeline_model_parallel_prev_rank()))
        for work in sends:
            work.wait()
        return losses, _grads(model), packs

    reference, ours = _models(config)
    want = run(reference, False)
    got = run(ours, True)
    what = f"PP2xDP2 rank {rank} (stage {stage})"
    for i, (a, b) in enumerate(zip(got[0], want[0])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what} micro-batch {i} losses: {m}")
    _close(what, got[1], want[1])
    for p in got[2]:
        plans = cad_megatron.plans_of(p)
        assert len(plans) == 1 and len(plans[0].stats["servers"]) == 2, plans
    cad_megatron.shutdown_cad()
    ps.destroy_model_parallel()


def _tp1_reference(rank):
    """TP 1 x CP 1: Megatron's attention, RoPE, every document of FLAT whole on this rank alone (one packed THD
    micro-batch): the document losses and gradients TP 1 x CP 2 must reproduce."""
    from megatron.core import parallel_state as ps
    import cad_megatron
    ps.initialize_model_parallel(1, 1)
    cad_megatron.megatron_cpu_support()
    reference, _ = _models(_config(), rope=True, cad=False)
    tokens = _stream()
    labels = torch.cat([tokens[1:], tokens[:1]])
    mask = torch.ones(sum(FLAT))
    mask[torch.tensor(FLAT).cumsum(0) - 1] = 0.0
    packed, _ = cad_megatron.packed_seq_params(FLAT, "cpu")
    token_loss = reference(tokens[None], torch.cat([torch.arange(n) for n in FLAT])[None], None,
                           labels=labels[None], packed_seq_params=packed)
    (token_loss.reshape(-1) * mask).sum().backward()
    losses = _document_losses(token_loss.detach(), mask, torch.repeat_interleave(torch.arange(len(FLAT)),
                                                                                 torch.tensor(FLAT)))
    ps.destroy_model_parallel()
    return losses, _grads(reference)


def _cad_cp_step(model, mine, packed):
    """CAD's layout through `model`: this rank's (document losses, gradients); nothing reduced."""
    stream = _stream()
    targets = mine.targets(stream)
    mask = (targets != -100).float()
    model.zero_grad(set_to_none=True)
    token_loss = model(stream[mine.start:mine.stop][None], mine.position_ids()[None], None,
                       labels=targets.clamp_min(0)[None], packed_seq_params=packed)
    (token_loss.reshape(-1) * mask).sum().backward()
    doc_of_token = torch.repeat_interleave(torch.tensor([p[0] for p in mine.pieces]),
                                           torch.tensor([p[3] for p in mine.pieces]))
    return _document_losses(token_loss.detach(), mask, doc_of_token), _grads(model)


def _restarting(packed):
    """packed with its layout's positions restarting at every piece (what Megatron's THD RoPE assumes)."""
    import dataclasses
    from cad_megatron_cp import CpLayout
    layout = packed.cad_cp
    restarted = torch.cat([torch.arange(p[3]) for p in layout.pieces])
    return dataclasses.replace(packed, cad_cp=CpLayout(layout.pieces, layout.tokens, positions=restarted))


def _cad_cp(rank, tp, wants):
    """TP tp x CP 2, CAD's layout: the step's documents laid over the data x context ranks (one cut across the CP
    ranks, positions continuous), attended whole; per document losses and the gradients summed over the group equal
    Megatron's attention on the documents held whole. wants: {'learned_absolute' / 'rope': (losses, gradients)}."""
    from megatron.core import parallel_state as ps
    import cad_megatron
    from cad_megatron_cp import pack_for_context_parallel
    ps.initialize_model_parallel(tp, 1, context_parallel_size=2)
    cad_megatron.megatron_cpu_support()
    cad_megatron.init_cad(timeout_ms=60000)
    group, ranks = cad_megatron.cad_group()
    assert len(ranks) == 4 // tp and all(r % tp == ps.get_tensor_model_parallel_rank() for r in ranks), ranks
    config = _config(tp=tp, cp=2)
    for tag, (embedding, (want_losses, want_grads)) in enumerate(sorted(wants.items())):
        what = f"TP{tp}xCP2 rank {rank} ({embedding})"
        _, ours = _models(config, reference=False, rope=embedding == "rope")
        mine, packed = pack_for_context_parallel(FLAT, sum(FLAT) // len(ranks), config=config, ahead=True, tag=tag)
        assert any(p[3] < p[1] for p in mine.pieces), mine.pieces  # a document cut across the ranks
        losses, grads = _summed(_cad_cp_step(ours, mine, packed), group)
        torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what} losses: {m}")
        _close(what, grads, want_grads)
        plans = cad_megatron.plans_of(packed)
        assert len(plans) == 1 and len(plans[0].stats["servers"]) == len(ranks), plans
        _same_on_tensor_parallel_ranks(what, plans[0].stats)
        if embedding == "rope":  # the same step with positions restarting at each cut: its cut documents differ
            restarted, _ = _summed(_cad_cp_step(ours, mine, _restarting(packed)), group)
            cut = sorted(set().union(*_gathered({p[0] for p in mine.pieces if p[3] < p[1]}, group)))
            whole = [i for i in range(len(FLAT)) if i not in cut]
            # Each cut document's loss moves 50-100x the tolerance above; the others keep theirs.
            assert (restarted[cut] - want_losses[cut]).abs().min() > 1e-4, (what, cut, restarted, want_losses)
            torch.testing.assert_close(restarted[whole], want_losses[whole], rtol=1e-5, atol=1e-5)
    cad_megatron.shutdown_cad()
    ps.destroy_model_parallel()


def _gathered(value, group):
    import torch.distributed as dist
    values = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    return values


def _layouts(rank, world):
    assert world == 4
    from megatron.core import parallel_state as ps
    import cad_megatron
    from test_cad_megatron_cp import _both_layouts
    _both_layouts(2, rank, world)  # CP 2 x DP 2, attention layers alone (test_cad_megatron_cp.py)
    cad_megatron.shutdown_cad()
    ps.destroy_model_parallel()
    learned, rope = _tp2_dp2(rank)
    _pp2_dp2(rank)
    _cad_cp(rank, 2, {"learned_absolute": learned, "rope": rope})
    _cad_cp(rank, 1, {"rope": _tp1_reference(rank)})


def test_tensor_pipeline_and_context_parallel_layouts_equal_megatrons_attention():
    """One launch for every 4-rank layout: test_cad_megatron_cp.py's CP 2 x DP 2, then TP 2 x DP 2, PP 2 x DP 2,
    TP 2 x CP 2 (learned absolute positions and RoPE) and TP 1 x CP 2 with RoPE (see the module)."""
    _run(_layouts, world=4, timeout_s=500)


def test_rotary_angles_under_cads_layout_continue_across_a_cut():
    """cad_megatron_rope: each token of CAD's layout takes the rotary table's row at its position in its document,
    so a piece cut from its document's middle goes on from offset_in_doc (positions restarting there fail), and a
    table shorter than the longest document is refused naming max_seqlen_q."""
    import cad
    from cad_megatron_cp import CpLayout
    from cad_megatron_rope import rotary_for_layout
    table = torch.randn(64, 1, 1, 8, dtype=torch.float64)
    for rank in cad.pack_documents(FLAT, sum(FLAT) // 2, 2):
        layout = CpLayout(rank.pieces, rank.tokens, positions=rank.position_ids())
        q, k = rotary_for_layout(table, layout)
        at = 0
        for _, doc_len, offset, n in rank.pieces:
            assert torch.equal(q[at:at + n], table[offset:offset + n]) and torch.equal(k[at:at + n], q[at:at + n])
            at += n
    second = cad.pack_documents(FLAT, sum(FLAT) // 2, 2)[1]
    assert second.pieces[0][2] == 28  # the 50-token document goes on at its 28th token on the second rank
    q, _ = rotary_for_layout(table, CpLayout(second.pieces, second.tokens, positions=second.position_ids()))
    assert not torch.equal(q[:1], table[:1]) and torch.equal(q[:1], table[28:29])
    with pytest.raises(ValueError, match="max_seqlen_q must be the longest document"):
        rotary_for_layout(table[:40], CpLayout(second.pieces, second.tokens, positions=second.position_ids()))


@pytest.mark.parametrize("args, message", [
    (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2 / --pipeline-parallel-size 1 need --trainer megatron"),
    (["--pipeline-parallel-size", "2"], "--pipeline-parallel-size 2 need --trainer megatron"),
    (["--trainer", "megatron"], "--trainer megatron needs --device cuda"),
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size 0 / --pipeline-parallel-size 1: expected 1 or more"),
    (["--sequence-parallel"], "--sequence-parallel needs --tensor-parallel-size > 1"),
], ids=["tp-torch", "pp-torch", "megatron-cpu", "zero", "sp-without-tp"])
def test_training_script_refuses_layouts_its_trainer_cannot_run(args, message, capsys):
    """train_gpt_cad.py: tensor and pipeline parallelism train through Megatron's schedules (--trainer megatron,
    CUDA: megatron-core allocates its DDP buffers there); on the CPU's torch trainer they are refused, naming why."""
    import train_gpt_cad
    with pytest.raises(SystemExit) as exit_info:
        train_gpt_cad.parse_args(["--device", "cpu", *args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
