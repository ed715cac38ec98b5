"""Documents longer than a rank in the trainers (--max-doc-len, cad.train.long_docs) and cad.hf: exact against one
process running the same documents unsplit, and memory refused before a step.

- The Llama trainer (cad.train.llama.train_one) on 3 gloo ranks: step 0's documents include two that lie on 2
  ranks, step 1's one that lies on all 3; every balancer (colocated, per_doc_cp, distca, prefix_aware) under DDP,
  prefix_aware under FSDP2 with full activation checkpointing, distca with a sliding window on every other layer
  (and a memory cap that fits). Against one process with local attention over the same stream (every document
  whole on one rank): every rank's losses and every gradient of both steps (fp32).
- cad.hf: a transformers Llama over cad.hf.plan_pieces plans and the layout's position_ids, the loss and every
  gradient against "cad_local" over the whole documents.
- The pipeline trainer (PP 2 x DP 2, CAD over every rank per tick): losses and every stage's gradients against the
  same one process.
- Memory: cad.packing's floor per document by hand and against `cad plan --memory-cap` (its rule, the same
  message); the trainer refuses a layout over --memory-cap on every rank before its step.
Each launch runs all of its cases in one process group (the interpreters and torch start once)."""
import json
import os
import pathlib
import subprocess
import traceback

import pytest
import torch

import harness
import cad
from cad.packing import check_memory_cap, memory_floors

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = pathlib.Path(os.environ.get("CAD_DATA", REPO.parent / "shared" / "data" / "doclen_pretrain.json"))
needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"no Pretrain data at {DATA}")

# 3 ranks of 64 tokens, documents up to 160: seed 4's step 0 has two documents over 2 ranks, step 1 one over all 3.
LONG = ["--max-doc-len", "160", "--steps", "2", "--seed", "4", "--layers", "2", "--hidden", "64", "--intermediate",
        "96", "--timeout-ms", "20000"]
RANKS, TOKENS = 3, 64
WINDOW = ["--window", "8", "--global-every", "2"]
CASES = {f"ddp/{b}": ["--attention", "cad", "--balancer", b, "--parallel", "ddp"]
         for b in ("colocated", "per_doc_cp", "distca", "prefix_aware")}
CASES["fsdp2/full"] = ["--attention", "cad", "--balancer", "prefix_aware", "--parallel", "fsdp2",
                       "--checkpointing", "full"]
CASES["window"] = ["--attention", "cad", "--balancer", "distca", "--parallel", "ddp", *WINDOW,
                   "--memory-cap", "1000000"]
REFERENCES = {"one": [], "one/window": WINDOW}  # one process, local attention, every document whole
REFERENCE_OF = {name: "one/window" if name == "window" else "one" for name in CASES}
CAP = 1000  # bytes: below what document 4 of step 0 needs on any rank (see test_memory_cap_refuses_the_step)


def _gradients(into):
    """on_gradients for train_one: every parameter's gradient after the data-parallel average, by its name in the
    model (DDP's "module." dropped, FSDP2's shards gathered)."""
    def grab(step, model):
        grads = {}
        for name, p in model.named_parameters():
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            grads[name.removeprefix("module.").removeprefix("lm.")] = g.detach().clone()
        into.append(grads)
    return grab


def _train(argv, rank, world, lengths):
    from cad.train.llama import train_one
    from cad.train.llama_args import parse_args
    import contextlib
    import io
    grads = []
    with contextlib.redirect_stdout(io.StringIO()):
        result = train_one(parse_args(argv + ["--data", str(DATA)]), rank, world, torch.device("cpu"), lengths,
                           on_gradients=_gradients(grads))
    return {"losses": [r["losses"] for r in result["steps"]], "loss": [r["loss"] for r in result["steps"]],
            "grads": grads}


