"""cad.train.recipe: the DistCA batch recipe in Python equals the C++ one (host_adapter/workload/batch_recipe.cpp)
as the built `cad plan --dist ... --json --tasks` reports its piece tables, seed by seed; and its own rules
(splitmix64, the balanced twin of a batch, the cache handing out copies)."""
import json
import os
import pathlib
import subprocess

import pytest

from cad.train.flops import causal_cost
from cad.train.recipe import SplitMix64, balanced_documents, cached_batch, recipe_documents, sample_batch

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = pathlib.Path(os.environ.get("CAD_DATA", REPO.parent / "shared" / "data" / "doclen_pretrain.json"))


def _cli():
    """The built `cad` CLI: $CAD_CLI (ctest sets it), else bin/cad beside $CAD_HOST_LIBRARY's lib/."""
    given = os.environ.get("CAD_CLI")
    if given:
        return pathlib.Path(given)
    library = os.environ.get("CAD_HOST_LIBRARY")
    return pathlib.Path(library).resolve().parent.parent / "bin" / "cad" if library else None


def _cpp_batch(dist, context, ranks, seed):
    """Per rank, the piece lengths of the C++ recipe's batch (cad plan's --tasks pieces: [doc, doc_len, offset,
    len])."""
    cli = _cli()
    if cli is None or not cli.is_file():
        pytest.fail(f"no built cad CLI (CAD_CLI={os.environ.get('CAD_CLI')!r}, CAD_HOST_LIBRARY="
                    f"{os.environ.get('CAD_HOST_LIBRARY')!r}): build the `cad` target")
    done = subprocess.run([str(cli), "plan", "--dist", str(dist), "--context", str(context), "--ranks", str(ranks),
                           "--seed", str(seed), "--balancer", "colocated", "--json", "--tasks"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [[piece[3] for piece in rank] for rank in json.loads(done.stdout)["pieces"]]


@pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")
@pytest.mark.parametrize("context,ranks,seed", [(4096, 3, 7), (65536, 2, 1), (65536, 4, 1002), (131072, 8, 3),
                                                (1000, 5, 0)])
def test_python_recipe_equals_the_cpp_one_on_the_pretrain_data(context, ranks, seed):
    lengths = json.loads(DATA.read_text())
    assert sample_batch(lengths, context, ranks, seed) == _cpp_batch(DATA, context, ranks, seed)


def test_python_recipe_equals_the_cpp_one_where_one_pass_does_not_fill(tmp_path):
    """A small length list: one pass of the recipe fills no buffer, so both repeat it with seeds seed + 1, ...;
    a 150000-token document is cut into two 64K chunks (each kept twice) and a remainder."""
    dist = tmp_path / "lengths.json"
    lengths = [150000, 3, 70, 1200, 64, 65536, 9]
    dist.write_text(json.dumps(lengths))
    for context, ranks, seed in ((8192, 4, 5), (100000, 3, 11), (17, 2, 2)):
        assert sample_batch(lengths, context, ranks, seed) == _cpp_batch(dist, context, ranks, seed), \
            (context, ranks, seed)


def test_splitmix64_is_the_published_generator():
    # splitmix64 from state 0: its first outputs as Vigna's reference implementation gives them
    rng = SplitMix64(0)
    assert [rng.next() for _ in range(2)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]
    rng = SplitMix64(1)
    assert all(0 <= rng.uniform() < 1 for _ in range(1000))
    assert sorted({rng.below(3) for _ in range(200)}) == [0, 1, 2]


def test_recipe_documents_cut_long_documents_twice_and_scale():
    # 65536 * 2 + 10: two 64K chunks, each kept twice (four), and the remainder kept with probability 0.9
    docs = recipe_documents([2 * 65536 + 10], 65536, seed=3)
    assert docs.count(65536) == 4 and set(docs) <= {65536, 10}
    half = recipe_documents([2 * 65536 + 10], 32768, seed=3)  # the same stream at context / 64K = 1/2
    assert sorted(half) == sorted(max(1, int(d / 2 + 0.5)) for d in docs)


def test_balanced_twin_keeps_tokens_and_evens_the_work():
    batch = [[4000, 50, 46], [1000] * 4, [2048, 2048]]
    twin = balanced_documents(batch)
    assert [sum(r) for r in twin] == [sum(r) for r in batch]
    work = [causal_cost(r) for r in twin]
    assert max(work) / (sum(work) / len(work)) < max(causal_cost(r) for r in batch) / (
        sum(causal_cost(r) for r in batch) / len(batch))


@pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")
def test_cached_batch_hands_out_copies():
    lengths = json.loads(DATA.read_text())
    first = cached_batch(lengths, 2048, 2, 9)
    first[0].append(12345)
    assert cached_batch(lengths, 2048, 2, 9) == sample_batch(lengths, 2048, 2, 9)
