"""cad.train.nano: ping-pong's split policy -- the document boundary nearest half a rank's tokens, the heavier
half (causal work) first on every rank, nobody split when one rank cannot be, and the buffer's tokens moved
whole-document into the order the nano-batches run."""
import torch

from cad.train.batches import make_inputs
from cad.train.flops import causal_cost
from cad.train.nano import nano_batches, run_order, split_point


def test_split_at_the_document_boundary_nearest_half():
    assert split_point([100, 10, 10, 100]) == 2             # 110 | 110
    assert split_point([300, 10, 200]) == 1                 # 300 | 210 is nearer half (255) than 310 | 200
    assert split_point([10, 20, 30, 300]) == 3              # the long last document alone
    assert split_point([5, 5]) == 1 and split_point([7]) is None and split_point([]) is None
    assert split_point([4, 2, 4]) == 1                      # 4 | 6 and 6 | 4 tie: the first boundary
    # the heavier half (causal work) runs first: rank 0's [3, 4] (16) before [5] (15), rank 1's [9] before [1]
    assert nano_batches([[3, 4, 5], [1, 9]], True) == [[[3, 4], [5]], [[9], [1]]]
    # one rank with one document: nobody splits (the plans are collective), the buffers stay whole
    assert nano_batches([[3, 4, 5], [12]], True) == [[[3, 4, 5]], [[12]]]
    assert nano_batches([[3, 4, 5], [1, 9]], False) == [[[3, 4, 5]], [[1, 9]]]


def test_run_order_moves_whole_documents():
    """The buffer's tokens in the order the nano-batches run: unchanged where the first half runs first; else the
    second half's documents first, each document's tokens, positions and labels kept together."""
    docs = [3, 4, 5, 2]
    inputs = make_inputs(docs, 100, 1, torch.device("cpu"))
    nanos = nano_batches([docs], True)[0]
    assert nanos == [[5, 2], [3, 4]]  # 15 + 3 against 6 + 10: the buffer's second half runs first
    moved = run_order(inputs, docs, nanos)
    for key in ("input_ids", "position_ids", "labels"):
        assert torch.equal(moved[key], torch.cat([inputs[key][:, 7:], inputs[key][:, :7]], dim=1)), key
    assert moved["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 0, 1, 2, 0, 1, 2, 3]]
    assert (moved["labels"][0, [0, 5, 7, 10]] == -100).all()  # every document's first token still predicts nothing
    first_heavy = make_inputs([5, 2, 3, 4], 100, 1, torch.device("cpu"))
    kept = nano_batches([[5, 2, 3, 4]], True)[0]
    assert kept == [[5, 2], [3, 4]] and run_order(first_heavy, [5, 2, 3, 4], kept) is first_heavy


def test_halves_keep_every_document_and_the_heavier_runs_first():
    """Over many random buffers: the two halves are the buffer's documents in order (cut once, nothing lost or
    reordered inside a half) and the first to run is never the lighter one."""
    g = torch.Generator().manual_seed(3)
    for _ in range(200):
        ranks = [[int(n) for n in torch.randint(1, 300, (int(torch.randint(2, 9, (1,), generator=g)),),
                                                generator=g)] for _ in range(3)]
        for docs, (first, second) in zip(ranks, nano_batches(ranks, True)):
            k = split_point(docs)
            assert sorted([first, second]) == sorted([docs[:k], docs[k:]])
            assert causal_cost(first) >= causal_cost(second)