def _llama_cases(rank, world, out):
    from cad.train import long_docs
    from cad.train.llama_args import parse_args
    lengths = json.loads(DATA.read_text())
    results = {}
    args = parse_args(LONG + ["--tokens-per-rank", str(TOKENS)])
    results["spans"] = [sorted(len(r) for r in long_docs.long_step(lengths, args, world, step, 0).spans().values())
                        for step in range(2)]
    for name, argv in CASES.items():
        try:
            results[name] = _train(LONG + ["--tokens-per-rank", str(TOKENS)] + argv, rank, world, lengths)
        except Exception:  # noqa: BLE001 -- reported per case (CAD raises on every rank: the ranks stay in step)
            results[name] = {"error": traceback.format_exc()[-3000:]}
    try:
        _train(LONG + ["--tokens-per-rank", str(TOKENS), "--memory-cap", str(CAP)], rank, world, lengths)
        results["refused"] = None
    except cad.CadError as exc:
        results["refused"] = str(exc)
    results["hf"] = _hf_pieces(rank, world)
    if rank == 0:  # one process over the whole stream: the other ranks wait at the harness's closing barrier
        for name, argv in REFERENCES.items():
            results[name] = _train(LONG + ["--tokens-per-rank", str(TOKENS * world), "--attention", "local"] + argv,
                                   0, 1, lengths)
        torch.save(results, out)


def _hf_pieces(rank, world):
    """cad.hf over pieces: per layout, the loss and every gradient of a transformers Llama through plans from
    pieces (cad.hf.plan_pieces) and the layout's position_ids on `world` ranks, summed over the ranks, against
    "cad_local" over the whole documents in this process. Returns the largest differences seen."""
    import cad.hf
    from transformers import AutoModelForCausalLM, LlamaConfig
    cad.init(timeout_ms=20000)  # the defaults again, after the trainer's settings
    cad.hf.register()
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    worst = {"loss": 0.0, "grad": 0.0}
    for lengths in ([30, 60, 102], [5, 180, 7]):  # documents over 2 ranks; one over all 3
        layouts = cad.pack_documents(lengths, TOKENS, world)
        stream = torch.randint(0, 97, (TOKENS * world,), generator=torch.Generator().manual_seed(sum(lengths)))
        runs = []
        for implementation in ("cad", "cad_local"):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation, dtype=torch.float32)
            if implementation == "cad":
                lay = layouts[rank]
                plan = cad.hf.plan_pieces(model, lay.pieces)
                hidden = model.model(input_ids=stream[lay.start:lay.stop][None], position_ids=lay.position_ids()[None],
                                     cad_plan=plan).last_hidden_state
                targets = lay.targets(stream)
            else:  # the whole stream in one call, every document whole
                whole = cad.pack_documents(lengths, TOKENS * world, 1)[0]
                hidden = model.model(input_ids=stream[None], position_ids=whole.position_ids()[None]).last_hidden_state
                targets = whole.targets(stream)
            predicted = TOKENS * world - len(lengths)
            loss = torch.nn.functional.cross_entropy(model.lm_head(hidden)[0], targets, reduction="sum") / predicted
            loss.backward()
            grads = [p.grad for p in model.parameters()]
            if implementation == "cad":  # the ranks' shares added up: the step's loss and gradients
                loss = loss.detach().clone()
                torch.distributed.all_reduce(loss)
                for g in grads:
                    torch.distributed.all_reduce(g)
            runs.append((loss.detach(), grads))
        (loss_a, grads_a), (loss_b, grads_b) = runs
        worst["loss"] = max(worst["loss"], abs(loss_a.item() - loss_b.item()) / abs(loss_b.item()))
        for a, b in zip(grads_a, grads_b):
            worst["grad"] = max(worst["grad"], ((a - b).abs() - 1e-4 * b.abs()).max().item())
    return worst


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    if not DATA.exists():
        pytest.skip(f"no Pretrain data at {DATA}")
    out = tmp_path_factory.mktemp("long") / "cases.pt"
    harness.run(RANKS, _llama_cases, str(out), timeout_s=280, preload=harness.TRANSFORMERS)
    return torch.load(out)


