"""`cad plan`'s long-document layout (tools/workload/long_docs.h) is cad.pack_documents' rule: the same
pieces for the same lengths, for given batches and for the recipe's sampled stream."""
import json
import os
import subprocess

import pytest

import cad

CAD = os.environ["CAD_EXE"]
DATA = os.environ["CAD_TEST_DATA"]
DIST = os.environ["CAD_TEST_DIST"]


def cli_layout(*args):
    done = subprocess.run([CAD, "plan", "--balancer", "colocated", "--json", "--tasks", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)
    return rep["stream"], [[tuple(p) for p in rank] for rank in rep["pieces"]]


def python_layout(lengths, tokens_per_rank, ranks, **kw):
    return [list(layout.pieces) for layout in cad.pack_documents(lengths, tokens_per_rank, ranks, **kw)]


@pytest.mark.parametrize("name,tokens_per_rank,ranks", [
    ("one_million_scaled.json", 2048, 8), ("one_million_scaled.json", 1000, 16), ("mixed_spans.json", 2048, 8),
    ("mixed_spans.json", 777, 5), ("mixed_spans.json", 32792, 1), ("mixed_spans.json", 1, 64)])
def test_given_lengths(name, tokens_per_rank, ranks):
    path = os.path.join(DATA, name)
    with open(path) as f:
        lengths = json.load(f)
    stream, pieces = cli_layout("--lengths", path, "--tokens-per-rank", str(tokens_per_rank), "--ranks", str(ranks))
    assert stream == lengths[:len(stream)]  # the documents laid out; the rest dropped from the end
    assert pieces == python_layout(lengths, tokens_per_rank, ranks)


@pytest.mark.parametrize("seed,max_doc_len,tokens_per_rank,ranks", [
    (1, 16384, 2048, 8), (2, 65536, 4096, 16), (3, 8192, 8192, 4), (4, 1 << 20, 1 << 17, 8)])
def test_sampled_stream(seed, max_doc_len, tokens_per_rank, ranks):
    stream, pieces = cli_layout("--dist", DIST, "--max-doc-len", str(max_doc_len), "--tokens-per-rank",
                                str(tokens_per_rank), "--ranks", str(ranks), "--seed", str(seed))
    assert max(stream) <= max_doc_len
    assert pieces == python_layout(stream, tokens_per_rank, ranks, max_doc_len=max_doc_len)


@pytest.mark.parametrize("lengths,tokens_per_rank,ranks,max_doc_len", [
    ([1500, 5000, 300, 9000, 700], 2048, 8, 8000),  # a document above max_doc_len
    ([16, 1000], 8, 2, 16),                          # the first document past a full step is checked too
    ([16, 8, 1000], 8, 2, 16),                       # later ones are dropped unchecked
    ([10, 10], 16, 2, None)])                        # too few tokens to fill the ranks
def test_refusals_agree(tmp_path, lengths, tokens_per_rank, ranks, max_doc_len):
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps(lengths))
    args = [CAD, "plan", "--balancer", "colocated", "--json", "--tasks", "--lengths", str(path), "--tokens-per-rank",
            str(tokens_per_rank), "--ranks", str(ranks)]
    if max_doc_len is not None:
        args += ["--max-doc-len", str(max_doc_len)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    try:
        expected = python_layout(lengths, tokens_per_rank, ranks, max_doc_len=max_doc_len)
    except cad.CadError as err:
        assert done.returncode == 1, done.stdout
        message = str(err).split("cad.pack_documents: ")[1]
        assert message in done.stderr, (message, done.stderr)
        return
    assert done.returncode == 0, done.stderr
    assert [[tuple(p) for p in rank] for rank in json.loads(done.stdout)["pieces"]] == expected
