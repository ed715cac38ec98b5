"""cad.pack_documents: documents longer than one rank's tokens cut at rank boundaries and attended whole.

The layout's own rules on one process (pieces, positions, labels across a cut, refusals), then CAD over the
pieces on 2-4 gloo ranks against one process attending the same documents unsplit: O and every gradient, for
every balancer, with a document spanning 2, 3 and all ranks, causal, full and with a sliding window."""
import pytest
import torch

import harness
from reference import sdpa_varlen, sdpa_varlen_window

import cad
from cad.packing import IGNORE_INDEX


def _check_covers(layouts, lengths, tokens_per_rank):
    at = 0
    for r, lay in enumerate(layouts):
        assert (lay.rank, lay.start, lay.stop) == (r, r * tokens_per_rank, (r + 1) * tokens_per_rank)
        assert sum(p[3] for p in lay.pieces) == tokens_per_rank
        for doc_id, doc_len, offset, n in lay.pieces:
            assert n > 0 and 0 <= offset and offset + n <= doc_len
            at += n
    # Concatenated in rank order, the pieces are the documents in order, each exactly once.
    flat = [p for lay in layouts for p in lay.pieces]
    seen = {}
    for doc_id, doc_len, offset, n in flat:
        assert seen.get(doc_id, 0) == offset, (doc_id, offset)
        seen[doc_id] = offset + n
    for doc_id, end in seen.items():
        assert end == flat[[p[0] for p in flat].index(doc_id)][1]
        assert end <= lengths[doc_id]
    assert at == tokens_per_rank * len(layouts)


def test_a_document_spans_ranks_and_keeps_its_positions():
    lengths = [5, 37, 9, 3, 50, 6]
    layouts = cad.pack_documents(lengths, tokens_per_rank=20, ranks=4)
    _check_covers(layouts, lengths, 20)
    # document 1 (37 tokens from token 5) lies on ranks 0, 1 and 2
    holders = [lay.rank for lay in layouts if any(p[0] == 1 for p in lay.pieces)]
    assert holders == [0, 1, 2]
    assert layouts[1].pieces == ((1, 37, 15, 20),)
    assert layouts[1].position_ids().tolist() == list(range(15, 35))
    positions = torch.cat([lay.position_ids() for lay in layouts])
    want = torch.cat([torch.arange(n) for n in [5, 37, 9, 3, 26]])  # the last document keeps what fits
    assert torch.equal(positions, want)
    assert layouts[2].pieces[-1] == (4, 26, 0, 6) and layouts[3].pieces == ((4, 26, 6, 20),)


def test_labels_cross_the_cut_and_stop_at_each_document():
    lengths = [30, 7, 3]
    layouts = cad.pack_documents(lengths, tokens_per_rank=20, ranks=2)
    stream = torch.arange(1000, 1040)
    t0, t1 = layouts[0].targets(stream), layouts[1].targets(stream)
    assert t0[-1].item() == 1020  # rank 0's last token predicts rank 1's first: document 0 goes on
    whole = torch.cat([t0, t1])
    ends = {29, 36, 39}  # each document's last token predicts nothing
    for i in range(40):
        assert whole[i].item() == (IGNORE_INDEX if i in ends else 1000 + i + 1), i
    with pytest.raises(cad.CadError, match="at least 40 tokens"):
        layouts[1].targets(stream[:39])


def test_one_document_over_every_rank():
    layouts = cad.pack_documents([100], tokens_per_rank=25, ranks=4)
    assert [lay.pieces for lay in layouts] == [((0, 100, 25 * r, 25),) for r in range(4)]
    assert [lay.cu_seqlens().tolist() for lay in layouts] == [[0, 25]] * 4


