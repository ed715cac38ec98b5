"""Megatron-Core's context parallelism on CAD: with context_parallel_size 2 on 4 ranks (CP 2 x
DP 2), CadCoreAttention over a rank's THD tokens gives, token for token, the outputs and the gradients (query, key,
value) of one process attending the unsplit documents, for
- Megatron's own THD layout (each document padded at its end to a multiple of 2 * cp, CP rank r holding chunks r
  and 2 * cp - 1 - r; cu_seqlens_q the real lengths, cu_seqlens_q_padded the padded ones): padding tokens are
  never read, their outputs and gradients are zero; plans made by the first layer and attached ahead;
  also no_mask layers, a sliding window, and a micro-batch of which a CP rank holds padding only;
- CAD's layout (cad_megatron_cp.pack_for_context_parallel: the step's documents laid over the data x context
  ranks by cad.pack_documents, no padding), with a document spanning every rank.
(_both_layouts; launched by test_cad_megatron_tp.py with the other 4-rank layouts.)
The training script with --context-parallel-size 2 trains the losses of one process holding the documents whole.
And what CAD cannot do under context parallelism is refused, naming it. CPU, gloo, fp32; skipped where
megatron.core cannot be imported (run_tests.sh installs it)."""
import sys

import pytest
import torch

pytest.importorskip("megatron.core",
                    reason="megatron-core is not installed (pip install megatron-core; run_tests.sh does it)")

from test_cad_megatron import HERE, run_script  # noqa: E402

sys.path.insert(0, str(HERE))
HEADS, GROUPS, HEAD_DIM = 4, 2, 16
# Megatron's layout, per data-parallel replica: documents not multiples of 2 * cp (padded), one of one token (on
# CP rank 0 only), and long ones that every CP rank holds chunks of.
REPLICA_DOCS = [[37, 8, 1, 22], [12, 50, 5]]
TOKENS_PER_RANK = 24


def _config(cp, **changes):
    from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig(num_layers=2, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                             num_query_groups=GROUPS, use_cpu_initialization=True, attention_dropout=0.0,
                             masked_softmax_fusion=False, context_parallel_size=cp, **changes)


def _document(doc_id, length):
    """A document's query, key, value and output gradient, the same on every rank (seeded by its id)."""
    g = torch.Generator().manual_seed(1000 + doc_id)
    shapes = ((length, HEADS, HEAD_DIM), (length, GROUPS, HEAD_DIM), (length, GROUPS, HEAD_DIM),
              (length, HEADS * HEAD_DIM))
    return [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]


def _reference(doc_id, length, mask_kind="causal", left=None):
    """One process's attention over the whole document (float64): output and the q/k/v gradients of
    sum(output * grad). mask_kind causal (left: a sliding window, keys [i - left, i]) or full."""
    q, k, v, grad = _document(doc_id, length)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    rep = HEADS // GROUPS
    kk, vv = (t.repeat_interleave(rep, dim=1) for t in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, kk) / HEAD_DIM ** 0.5
    i = torch.arange(length)
    mask = i[None, :] > i[:, None] if mask_kind == "causal" else torch.zeros(length, length, dtype=torch.bool)
    if left is not None:
        mask |= i[None, :] < i[:, None] - left
    out = torch.einsum("hqk,khd->qhd", scores.masked_fill(mask, float("-inf")).softmax(-1), vv).reshape(length, -1)
    (out * grad).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


def _rank_tokens(tokens):
    """The layer's inputs for a rank's tokens, `tokens` a list of (doc_id, doc_len, position) or None (padding:
    large values, which CAD must never read)."""
    g = torch.Generator().manual_seed(7)
    cols = [[], [], [], []]
    docs = {}
    for t in tokens:
        if t is None:
            rows = [torch.randn(*s, generator=g, dtype=torch.float64) * 1e3 for s in
                    ((HEADS, HEAD_DIM), (GROUPS, HEAD_DIM), (GROUPS, HEAD_DIM), (HEADS * HEAD_DIM,))]
        else:
            doc_id, length, pos = t
            if doc_id not in docs:
                docs[doc_id] = _document(doc_id, length)
            rows = [x[pos] for x in docs[doc_id]]
        for col, row in zip(cols, rows):
            col.append(row)
    q, k, v, grad = (torch.stack(c).float() for c in cols)
    return [t.requires_grad_() for t in (q, k, v)], grad


