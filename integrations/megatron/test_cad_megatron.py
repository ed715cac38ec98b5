"""CAD as Megatron-Core's core attention, on 2 ranks: a Megatron-Core GPTModel (local layer spec, 2 layers, GQA) whose
core attention is CadCoreAttention gives the loss and every gradient of the same model with Megatron-Core's own
DotProductAttention run per document, on packed THD micro-batches of very unequal documents, with the plan made
by the first layer, attached by the loop (ahead and now), and without plans (local); the [s, b] path without
packed_seq_params equals DotProductAttention with its causal mask; sliding-window layers (every other layer)
equal attention with Megatron's window mask, one plan per window kind; the training script trains the same
losses with Megatron's attention and with CAD.

CPU (default): gloo, fp32, learned absolute positions (Megatron-Core's RoPE needs CUDA). With
CAD_MEGATRON_DEVICE=cuda (2 GPUs): NCCL, bf16, RoPE, tolerances for bf16. Skipped where megatron.core cannot be
imported (run_tests.sh installs megatron-core from PyPI into a virtual environment first)."""
import datetime
import json
import os
import pathlib
import runpy
import socket
import subprocess
import sys
import traceback

import pytest
import torch

megatron_core = pytest.importorskip(
    "megatron.core", reason="megatron-core is not installed (pip install megatron-core; run_tests.sh does it)")

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
DEVICE = os.environ.get("CAD_MEGATRON_DEVICE", "cpu")
# Per rank: very unequal documents, so that the balancer moves work between the ranks.
DOCS = [[40, 3, 1, 20], [5, 6, 7, 8, 1, 29, 2]]
VOCAB = 97
HEAD_DIM = 64 if DEVICE == "cuda" else 16  # CAD's CUDA kernels take head dims 64 and 128

if DEVICE == "cuda" and torch.cuda.device_count() < 2:
    pytest.skip(f"CAD_MEGATRON_DEVICE=cuda needs 2 GPUs, torch sees {torch.cuda.device_count()}",
                allow_module_level=True)


# ---- two ranks ----------------------------------------------------------------------------------------------
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, body, errors):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        body(rank, world)
    except BaseException:  # noqa: BLE001 -- reported to the parent
        errors.put((rank, traceback.format_exc()))
        raise
    finally:
        import cad
        import cad_megatron
        cad_megatron.shutdown_cad()
        cad.shutdown()
        dist.barrier()
        dist.destroy_process_group()


# What every rank imports before it runs CAD: on the CPU the ranks fork from a server that imported these once
# (a spawned rank imports torch and megatron.core again: seconds of CPU each, on CI's 2 cores most of a case).
# Nothing CAD-specific: the package, its library and its threads start in each rank.
PRELOAD = ("torch", "torch.distributed", "torch.nn.attention.varlen", "megatron.core", "megatron.core.parallel_state",
           "megatron.core.tensor_parallel", "megatron.core.models.gpt", "megatron.core.models.gpt.gpt_layer_specs",
           "megatron.core.transformer.transformer_config", "megatron.core.distributed", "megatron.core.optimizer",
           "megatron.core.pipeline_parallel")


def _context():
    """Forked from that server on the CPU; spawned on CUDA (a process that imported megatron.core may have
    initialised CUDA, which a fork cannot carry)."""
    import torch.multiprocessing as mp
    if DEVICE == "cuda":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # read when the server starts: the suite's first run
    return ctx


