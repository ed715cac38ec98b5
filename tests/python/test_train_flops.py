"""cad.train.flops: causal and windowed (query, key) pairs against counting them, the layers' masks from --window
and --global-every, and the model FLOPs of a step (the trainers' MFU)."""
from cad.train.flops import attention_pairs, causal_cost, layer_windows, masks, model_flops, window_cost
from cad.train.llama_args import parse_args


def _pairs(n, left):
    """(query, key) pairs of one document counted one by one: query p sees keys [max(0, p - left), p]."""
    return sum(p + 1 if left < 0 else min(p, left) + 1 for p in range(n))


def test_pairs_equal_counting_them():
    for n in (0, 1, 2, 7, 64, 100):
        assert causal_cost([n]) == _pairs(n, -1)
        for left in (0, 1, 5, 63, 64, 200):
            assert window_cost([n], left) == _pairs(n, left), (n, left)
    assert window_cost([5, 9, 1], 2) == _pairs(5, 2) + _pairs(9, 2) + _pairs(1, 2)


def test_masks_of_the_layers():
    args = parse_args(["--layers", "6", "--window", "16", "--global-every", "3"])
    assert layer_windows(args) == [16, 16, -1, 16, 16, -1]
    assert masks(args) == [(16, 4), (-1, 2)]
    assert attention_pairs(args, [40, 3]) == 4 * window_cost([40, 3], 16) + 2 * causal_cost([40, 3])


def test_model_flops():
    """MFU's numerator: 6 * P * tokens + 3 * layers * 4 * hidden * causal pairs (module docstring)."""
    args = parse_args(["--hidden", "64", "--heads", "4", "--layers", "3"])
    docs = [[[3, 1], [2]], [[4], [1, 1]]]  # micro-batch, rank, documents
    pairs = 6 + 1 + 3 + 10 + 1 + 1
    assert model_flops(args, 1000, docs) == 6 * 1000 * 12 + 3 * 3 * 4 * 64 * pairs
    # --window 1 --global-every 3: layers 0 and 1 see min(p + 1, 2) keys (3: 1+2+2, 1: 1, 2: 1+2, 4: 1+2+2+2)
    windowed = parse_args(["--hidden", "64", "--heads", "4", "--layers", "3", "--window", "1", "--global-every", "3"])
    assert window_cost([3, 1, 2, 4, 1, 1], 1) == 5 + 1 + 3 + 7 + 1 + 1
    assert window_cost([3, 4], -1) == causal_cost([3, 4]) == window_cost([3, 4], 3)
    assert model_flops(windowed, 1000, docs) == 6 * 1000 * 12 + 3 * 4 * 64 * (2 * 18 + pairs)