def _check(rank, what, layer, tokens, packed, **reference):
    """The layer's outputs and gradients on this rank's tokens equal the whole documents' reference."""
    (q, k, v), grad = _rank_tokens(tokens)
    out = layer(q, k, v, None, packed_seq_params=packed)
    assert out.shape == (len(tokens), HEADS * HEAD_DIM), f"rank {rank} {what}: output shape {tuple(out.shape)}"
    (out * grad).sum().backward()
    refs = {}
    for i, t in enumerate(tokens):
        got = (out[i], q.grad[i], k.grad[i], v.grad[i])
        if t is None:
            for name, x in zip(("output", "dq", "dk", "dv"), got):
                assert torch.count_nonzero(x) == 0, f"rank {rank} {what}: padding token {i}'s {name} is not zero"
            continue
        doc_id, length, pos = t
        if doc_id not in refs:
            refs[doc_id] = _reference(doc_id, length, **reference)
        for name, x, ref in zip(("output", "dq", "dk", "dv"), got, refs[doc_id]):
            want = ref[pos].reshape(x.shape).float()
            torch.testing.assert_close(x.detach(), want, rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"rank {rank} {what}: document {doc_id} position {pos} "
                                                     f"{name}: {m}")
    return refs


def _megatron_tokens(docs, cp, cp_rank, replica):
    """Megatron's THD context-parallel layout of CP rank cp_rank (the test's own statement of it): each document
    padded at its end to a multiple of 2 * cp, chunks cp_rank and 2 * cp - 1 - cp_rank of each."""
    tokens, padded = [], []
    for i, length in enumerate(docs):
        size = -(-length // (2 * cp)) * 2 * cp
        padded.append(size)
        chunk = size // (2 * cp)
        for j in (cp_rank, 2 * cp - 1 - cp_rank):
            for pos in range(j * chunk, (j + 1) * chunk):
                tokens.append((replica << 32 | i, length, pos) if pos < length else None)
    return tokens, padded


def _cumulated(lengths):
    return torch.tensor([0] + list(lengths), dtype=torch.int32).cumsum(0, dtype=torch.int32)


def _setup(cp):
    from megatron.core import parallel_state as ps
    import cad_megatron
    ps.initialize_model_parallel(1, 1, context_parallel_size=cp)
    cad_megatron.init_cad(timeout_ms=60000)
    return ps.get_context_parallel_rank(), ps.get_data_parallel_rank()


def _megatron_layout_equals_whole_documents(cp, rank, world):
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.enums import AttnMaskType
    from cad_megatron import CadCoreAttention, attach_plan
    cp_rank, replica = _setup(cp)
    docs = REPLICA_DOCS[replica]
    tokens, padded = _megatron_tokens(docs, cp, cp_rank, replica)
    cu, cu_padded = _cumulated(docs), _cumulated(padded)
    layer = CadCoreAttention(_config(cp), 1, AttnMaskType.causal, "self")

    def packed():
        return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu.clone(), cu_seqlens_kv=None,
                               cu_seqlens_q_padded=cu_padded.clone(), cu_seqlens_kv_padded=None,
                               max_seqlen_q=max(docs), max_seqlen_kv=max(docs))

    first = packed()  # the plan made by the first layer's call, then reused by the second layer's
    _check(rank, "Megatron's layout, plan made by the layer", layer, tokens, first)
    layer2 = CadCoreAttention(_config(cp), 2, AttnMaskType.causal, "self")
    _check(rank, "Megatron's layout, second layer", layer2, tokens, first)
    attached = attach_plan(packed(), _config(cp), cu_seqlens_host=cu, cu_seqlens_padded_host=cu_padded,
                           ahead=True, tag=0)
    _check(rank, "Megatron's layout, plan attached ahead", layer, tokens, attached)
    assert attached.cad_plan.stats is not None and len(attached.cad_plan.stats["servers"]) == world, \
        f"rank {rank}: the plan spans {attached.cad_plan.stats} servers, not the {world} data x context ranks"

    # Documents that are multiples of 2 * cp need no cu_seqlens_q_padded.
    even = [4 * cp, 6 * cp]
    even_tokens, _ = _megatron_tokens(even, cp, cp_rank, replica)
    p = PackedSeqParams(qkv_format="thd", cu_seqlens_q=_cumulated(even), cu_seqlens_kv=None,
                        max_seqlen_q=max(even), max_seqlen_kv=max(even))
    _check(rank, "Megatron's layout without padding", layer, even_tokens, p)

    # Full (no_mask) attention and a sliding window through plans from the same pieces.
    full = CadCoreAttention(_config(cp), 1, AttnMaskType.no_mask, "self")
    _check(rank, "Megatron's layout, no_mask", full, tokens, packed(), mask_kind="full")
    windowed = CadCoreAttention(_config(cp, window_size=(5, 0)), 1, AttnMaskType.causal, "self")
    _check(rank, "Megatron's layout, window 5", windowed, tokens, packed(), left=5)
    # A micro-batch of which CP rank 1 holds only padding (one 1-token document per replica).
    lone_tokens, lone_padded = _megatron_tokens([1], cp, cp_rank, replica)
    lone = PackedSeqParams(qkv_format="thd", cu_seqlens_q=_cumulated([1]), cu_seqlens_q_padded=_cumulated(lone_padded),
                           max_seqlen_q=1, max_seqlen_kv=1)
    _check(rank, "Megatron's layout, a rank of padding only", layer, lone_tokens, lone)

    # What CAD cannot compute under context parallelism is refused, naming it.
    q, k, v = _rank_tokens(tokens)[0]
    with pytest.raises(ValueError, match="context_parallel_size 2 without packed_seq_params"):
        layer(q[:, None], k[:, None], v[:, None], None)
    with pytest.raises(ValueError, match="an attention_mask with packed_seq_params"):
        layer(q, k, v, torch.zeros(1, 1, len(tokens), len(tokens), dtype=torch.bool), packed_seq_params=packed())
    with pytest.raises(ValueError, match=f"the layer got {len(tokens) - 1} tokens"):
        layer(q[1:], k[1:], v[1:], None, packed_seq_params=packed())
    bad = packed()
    bad.cu_seqlens_q_padded = _cumulated([p + 1 for p in padded])
    with pytest.raises(ValueError, match=f"document 0 holds {padded[0] + 1} tokens in cu_seqlens_q_padded, not a "
                                         f"multiple of 2 \\* context_parallel_size = {2 * cp}"):
        layer(q, k, v, None, packed_seq_params=bad)
    with pytest.raises(ValueError, match="arbitrary is not supported"):
        CadCoreAttention(_config(cp), 1, AttnMaskType.arbitrary, "self")
    if world % 3:
        with pytest.raises(ValueError, match=f"context_parallel_size 3 does not divide the world size {world}"):
            CadCoreAttention(_config(3), 1, AttnMaskType.causal, "self")
    if world % (2 * cp) == 0:  # a config that disagrees with parallel_state
        with pytest.raises(ValueError, match=f"context_parallel_size {2 * cp} but parallel_state's context-parallel "
                                             f"group has {cp} ranks"):
            CadCoreAttention(_config(2 * cp), 1, AttnMaskType.causal, "self")