def _script_rank(rank, world, port, script, argv, out_dir):
    """One rank of `script` run as its command line runs it (its __main__, sys.argv, a launcher's environment),
    its stdout and stderr (file descriptors 1 and 2) in out_dir; its exit status is the process's."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    for fd, name in ((1, "stdout"), (2, "stderr")):
        with open(os.path.join(out_dir, f"{name}{rank}.txt"), "w") as f:
            os.dup2(f.fileno(), fd)
    sys.argv = [str(script), *argv]
    runpy.run_path(str(script), run_name="__main__")


def run_script(script, argv, world, out_dir, timeout_s=300):
    """`script` with `argv` on `world` ranks (each as torchrun would start it, without torchrun's own interpreter);
    asserts that every rank exits 0 and returns rank 0's stdout."""
    ctx = _context()
    port = _free_port()
    out_dir = pathlib.Path(out_dir)
    procs = [ctx.Process(target=_script_rank, args=(r, world, port, script, list(argv), str(out_dir)))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout_s)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    texts = "".join((out_dir / f"{n}{r}.txt").read_text()[-4000:] for r in range(world) for n in ("stdout", "stderr")
                    if (out_dir / f"{n}{r}.txt").exists())
    assert all(p.exitcode == 0 for p in procs), f"exit codes {[p.exitcode for p in procs]}:\n{texts}"
    return (out_dir / "stdout0.txt").read_text()


def _run(body, world=2, timeout_s=240):
    ctx = _context()
    errors = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, body, errors)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout_s)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert not hung, f"ranks {hung} did not finish within {timeout_s} s"
    text = "\n".join(f"--- rank {r}:\n{tb}" for r, tb in sorted(failures))
    assert not failures and all(p.exitcode == 0 for p in procs), \
        f"{len(failures)} rank(s) failed (exit codes {[p.exitcode for p in procs]}):\n{text}"


# ---- the models -----------------------------------------------------------------------------------------------
def _setup(rank):
    from megatron.core import parallel_state, tensor_parallel
    import cad_megatron
    parallel_state.initialize_model_parallel(1, 1)
    if DEVICE == "cpu":
        cad_megatron.megatron_cpu_support()
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(0)
    cad_megatron.init_cad(timeout_ms=60000)
    return torch.device("cuda", rank) if DEVICE == "cuda" else torch.device("cpu")


def _config():
    from megatron.core.transformer.transformer_config import TransformerConfig
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    return TransformerConfig(
        num_layers=2, hidden_size=4 * HEAD_DIM, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=128,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, attention_dropout=0.0, hidden_dropout=0.0, bf16=dtype == torch.bfloat16,
        params_dtype=dtype, use_cpu_initialization=DEVICE == "cpu", masked_softmax_fusion=False,
        bias_activation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, cross_entropy_loss_fusion=False)


def _model(spec, device, state=None):
    from megatron.core.models.gpt import GPTModel
    torch.manual_seed(0)
    model = GPTModel(_config(), spec, vocab_size=VOCAB, max_sequence_length=128,
                     position_embedding_type="rope" if DEVICE == "cuda" else "learned_absolute").to(device)
    if state is not None:
        model.load_state_dict(state)
    if model.config.bf16:  # as Megatron runs bf16: the whole model cast, outputs back in fp32
        from megatron.core.transformer.module import Float16Module
        model = Float16Module(model.config, model)
    return model


def _reference_spec():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    import cad_megatron
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = cad_megatron.PerDocumentDotProductAttention
    return spec


def _batch(rank, device):
    docs = DOCS[rank]
    g = torch.Generator().manual_seed(10 + rank)
    tokens = torch.randint(0, VOCAB, (1, sum(docs) + 1), generator=g)
    mask = torch.ones(1, sum(docs))
    mask[0, torch.tensor(docs).cumsum(0) - 1] = 0.0
    positions = torch.cat([torch.arange(n) for n in docs])[None]
    return [t.to(device) for t in (tokens[:, :-1], tokens[:, 1:].contiguous(), positions, mask)]


def _loss_and_grads(model, batch, packed):
    ids, labels, positions, mask = batch
    model.zero_grad(set_to_none=True)
    token_loss = model(ids, positions, None, labels=labels, packed_seq_params=packed)
    loss = (token_loss.float() * mask).sum() / mask.sum()
    loss.backward()
    return loss.detach().float(), {n: p.grad.detach().float().clone() for n, p in model.named_parameters()}


