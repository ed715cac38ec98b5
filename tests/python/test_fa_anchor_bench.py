"""bench/kernels/fa_anchor_bench.py's FlexAttention implementation: its block mask keeps each query to its own
document's keys at or before it (and, with a window, the `left` before it), over a packed buffer with GQA. Checked
on the CPU, forward only (FlexAttention has no backward there), against attention computed document by document
and head by head; the bench's GPU runs time its backward too."""
import math
import pathlib

import pytest
import torch
from script_module import load_script

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "kernels" / "fa_anchor_bench.py"


def load_bench():
    return load_script(BENCH)


def reference(q, k, v, lengths, left):
    """Causal attention per document (bottom-right = top-left: queries and keys are the same rows), GQA by index."""
    out = torch.zeros_like(q)
    group = q.shape[1] // k.shape[1]
    start = 0
    for n in lengths:
        rows = torch.arange(n)
        keep = rows[None, :] <= rows[:, None]
        if left is not None:
            keep &= rows[:, None] - rows[None, :] <= left
        for h in range(q.shape[1]):
            s = q[start:start + n, h] @ k[start:start + n, h // group].T / math.sqrt(q.shape[2])
            out[start:start + n, h] = torch.softmax(s.masked_fill(~keep, -math.inf), -1) @ v[start:start + n, h // group]
        start += n
    return out


@pytest.mark.parametrize("left", [None, 5])
def test_flex_matches_attention_per_document(left):
    bench = load_bench()
    flex = bench.Flex(torch.device("cpu"))
    if flex.unavailable:
        pytest.skip(flex.unavailable)
    lengths = [37, 100, 1, 90]  # a one-token document, and lengths off FlexAttention's 128-row blocks
    g = torch.Generator().manual_seed(1)
    t = sum(lengths)
    q, k, v = (torch.randn(t, h, 64, generator=g) for h in (4, 2, 2))
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    inputs, fn, note = flex.prepare(q, k, v, cu, max(lengths), left)
    assert note == "compiled, block mask"
    got = fn(*inputs)
    assert got.shape == q.shape
    want = reference(q, k, v, lengths, left)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()


def test_flex_is_one_of_the_implementations():
    bench = load_bench()
    assert "flex" in bench.IMPLS
    assert bench.make_impl("flex", torch.device("cpu")).name == "flex"


def test_dry_run_samples_the_pretrain_buffers_without_cad_on_the_path(tmp_path):
    """The Pretrain cases come from cad's recipe: the bench puts the package on sys.path itself (a GPU run's
    environment has only FA4 on PYTHONPATH), before it samples them."""
    import json
    import os
    import subprocess
    import sys
    data = tmp_path / "doclen.json"
    data.write_text(json.dumps([3000, 500, 12000, 800, 64, 7000] * 50))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, str(BENCH), "--dry-run", "--data", str(data), "--contexts", "16384",
                          "--head-dims", "128", "--dense", "4096", "--window-dense", "4096"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if "Pretrain buffers of 16K" in line]
    assert len(lines) == 2, out.stdout  # without and with the window
    assert all("docs [" in line and "sampling" not in line for line in lines), out.stdout


def test_the_next_round_is_guessed_without_the_first_rounds_one_time_work():
    bench = load_bench()
    # A first round of 218 s, 120 s of it warm-up calls (compiles) and output checks: the next one takes ~98 s.
    assert bench.next_round_guess(218.0, 120.0) == pytest.approx(98.0)
    assert bench.next_round_guess(100.0, 0.0) == pytest.approx(100.0)  # later rounds: their own time
    # Never below a tenth of the round: the first timed calls still carry some of the compile cost.
    assert bench.next_round_guess(100.0, 99.5) == pytest.approx(10.0)


def test_measure_books_its_warmup_calls_on_the_clock():
    bench = load_bench()
    x = torch.randn(64, 8, requires_grad=True)

    def slow(q):  # each call costs a few ms, so that the warm-up's share is measurable
        out = q
        for _ in range(200):
            out = out * 1.0001
        return out

    clock = {}
    f, b = bench.measure(torch, torch.device("cpu"), slow, (x,), torch.ones(64, 8), 3, 1, True, clock)
    assert f > 0 and b > 0
    assert clock["once_s"] > 0
    before = clock["once_s"]
    bench.measure(torch, torch.device("cpu"), slow, (x,), torch.ones(64, 8), 0, 1, True, clock)
    assert clock["once_s"] == before  # no warm-up calls, nothing booked