def _cad_layout_equals_whole_documents(cp, rank, world):
    """After _megatron_layout_equals_whole_documents, on the same ranks (parallel_state and CAD set up)."""
    from megatron.core.transformer.enums import AttnMaskType
    from cad_megatron import CadCoreAttention
    from cad_megatron_cp import pack_for_context_parallel
    # The step's documents over all world ranks, no padding: document 1 spans every rank.
    lengths = [5, TOKENS_PER_RANK * world - 10, 3, 9]
    layer = CadCoreAttention(_config(cp), 1, AttnMaskType.causal, "self")
    for what, attach in (("plan made by the layer", {}), ("plan attached ahead", {"config": _config(cp), "tag": 1})):
        mine, packed = pack_for_context_parallel(lengths, TOKENS_PER_RANK, **attach)
        assert mine.tokens == TOKENS_PER_RANK and packed.cu_seqlens_q_padded is None
        tokens = [(doc, length, offset + j) for doc, length, offset, n in mine.pieces for j in range(n)]
        assert [t[2] for t in tokens] == mine.position_ids().tolist(), f"rank {rank}: positions not continuous"
        refs = _check(rank, f"CAD's layout, {what}", layer, tokens, packed)
        assert 1 in refs, f"rank {rank} holds none of document 1, which should span every rank"


def _both_layouts(cp, rank, world):
    _megatron_layout_equals_whole_documents(cp, rank, world)
    _cad_layout_equals_whole_documents(cp, rank, world)


# Run at CP 2 x DP 2 (CP 2 alone is its one-replica case) by test_cad_megatron_tp.py, in the same 4-rank launch as
# the tensor and pipeline parallel layouts: starting ranks that import megatron-core is most of the cost.