def _assert_same(rank, what, got, want):
    loss, grads = got
    if DEVICE == "cpu":
        torch.testing.assert_close(loss, want[0], rtol=1e-5, atol=1e-6, msg=lambda m: f"rank {rank} {what} loss: {m}")
    else:
        assert abs(loss - want[0]) <= 2e-2 * abs(want[0]), f"rank {rank} {what}: loss {loss} vs {want[0]}"
    assert grads.keys() == want[1].keys()
    for name, ref in want[1].items():
        if DEVICE == "cpu":
            torch.testing.assert_close(grads[name], ref, rtol=1e-4, atol=1e-6,
                                       msg=lambda m: f"rank {rank} {what} grad {name}: {m}")
        else:  # bf16 end to end: the gradients' relative error in norm
            err = (grads[name] - ref).norm() / ref.norm().clamp_min(1e-12)
            assert err < 5e-2, f"rank {rank} {what} grad {name}: relative error {err:.3g}"


def _equal_to_megatron_attention(rank, world):
    import cad_megatron
    from cad_megatron import CadCoreAttention, attach_plan, cad_gpt_layer_spec, packed_seq_params, plans_of
    device = _setup(rank)
    reference = _model(_reference_spec(), device)
    state = getattr(reference, "module", reference).state_dict()  # the GPTModel's own (inside Float16Module in bf16)
    batch = _batch(rank, device)
    want = _loss_and_grads(reference, batch, packed_seq_params(DOCS[rank], device)[0])
    assert torch.isfinite(want[0])

    spec = cad_gpt_layer_spec(normalization="RMSNorm")
    assert spec.submodules.self_attention.submodules.core_attention is CadCoreAttention
    config = _config()
    costs = [sum(n * (n + 1) // 2 for n in d) for d in DOCS]
    colocated = max(costs) * len(costs) / sum(costs)
    for tag, how in enumerate(("first layer", "attached ahead", "attached now", "local")):
        model = _model(cad_gpt_layer_spec(normalization="RMSNorm", balance=how != "local"), device, state)
        inner = getattr(model, "module", model)
        assert isinstance(inner.decoder.layers[0].self_attention.core_attention, CadCoreAttention)
        packed, cu_host = packed_seq_params(DOCS[rank], device)
        if how.startswith("attached"):
            packed = attach_plan(packed, config, cu_seqlens_host=cu_host, ahead=how == "attached ahead", tag=tag)
        for repeat in range(2):  # the same micro-batch's plan serves a second forward and backward
            _assert_same(rank, f"{how} (pass {repeat})", _loss_and_grads(model, batch, packed), want)
        plans = plans_of(packed)
        if how == "local":
            assert plans == []
        else:
            assert len(plans) == 1, plans  # one plan per micro-batch, shared by both layers
            stats = plans[0].stats
            assert stats is not None and len(stats["servers"]) == world
            assert stats["imbalance"] < min(1.2, colocated), (stats["imbalance"], colocated)

    # [s, b] batches without packed_seq_params: each row one document, local CAD attention, equal to
    # Megatron's DotProductAttention with the causal mask (its attention_mask argument; CAD checks that it is the causal
    # mask: test_cad_megatron_masks.py).
    from megatron.core.transformer.enums import AttnMaskType
    torch.manual_seed(rank)
    dtype = config.params_dtype
    q = torch.randn(9, 3, 4, HEAD_DIM, device=device, dtype=dtype)
    k, v = (torch.randn(9, 3, 2, HEAD_DIM, device=device, dtype=dtype) for _ in range(2))
    mask = torch.triu(torch.ones(9, 9, dtype=torch.bool, device=device), 1)[None, None]
    ref_attention = cad_megatron.PerDocumentDotProductAttention(config, 1, AttnMaskType.causal, "self")
    ours = CadCoreAttention(config, 1, AttnMaskType.causal, "self")
    out_ref, out = ref_attention(q, k, v, mask), ours(q, k, v, mask)
    assert out.shape == out_ref.shape == (9, 3, 4 * HEAD_DIM)
    tol = dict(rtol=1e-5, atol=1e-6) if DEVICE == "cpu" else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out, out_ref, **tol)


def _window_reference(q, k, v, docs, left, scale):
    """Attention per document with Megatron's sliding-window mask (key j seen by query i iff i - left <= j <= i)."""
    out, start = [], 0
    groups = q.shape[1] // k.shape[1]
    for n in docs:
        qd, kd, vd = (t[start:start + n].float().transpose(0, 1) for t in (q, k, v))
        kd, vd = kd.repeat_interleave(groups, 0), vd.repeat_interleave(groups, 0)
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        seen = (j <= i) & (j >= i - left)
        scores = (qd @ kd.transpose(1, 2) * scale).masked_fill(~seen.to(q.device), float("-inf"))
        out.append((scores.softmax(-1) @ vd).transpose(0, 1))
        start += n
    return torch.cat(out).reshape(q.shape[0], -1)


def _sliding_windows(rank, device):
    """config.window_size=(5, 0) on every other layer (window_attn_skip_freq=2): the windowed layer's plan is made
    for its window, the global layer's without; both equal attention with Megatron's window mask."""
    import dataclasses
    from megatron.core.transformer.enums import AttnMaskType
    from cad_megatron import CadCoreAttention, packed_seq_params, plans_of
    config = dataclasses.replace(_config(), window_size=(5, 0), window_attn_skip_freq=2)
    torch.manual_seed(rank)
    tokens = sum(DOCS[rank])
    q = torch.randn(tokens, 4, HEAD_DIM, device=device, dtype=config.params_dtype)
    k, v = (torch.randn(tokens, 2, HEAD_DIM, device=device, dtype=config.params_dtype) for _ in range(2))
    packed, _ = packed_seq_params(DOCS[rank], device)
    tol = dict(rtol=1e-5, atol=1e-6) if DEVICE == "cpu" else dict(rtol=2e-2, atol=2e-2)
    import cad
    for layer, left in ((1, 5), (2, -1)):  # layer 1 windowed (1 % 2 != 0), layer 2 global
        for balance in (False, True):  # local first: a backend without windows refuses there, before any collective
            attention = CadCoreAttention(config, layer, AttnMaskType.causal, "self", balance=balance)
            assert attention.window == ((5, 0) if left == 5 else None)
            try:
                out = attention(q, k, v, None, packed_seq_params=packed)
            except cad.CadError as exc:
                if DEVICE == "cuda" and left >= 0 and not balance and "window" in str(exc):
                    print(f"rank {rank}: sliding windows not checked: the CUDA backend refuses them ({exc})")
                    return
                raise
            want = _window_reference(q, k, v, DOCS[rank], tokens if left < 0 else left, HEAD_DIM ** -0.5)
            torch.testing.assert_close(out.float(), want, **tol)
    assert sorted(p.window_left for p in plans_of(packed)) == [-1, 5]  # one plan per window kind


def test_cad_core_attention_equals_megatron_attention():
    _run(_equal_to_megatron_attention)


def test_refusals_name_what():
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig
    from cad_megatron import CadCoreAttention
    base = dict(num_layers=1, hidden_size=32, num_attention_heads=2, use_cpu_initialization=True, attention_dropout=0.0)
    with pytest.raises(ValueError, match="attention dropout 0.1"):
        CadCoreAttention(TransformerConfig(**dict(base, attention_dropout=0.1)), 1, AttnMaskType.causal, "self")
    with pytest.raises(ValueError, match="arbitrary"):
        CadCoreAttention(TransformerConfig(**base), 1, AttnMaskType.arbitrary, "self")
    with pytest.raises(ValueError, match="attention_type 'cross'"):
        CadCoreAttention(TransformerConfig(**base), 1, AttnMaskType.causal, "cross")


def test_spec_helpers_leave_megatrons_spec_alone():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from cad_megatron import CadCoreAttention, use_cad
    local = get_gpt_layer_local_spec()
    ours = use_cad(local, balance=False)
    assert local.submodules.self_attention.submodules.core_attention is DotProductAttention
    built = ours.submodules.self_attention.submodules.core_attention
    assert built.func is CadCoreAttention and built.keywords == {"balance": False}


def test_training_script_trains_megatrons_losses_with_cad(tmp_path):
    """train_gpt_cad.py under torchrun, 2 ranks: Megatron's attention, CAD with plans made ahead by the loop and
    CAD with plans made by the first layer train the same losses (DDP, 2 micro-batches per step); local attention
    on the balanced micro-batches (the measured ideal) trains balanced ranks, and the script reports the share."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # The script samples documents from a length list; a small one of mixed lengths here (the shared Pretrain
    # distribution is not in every checkout, CI's clean clone included).
    data = tmp_path / "lengths.json"
    data.write_text(json.dumps([3, 7, 12, 20, 33, 50, 64, 90, 128, 180, 256, 300, 400, 511, 700, 1000] * 4))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(HERE / "train_gpt_cad.py"), "--device", DEVICE, "--configs", "megatron,cad,cad+now,local,local_balanced",
               "--context", "512", "--steps", "2", "--micro-batches", "2", "--data", str(data), "--json-out",
               str(tmp_path / "run_{config}.json")]
    if DEVICE == "cuda":
        command += ["--dtype", "bf16"]
    else:  # smaller than the tiny preset (head dim 64, for CUDA's kernels): CI's 2 cores
        command += ["--hidden", "64", "--ffn", "128"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    runs = {name: json.loads((tmp_path / f"run_{name}.json").read_text()) for name in ("megatron", "cad", "cad_now")}
    want = runs["megatron"]["summary"]["losses"]
    assert len(want) == 2
    rtol = 1e-6 if DEVICE == "cpu" else 2e-2
    for name in ("cad", "cad_now"):
        got = runs[name]["summary"]["losses"]
        assert all(abs(a - b) <= rtol * abs(b) for a, b in zip(got, want)), (name, got, want)
        assert all(s["imbalance"] is not None for s in runs[name]["steps"])
    assert "megatron-core" in result.stdout and "cad vs megatron: losses agree" in result.stdout
    real, balanced = (json.loads((tmp_path / f"run_{name}.json").read_text())["steps"] for name in ("local",
                                                                                                   "local_balanced"))
    for r, b in zip(real, balanced):  # the balanced micro-batches: every rank near the mean rank's causal work
        assert b["imbalance"] < min(1.1, r["imbalance"]), (b["imbalance"], r["imbalance"])
    assert "ideal (local / local_balanced)" in result.stdout and "realised share" in result.stdout
    for run in runs.values():  # the means leave out the warm-up step (--warmup-steps, default 1)
        summary, steps = run["summary"], run["steps"]
        assert summary["warmup_steps"] == 1
        assert summary["mean_step_s_after_first"] == pytest.approx(sum(max(r["step_s"]) for r in steps[1:]) /
                                                                   (len(steps) - 1))


def test_training_script_refuses_a_warmup_that_leaves_no_step(capsys):
    # The script's main parses its arguments first (parse_args), before it starts anything: checked in process, as
    # its other refusals (test_cad_megatron_cp.py, test_cad_megatron_tp.py).
    import train_gpt_cad
    with pytest.raises(SystemExit) as exit_info:
        train_gpt_cad.parse_args(["--device", "cpu", "--steps", "2", "--warmup-steps", "2"])
    assert exit_info.value.code == 2 and "--warmup-steps 2: expected 0 to --steps - 1 (1)" in capsys.readouterr().err