def _result(trained, name):
    assert "error" not in trained[name], f"{name} raised:\n{trained[name]['error']}"
    return trained[name]


def _assert_same_training(got, want, what):
    """Every rank's loss (the ranks' mean: the step's) and every gradient of every step."""
    assert len(got["loss"]) == len(want["loss"]) == 2
    for step, (a, b) in enumerate(zip(got["loss"], want["loss"])):
        assert abs(a - b) <= 1e-5 * abs(b), f"{what} step {step}: loss {a!r} vs {b!r}"
    for step, (ga, gb) in enumerate(zip(got["grads"], want["grads"])):
        assert sorted(ga) == sorted(gb), what
        for name in gb:
            torch.testing.assert_close(ga[name], gb[name], rtol=1e-4, atol=1e-6,
                                       msg=lambda m: f"{what} step {step} gradient {name}: {m}")


@needs_data
def test_the_steps_cut_documents_over_2_and_3_ranks(trained):
    assert trained["spans"][0].count(2) == 2 and max(trained["spans"][0]) == 2
    assert max(trained["spans"][1]) == RANKS


@needs_data
@pytest.mark.parametrize("name", list(CASES))
def test_trains_as_one_process(trained, name):
    got, want = _result(trained, name), _result(trained, REFERENCE_OF[name])
    _assert_same_training(got, want, name)
    assert all(len(losses) == RANKS for losses in got["losses"])


@needs_data
def test_memory_cap_refuses_the_step(trained):
    """Every rank raised before its step: the document, the rank and the bytes, as cad.packing computes them."""
    from cad.train import long_docs
    from cad.train.llama_args import parse_args
    args = parse_args(LONG + ["--tokens-per-rank", str(TOKENS)])
    long = long_docs.long_step(json.loads(DATA.read_text()), args, RANKS, 0, 0)
    worst = max(memory_floors(long.layouts, num_heads=4, num_kv_heads=2, head_dim=16, bytes_per_element=4),
                key=lambda f: f.bytes)
    assert worst.bytes > CAP
    message = trained["refused"]
    assert message is not None, "a step ran over --memory-cap"
    assert f"document {worst.doc_id} ({worst.doc_len} tokens)" in message and f"rank {worst.rank}" in message
    assert f"would receive {worst.bytes} bytes" in message and f"memory cap {CAP} bytes" in message


def test_hf_attends_pieces_as_whole_documents(trained):
    assert trained["hf"]["loss"] <= 1e-5, trained["hf"]
    assert trained["hf"]["grad"] <= 1e-6, trained["hf"]


# ---- the pipeline trainer ------------------------------------------------------------------------------------
PIPE = ["--max-doc-len", "160", "--steps", "2", "--seed", "2", "--layers", "2", "--hidden", "64", "--intermediate",
        "96", "--micro-batches", "2", "--timeout-ms", "20000"]


def _pipeline_case(rank, world, out_dir):
    import contextlib
    import io
    from cad.train import pipeline
    from cad.train.pipeline_args import parse_args
    lengths = json.loads(DATA.read_text())
    argv = PIPE + ["--tokens-per-rank", "64", "--pp", "2", "--attention", "cad", "--pool", "tick", "--data", str(DATA)]
    with contextlib.redirect_stdout(io.StringIO()):
        result = pipeline.train_one(parse_args(argv), rank, world, torch.device("cpu"), lengths, capture_grads=True)
    mine = {"loss": [r["loss"] for r in result["steps"]], "grads": result["grads"]}
    if rank == 0:
        mine["one"] = _train(PIPE + ["--tokens-per-rank", "128", "--attention", "local"], 0, 1, lengths)
    torch.save(mine, os.path.join(out_dir, f"rank{rank}.pt"))