def test_megatron_layout_maps_chunks_to_pieces():
    from cad_megatron_cp import megatron_layout
    # cp 2: a 6-token document padded to 8 (chunks of 2): rank 0 holds [0, 2) and [6, 8) (padding),
    # rank 1 [2, 4) and [4, 6); a 1-token document padded to 4: rank 0 its token and padding, rank 1 padding only.
    cu, padded = [0, 6, 7], [0, 8, 12]
    r0 = megatron_layout(cu, padded, 2, 0, replica=1)
    assert r0.pieces == ((1 << 32, 6, 0, 2), (1 << 32 | 1, 1, 0, 1)) and r0.tokens == 6
    assert r0.real.tolist() == [0, 1, 4]
    r1 = megatron_layout(cu, padded, 2, 1, replica=1)
    assert r1.pieces == ((1 << 32, 6, 2, 2), (1 << 32, 6, 4, 2)) and r1.tokens == 6
    assert r1.real.tolist() == [0, 1, 2, 3]
    assert megatron_layout([0, 8], None, 2, 1, replica=0).real is None
    with pytest.raises(ValueError, match="document 0 holds 6 tokens in cu_seqlens_q \\(no cu_seqlens_q_padded\\)"):
        megatron_layout([0, 6], None, 2, 0, replica=0)
    with pytest.raises(ValueError, match="document 1 has 9 tokens \\(cu_seqlens_q\\) but 4 padded"):
        megatron_layout([0, 6, 15], [0, 8, 12], 2, 0, replica=0)
    with pytest.raises(ValueError, match="cu_seqlens_q_padded has 1 documents, cu_seqlens_q 2"):
        megatron_layout([0, 6, 7], [0, 8], 2, 0, replica=0)
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0"):
        megatron_layout([1, 6], None, 2, 0, replica=0)


def _train(tmp_path, name, world, *args):
    """train_gpt_cad.py's command line on `world` ranks (test_cad_megatron.run_script: forked ranks, as torchrun
    starts them; the script under torchrun itself is test_cad_megatron's training test)."""
    import json
    data = tmp_path / "lengths.json"
    # Long documents (the recipe scales them by context / 64K): many span both ranks' tokens.
    data.write_text(json.dumps([65536, 30000, 5000, 40000, 2000, 52000, 900, 12000] * 4))
    out = tmp_path / name
    out.mkdir()
    run_script(HERE / "train_gpt_cad.py", ["--device", "cpu", "--steps", "2", "--micro-batches", "2", "--data",
                                          str(data), "--hidden", "64", "--ffn", "128",
                                          "--json-out", str(tmp_path / f"{name}_{{config}}.json"), *args], world, out)
    return json.loads((tmp_path / f"{name}_cad.json").read_text())


def test_training_script_with_context_parallelism_trains_one_process_losses(tmp_path):
    """train_gpt_cad.py --context-parallel-size 2 on 2 ranks (each micro-batch's documents laid over both ranks,
    cut at 256 tokens) trains the losses of one process holding the same documents whole (--layout cad, 512), with
    RoPE. (At this model's size positions restarting at a cut move the mean loss by less than the tolerance:
    test_cad_megatron_tp.py's per-document losses are the check that tells them apart.)"""
    rope = ["--configs", "cad", "--position-embedding", "rope"]
    cp = _train(tmp_path, "cp", 2, *rope, "--context-parallel-size", "2", "--context", "256")
    one = _train(tmp_path, "one", 1, *rope, "--layout", "cad", "--context", "512")
    assert cp["summary"]["context_parallel_size"] == 2 and cp["summary"]["ranks"] == 2
    got, want = cp["summary"]["losses"], one["summary"]["losses"]
    assert len(got) == len(want) == 2
    assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(got, want)), (got, want)
    assert all(s["imbalance"] is not None for s in cp["steps"])
    # The micro-batches' documents (the script's recipe, its default seed 1): some cross the cut at 256 tokens.
    import json
    import train_gpt_cad
    lengths = json.loads((tmp_path / "lengths.json").read_text())
    for step in range(2):
        for index in range(2):
            docs = train_gpt_cad._recipe().cached_batch(lengths, 512, 1, 1 + 1000 * step + index)[0]
            starts = [sum(docs[:i]) for i in range(len(docs))]
            assert any(a < 256 < a + n for a, n in zip(starts, docs)), (step, index, docs)


@pytest.mark.parametrize("args, message", [
    (["--context-parallel-size", "2", "--configs", "megatron,cad"],
     "--configs ['megatron'] with --layout cad / --context-parallel-size 2"),
    (["--context-parallel-size", "2", "--layout", "rank"], "--layout rank with --context-parallel-size 2"),
    (["--context-parallel-size", "0"], "--context-parallel-size 0: expected 1 or more"),
], ids=["megatron-attention", "rank-layout", "zero"])
def test_training_script_refuses_what_context_parallelism_cannot_train(args, message, capsys):
    import train_gpt_cad
    with pytest.raises(SystemExit) as exit_info:
        train_gpt_cad.parse_args(["--device", "cpu", *args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