def test_refusals_name_what_is_wrong():
    with pytest.raises(cad.CadError, match="cannot fill 2 ranks"):
        cad.pack_documents([10, 5], tokens_per_rank=10, ranks=2)
    with pytest.raises(cad.CadError, match="document 1 has 40 tokens, above max_doc_len 32"):
        cad.pack_documents([8, 40], tokens_per_rank=24, ranks=2, max_doc_len=32)
    with pytest.raises(cad.CadError, match="document 1 has length 0"):
        cad.pack_documents([8, 0, 40], tokens_per_rank=24, ranks=2)
    with pytest.raises(cad.CadError, match=r"lengths\[0\] must be an int, got float 8.5"):
        cad.pack_documents([8.5, 40], tokens_per_rank=24, ranks=2)
    with pytest.raises(cad.CadError, match="tokens_per_rank must be an int, got str '24'"):
        cad.pack_documents([48], tokens_per_rank="24", ranks=2)
    with pytest.raises(cad.CadError, match="drop_remainder=False"):
        cad.pack_documents([30, 30], tokens_per_rank=24, ranks=2, drop_remainder=False)
    exact = cad.pack_documents([30, 18], tokens_per_rank=24, ranks=2, drop_remainder=False)
    assert exact[1].pieces == ((0, 30, 24, 6), (1, 18, 0, 18))


# ---- CAD over the pieces, against one process attending the whole documents ------------------------------
HQ, HKV, D = 4, 2, 8


def _stream(total, seed=7):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(total, HQ, D, generator=g)
    k = torch.randn(total, HKV, D, generator=g)
    v = torch.randn(total, HKV, D, generator=g)
    d_o = torch.randn(total, HQ, D, generator=g)
    return q, k, v, d_o


def _unsplit(lengths, causal, window):
    """O, dQ, dK, dV of the whole stream, document by document, in one process."""
    q, k, v, d_o = _stream(sum(lengths))
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if window == (-1, -1):
        o = sdpa_varlen(*leaves, cu, causal)
    else:
        o = sdpa_varlen_window(*leaves, cu, causal, window)
    o.backward(d_o)
    return [o.detach()] + [t.grad for t in leaves]


def _check_pieces(rank, world, lengths, tokens_per_rank, balancer, causal, window):
    cad.init(balancer=balancer, timeout_ms=20000)
    layouts = cad.pack_documents(lengths, tokens_per_rank=tokens_per_rank, ranks=world)
    mine = layouts[rank]
    kept = [p[1] for lay in layouts for p in lay.pieces if p[2] == 0]  # the documents as packed
    want = [t[mine.start:mine.stop] for t in _unsplit(kept, causal, window)]
    q, k, v, d_o = (t[mine.start:mine.stop] for t in _stream(sum(kept)))
    plan = cad.plan_pieces(list(mine.pieces), causal=causal, window_size=window)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = cad.varlen_attn(*leaves, None, plan=plan, causal=causal, window_size=window)
    o.backward(d_o)
    got = [o.detach()] + [t.grad for t in leaves]
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5,
                                   msg=lambda m: f"rank {rank} {balancer} causal={causal} window={window} {name}: {m}")


def _check_cases(rank, world, cases):
    """Every case (lengths, tokens_per_rank, balancer, causal, window) in this one process group."""
    for case in cases:
        _check_pieces(rank, world, *case)


# 2 ranks: document 1 spans both; 3 ranks: document 1 spans all three; 4 ranks: documents over 2 and 3 ranks.
CASES = {2: ([9, 40, 7], 24), 3: ([4, 50, 8], 20), 4: ([5, 37, 9, 3, 50, 6], 20)}


def test_pieces_over_ranks_match_one_process():
    """Every balancer, in one launch of 3 ranks: document 1 spans all three."""
    lengths, tokens = CASES[3]
    harness.run(3, _check_cases, [(lengths, tokens, balancer, True, (-1, -1))
                                  for balancer in ("colocated", "per_doc_cp", "distca", "prefix_aware")])


def test_two_ranks():
    lengths, tokens = CASES[2]
    harness.run(2, _check_pieces, lengths, tokens, "prefix_aware", True, (-1, -1))


def test_four_ranks_full_and_windowed():
    lengths, tokens = CASES[4]
    harness.run(4, _check_cases, [(lengths, tokens, "prefix_aware", False, (-1, -1)),
                                  (lengths, tokens, "prefix_aware", True, (6, 0))])