@needs_data
def test_pipeline_trains_as_one_process(tmp_path):
    """PP 2 x DP 2 (rank = stage * 2 + replica), each micro-batch's documents over the 2 replicas of a stage, CAD
    over all 4 ranks per tick: the step's losses and every stage's gradients equal one process's."""
    harness.run(4, _pipeline_case, str(tmp_path), timeout_s=280, preload=harness.TRANSFORMERS)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    want = ranks[0]["one"]
    for rank, got in enumerate(ranks):
        for step, (a, b) in enumerate(zip(got["loss"], want["loss"])):
            assert abs(a - b) <= 1e-5 * abs(b), f"rank {rank} step {step}: loss {a!r} vs {b!r}"
        for step, grads in enumerate(got["grads"]):
            assert grads, f"rank {rank} captured no gradients"
            for name, g in grads.items():
                torch.testing.assert_close(g, want["grads"][step][name], rtol=1e-4, atol=1e-6,
                                           msg=lambda m: f"rank {rank} step {step} gradient {name}: {m}")


# ---- memory: the floor per document, and `cad plan`'s rule -----------------------------------------------------
SHAPE = dict(num_heads=4, num_kv_heads=2, head_dim=8, bytes_per_element=2)  # K/V token 64 bytes, Q+O row 128
KV, Q = 64, 128


def test_memory_floor_by_hand():
    layouts = cad.pack_documents([10, 100, 50], tokens_per_rank=40, ranks=4)  # doc 1: [10, 110) on ranks 0-2
    floors = {f.doc_id: f for f in memory_floors(layouts, **SHAPE)}
    # doc 1's last query (position 99) reads keys [0, 100): rank 2 holds it and keys [70, 100) and would receive 70
    # K/V tokens; rank 1 holds [30, 70) and receives less, 60 K/V tokens and the query row
    assert floors[1].keys == (0, 100) and floors[1].rank == 1 and floors[1].held == 40
    assert floors[1].bytes == 60 * KV + Q
    assert floors[0].bytes == 0  # whole on one rank
    # doc 2 [110, 160) on ranks 2 and 3: rank 3 holds the last query and keys [10, 50) and receives [0, 10); rank 2
    # would receive 40 keys and the query row
    assert (floors[2].rank, floors[2].held, floors[2].bytes) == (3, 40, 10 * KV)
    windowed = {f.doc_id: f for f in memory_floors(layouts, window_size=(20, 0), **SHAPE)}
    assert windowed[1].keys == (79, 100) and windowed[1].bytes == 0  # rank 2 holds the window [79, 100)
    # one document over every rank: the last rank receives all but its own quarter; another rank would also
    # receive the query row
    one = memory_floors(cad.pack_documents([160], 40, 4), **SHAPE)[0]
    assert (one.rank, one.held, one.bytes) == (3, 40, 120 * KV)
    with pytest.raises(cad.CadError, match=r"document 0 \(160 tokens\).*rank 3 \(holding 40 of them\), would "
                                           r"receive 7680 bytes"):
        check_memory_cap(cad.pack_documents([160], 40, 4), 7679, **SHAPE)
    assert check_memory_cap(cad.pack_documents([160], 40, 4), 7680, **SHAPE).bytes == 7680
    assert check_memory_cap(cad.pack_documents([160], 40, 4), 0, **SHAPE).bytes == 7680  # 0: no cap
    with pytest.raises(cad.CadError, match="memory_cap_bytes must be an int in"):
        check_memory_cap(layouts, -1, **SHAPE)
    with pytest.raises(cad.CadError, match="num_kv_heads must be an int in"):
        memory_floors(layouts, **dict(SHAPE, num_kv_heads=0))


CLI = os.environ.get("CAD_CLI")


@pytest.mark.skipif(not CLI, reason="CAD_CLI (the built `cad`) is not set")
@pytest.mark.parametrize("lengths,tokens,ranks,window", [
    ([1 << 14], 2048, 8, -1), ([300, 5000, 700, 9000, 1384], 2048, 8, -1), ([300, 5000, 700, 9000, 1384], 2048, 8, 3000),
    ([3000, 2000, 4000, 7384], 4096, 4, -1)])
