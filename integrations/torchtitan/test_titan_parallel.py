"""TorchTitan 0.2.x's Llama 3 with CAD under context and tensor parallelism, on 4 gloo ranks on the CPU (fp32):
TorchTitan's own ParallelDims meshes and parallelize_llama (apply_tp, FSDP2 over the data x context ranks) through
the llama3_cad spec's parallelize_fn (titan_parallel.parallelize_cad), the trainer's data (PackedStream: the
documents packed whole over the data x context ranks, a document spanning ranks) and its post-dataloading step
(titan_parallel.stream_inputs, the plan from the rank's pieces over CAD's group). For TP2 x DP2, CP2 x DP2 and
TP2 x CP2, the loss and every parameter's gradient equal one process running the same documents unsplit (CAD's
local attention over whole documents), within fp32 tolerance."""
import dataclasses
import json
import os
import pathlib
import socket
import sys
import traceback

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("CAD_TT_DEVICE", "cpu")
import titan_common  # noqa: E402

titan_common.prepare()
pytest.importorskip("torchtitan.train", exc_type=ImportError,
                    reason="torchtitan 0.2.x's trainer does not import here (docs/integrations.md)")
if titan_common.default_data_path() is None:
    pytest.skip("no Pretrain data (doclen_pretrain.json: set CAD_DATA, or ../shared/data beside the checkout)",
                allow_module_level=True)

import cad  # noqa: E402

WORLD = 4
STREAM_TOKENS = 256  # the step's tokens over all data x context ranks; the longest document is as long
SEED = 3
# (dp, cp, tp): every layout of 4 ranks with CAD's pool over data x context and the heads split over TP
LAYOUTS = [(2, 1, 2), (2, 2, 1), (1, 2, 2)]


def model_args(n_kv_heads=2):
    import titan_cad_spec
    from torchtitan.models.llama3 import llama3_args
    args = dataclasses.replace(llama3_args["debugmodel"], dim=64, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads,
                               vocab_size=64, attn_type="varlen", attn_mask_type="block_causal",
                               max_seq_len=STREAM_TOKENS)
    return titan_cad_spec._cad_args(args)


def _lengths():
    return json.loads(pathlib.Path(titan_common.default_data_path()).read_text())


def _stream(batch_rank, batch_world, cp, row):
    data = titan_common.PackedStream(_lengths(), row, 64, batch_rank, batch_world, cp, SEED,
                                     max_doc_len=STREAM_TOKENS)
    return data


def _loss_sum(logits, labels):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                             ignore_index=titan_common.IGNORE_INDEX, reduction="sum")