def test_memory_rule_is_cad_plans(tmp_path, lengths, tokens, ranks, window):
    """cad.packing's floor refuses where `cad plan --memory-cap` refuses, with the same sentence, one byte below the
    floor; and both take the floor itself."""
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps(lengths))
    shape = dict(num_heads=32, num_kv_heads=8, head_dim=128, bytes_per_element=2)  # `cad plan`'s defaults
    layouts = cad.pack_documents(lengths, tokens, ranks)
    window_size = (window, 0) if window >= 0 else (-1, -1)
    floor = max(memory_floors(layouts, window_size=window_size, **shape), key=lambda f: f.bytes)
    assert floor.bytes > 0
    for cap, refused in ((floor.bytes - 1, True), (floor.bytes, False)):
        argv = [CLI, "plan", "--balancer", "colocated", "--lengths", str(path), "--tokens-per-rank", str(tokens),
                "--ranks", str(ranks), "--memory-cap", str(cap)] + (["--window", str(window)] if window >= 0 else [])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if refused:
            with pytest.raises(cad.CadError) as err:
                check_memory_cap(layouts, cap, window_size=window_size, **shape)
            assert done.returncode == 1, done.stdout
            sentence = str(err.value).split("cad.packing.check_memory_cap: ")[1]
            assert sentence in done.stderr, (sentence, done.stderr)
        else:
            check_memory_cap(layouts, cap, window_size=window_size, **shape)
            assert "no plan of this layout fits" not in done.stderr, done.stderr


# ---- the command lines' refusals ----------------------------------------------------------------------------
def test_options_refused_with_long_documents(capsys):
    from cad.train import long_docs
    from cad.train.llama_args import parse_args
    from cad.train.pipeline_args import parse_args as pipeline_args
    for argv, words in ((["--max-doc-len", "4096", "--ping-pong"], "--max-doc-len does not go with --ping-pong"),
                        (["--max-doc-len", "4096", "--configs", "prefix_aware+pp"], "does not go with --ping-pong"),
                        (["--max-doc-len", "4096", "--balanced-batches"], "does not go with --balanced-batches"),
                        (["--max-doc-len", "0"], "--max-doc-len must be at least 1"),
                        (["--memory-cap", "-1"], "--memory-cap must be at least 0")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert words in capsys.readouterr().err, argv
    with pytest.raises(SystemExit):
        pipeline_args(["--max-doc-len", "4096", "--configs", "local_balanced"])
    assert "does not go with --balanced-batches" in capsys.readouterr().err
    args = parse_args(["--max-doc-len", "4096", "--tokens-per-rank", "512", "--attention", "local"])
    assert args.context == 512 and args.max_doc_len == 4096
    long_docs.refuse_local(args, 1, "train_llama")  # one rank holds every document whole
    with pytest.raises(cad.CadError, match="over 2 ranks needs --attention cad: local attention would attend each"):
        long_docs.refuse_local(args, 2, "train_llama")


def test_memory_cap_reaches_the_balancers():
    """cad.init(memory_cap_bytes=B) is the CAD plugin's memory_cap_bytes (the balancers' cost parameter); 0 leaves it
    out (the plugin's default, no cap); a negative cap is refused naming it."""
    from cad import _settings

    def cad_config(**given):
        config = _settings.stack_config(torch.device("cpu"), _settings.checked(**given))
        return next(i for i in config["instances"] if i["name"] == "cad")["config"]
    assert cad_config(memory_cap_bytes=4096)["memory_cap_bytes"] == 4096
    assert "memory_cap_bytes" not in cad_config()
    with pytest.raises(cad.CadError, match="memory_cap_bytes must be an int in"):
        _settings.checked(memory_cap_bytes=-1)