def _reference(model):
    """One process, the whole stream as one row, each document attended whole by CAD's local attention."""
    import titan_cad_spec
    import titan_parallel
    sample, labels = _stream(0, 1, 1, STREAM_TOKENS).sample(0)
    batch = {k: v[None] for k, v in sample.items()}
    inputs, labels, extra, documents = titan_parallel.stream_inputs(batch, labels[None], titan_parallel.Share())
    pieces = titan_parallel.stream_pieces(documents)
    assert all(offset == 0 and n == length for _, length, offset, n in pieces)  # whole documents
    cu = torch.tensor([0] + [p[3] for p in pieces]).cumsum(0).to(torch.int32)
    longest = max(p[3] for p in pieces)
    masks = titan_cad_spec.CadVarlenMetadata(cu, cu, longest, longest, None)
    valid = int((labels != titan_common.IGNORE_INDEX).sum())
    loss = _loss_sum(model(inputs, attention_masks=masks, **extra), labels) / valid
    loss.backward()
    return float(loss.detach()), valid, {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _parallel(state, layout, valid, rank):
    import titan_cad_spec
    import titan_parallel
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    dp, cp, tp = layout
    dims = ParallelDims(dp_replicate=1, dp_shard=dp, cp=cp, tp=tp, pp=1, ep=1, etp=1, world_size=WORLD)
    dims.build_mesh()
    row = STREAM_TOKENS // dp
    job = JobConfig()
    job.training.seq_len = row
    job.training.mixed_precision_param = "float32"
    job.parallelism.disable_loss_parallel = True
    job.activation_checkpoint.mode = "none"
    model = titan_cad_spec.CadTransformer(model_args())
    model.load_state_dict(state)
    titan_parallel.parallelize_cad(model, dims, job)
    cad.init(group=titan_parallel.cad_group(dims), balancer="prefix_aware")
    try:
        coords = cad.mesh.coordinates(titan_parallel.layout_of(dims), rank)
        sample, labels = _stream(coords["batch"], dp, cp, row).sample(0)
        batch = {k: v[None] for k, v in sample.items()}
        inputs, labels, extra, documents = titan_parallel.stream_inputs(batch, labels[None], model.cad_share)
        assert inputs.shape == (1, row // cp)
        masks = model.get_attention_masks(inputs, None, documents)
        assert masks.plan is not None and masks.plan.pieces == titan_parallel.stream_pieces(documents)
        loss = _loss_sum(model(inputs, attention_masks=masks, **extra), labels) / valid
        loss.backward()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total, group=titan_parallel.cad_group(dims))  # over data x context
        grads = {}
        for name, p in model.named_parameters():
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            grads[name] = g.detach().clone()
        return float(total), grads
    finally:
        cad.shutdown()


def _worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CAD_TT_DEVICE="cpu")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD)
    errors = []
    try:
        import titan_cad_spec
        torch.manual_seed(11)
        reference = titan_cad_spec.CadTransformer(model_args())
        with torch.no_grad():
            reference.init_weights()
        state = {k: v.clone() for k, v in reference.state_dict().items()}
        ref_loss, valid, ref_grads = _reference(reference)
        for layout in LAYOUTS:
            loss, grads = _parallel(state, layout, valid, rank)
            if abs(loss - ref_loss) > 1e-5 * abs(ref_loss):
                errors.append(f"{layout}: loss {loss} != unsplit {ref_loss}")
            for name, g in ref_grads.items():
                err = float((grads[name] - g).abs().max() / g.abs().max().clamp_min(1e-30))
                if err > 1e-4:
                    errors.append(f"{layout}: {name} gradient off by {err:.2e} (relative to its largest entry)")
    except Exception:  # noqa: BLE001 -- reported to the test with the traceback
        errors.append(traceback.format_exc())
    finally:
        (pathlib.Path(out_dir) / f"{rank}.txt").write_text("\n".join(errors) or "ok")
        torch.distributed.destroy_process_group()


def test_a_document_spans_ranks_in_every_layout():
    layouts = cad.pack_documents(titan_common.stream_documents(_lengths(), STREAM_TOKENS, STREAM_TOKENS, SEED),
                                 STREAM_TOKENS // 4, 4, max_doc_len=STREAM_TOKENS)
    holders = {}
    for layout in layouts:
        for doc, *_ in layout.pieces:
            holders.setdefault(doc, set()).add(layout.rank)
    assert max(len(r) for r in holders.values()) >= 2, holders  # a document cut across ranks (CP2 cuts it)


def test_cp_and_tp_layouts_give_the_unsplit_loss_and_gradients(tmp_path):
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Forked from a server that imported torch once (a spawned rank imports it again: seconds of CPU each). Only
    # torch: each rank imports this module (titan_common.prepare, then torchtitan) as a spawned rank would.
    mp.get_context("forkserver").set_forkserver_preload(["torch"])
    mp.start_processes(_worker, args=(port, str(tmp_path)), nprocs=WORLD, join=True, start_method="forkserver")
    reports = {r: (tmp_path / f"{r}.txt").read_text() for r in range(WORLD)}
    assert reports == {r: "ok" for r in range(WORLD)}, "\n".join(f"rank {r}: {t}" for r, t in reports.items())


def test_tensor_parallel_refuses_kv_heads_it_cannot_split():
    import titan_parallel
    assert titan_parallel.heads(model_args(n_kv_heads=2), 2) == (2, 1)
    with pytest.raises(cad.CadError, match="llama3_cad with parallelism.tensor_parallel_degree: num_kv_heads 2 is "
                                           "not divisible by the tensor-parallel size 4"):
        titan_parallel.heads(model_args(n_kv_heads=2), 4)
