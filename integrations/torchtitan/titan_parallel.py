"""Context and tensor parallelism of TorchTitan 0.2.x with CAD (titan_cad_spec.py's llama3_cad model).

Context parallelism (`parallelism.context_parallel_degree` cp > 1, varlen attention, which TorchTitan itself
refuses: its CP shards the attention through torch's context_parallel, for SDPA and FlexAttention only). With
CAD, CP is a layout: the step's documents are packed whole over the data x context ranks (dataset
"pretrain_stream", titan_common.PackedStream, cad.pack_documents), cut wherever a rank's buffer ends, positions
continuous across a cut (RoPE sees one document) and no label lost at a cut. TorchTitan's dataloader gives the
ranks of one CP group the same row (their tokens, one after the other); each rank keeps its cp share
(`stream_inputs`, called from the trainer's post_dataloading_process instead of TorchTitan's
prepare_context_parallel_input), and the micro-batch's plan is made from its pieces (cad.plan_pieces: document ids
the same on every rank). TorchTitan's own CP (apply_cp_to_attention_module, the context_parallel context manager)
is not applied: `parallelize_cad` runs TorchTitan's parallelize_llama without it, so FSDP still shards over the
data x context ranks (TorchTitan's "fsdp" mesh) and the loss and token counts are TorchTitan's own.

Tensor parallelism (`parallelism.tensor_parallel_degree` t > 1): TorchTitan's apply_tp, unchanged (column-parallel
wq/wk/wv, sequence parallel around attention and the MLP): the ranks of a TP group hold the same tokens and Hq/t
query and Hkv/t key/value heads (refused, naming the numbers, where they do not divide: cad.mesh.heads_per_rank).

CAD's group (`cad_group`): the ranks with this rank's pipeline and TP index, over TorchTitan's batch x cp
dimensions -- the ranks whose tokens differ, which TorchTitan's "loss" mesh also flattens. Each TP index has its
own group and makes its own plan from the same pieces with the same deterministic balancer, so every TP index
holds the same plan without a collective across TP, and the exchange moves a head slice. The group is made
through cad.mesh rather than taken from TorchTitan's loss mesh, whose dimensions of degree 1 (and its "batch"
dimension) may be built with the "fake" backend.
"""
from typing import NamedTuple

import torch

import cad
import cad.mesh
from titan_common import CAD_KEYS, pieces_of

OVER = ("batch", "cp")  # TorchTitan's dimensions that CAD's pool spans


class Share(NamedTuple):
    """What a rank holds: cp share `cp_rank` of `cp` of its CP group's row, and 1/tp of the heads."""
    cp_rank: int = 0
    cp: int = 1
    tp: int = 1


def layout_of(parallel_dims):
    """TorchTitan 0.2.x's world layout, outermost first (its dataloading mesh: pp, batch, cp, tp)."""
    return {"pp": parallel_dims.pp, "batch": parallel_dims.dp_replicate * parallel_dims.dp_shard,
            "cp": parallel_dims.cp, "tp": parallel_dims.tp}


def share_of(parallel_dims, rank=None):
    rank = torch.distributed.get_rank() if rank is None else rank
    coords = cad.mesh.coordinates(layout_of(parallel_dims), rank)
    return Share(coords["cp"], parallel_dims.cp, parallel_dims.tp)


def cad_group(parallel_dims):
    """This rank's CAD group (see the module): collective, every rank calls it once."""
    return cad.mesh.cad_group(layout_of(parallel_dims), OVER)


def heads(model_args, tp):
    """(query heads, key/value heads) of one TP rank: TorchTitan's column-parallel wq/wk/wv split them by tp."""
    return cad.mesh.heads_per_rank(model_args.n_heads, model_args.n_kv_heads or model_args.n_heads, tp,
                                   what="llama3_cad with parallelism.tensor_parallel_degree")


def _cad_is_the_context_parallelism(attention_modules, cp_mesh, attention_type):
    """In place of TorchTitan's apply_cp_to_attention_module: CAD attends each document whole across the ranks
    holding its pieces, so the attention modules stay as they are."""


def parallelize_cad(model, parallel_dims, job_config):
    """The llama3_cad spec's parallelize_fn: TorchTitan's parallelize_llama (TP, AC, compile, FSDP over the data x
    context ranks), with CAD instead of TorchTitan's context-parallel attention. Records the rank's Share on the
    model (model.cad_share), which its plans read."""
    from torchtitan.models.llama3.infra import parallelize
    if parallel_dims.pp_enabled:
        raise NotImplementedError("llama3_cad: pipeline parallelism (parallelism.pipeline_parallel_degree > 1) is not "
                                  "supported with CAD in TorchTitan")
    if parallel_dims.tp_enabled:
        heads(model.model_args, parallel_dims.tp)
    if parallel_dims.cp_enabled and not getattr(model, "plans_documents", False):
        raise ValueError(f"{type(model).__name__}: context_parallel_degree {parallel_dims.cp} needs CAD's plans "
                         "(model.name llama3_cad): attention without a plan sees only this rank's pieces")
    model.cad_share = share_of(parallel_dims)
    if not parallel_dims.cp_enabled:
        return parallelize.parallelize_llama(model, parallel_dims, job_config)
    original = parallelize.apply_cp_to_attention_module
    parallelize.apply_cp_to_attention_module = _cad_is_the_context_parallelism
    try:
        return parallelize.parallelize_llama(model, parallel_dims, job_config)
    finally:
        parallelize.apply_cp_to_attention_module = original


def context_share(t, share):
    """A rank's cp share of a row (dim 1 of [B, L], dim 0 of [L]): its tokens of the CP group's row."""
    if share.cp == 1:
        return t
    dim = 1 if t.dim() > 1 else 0
    n = t.shape[dim]
    if n % share.cp:
        raise ValueError(f"llama3_cad: a row of {n} tokens does not split over context_parallel_degree {share.cp}")
    step = n // share.cp
    return t.narrow(dim, share.cp_rank * step, step)


def stream_inputs(input_dict, labels, share):
    """A PackedStream micro-batch as this rank runs it: (inputs, labels, extra_inputs, documents), each its cp
    share; documents holds CAD_KEYS and positions (what stream_pieces reads), extra_inputs what the model's
    forward takes (positions)."""
    missing = [k for k in CAD_KEYS + ("positions",) if k not in input_dict]
    if missing:
        raise ValueError(f"llama3_cad: the micro-batch lacks {missing}: context parallelism with CAD needs the "
                         "documents packed over the ranks (training.dataset \"pretrain_stream\")")
    sliced = {k: context_share(v, share) for k, v in input_dict.items()}
    extra_inputs = {k: v for k, v in sliced.items() if k != "input" and k not in CAD_KEYS}
    documents = {k: sliced[k] for k in CAD_KEYS + ("positions",)}
    labels = None if labels is None else context_share(labels, share)
    return sliced["input"], labels, extra_inputs, documents


def stream_pieces(documents):
    """This rank's pieces (doc_id, doc_len, offset_in_doc, len) of a micro-batch from stream_inputs' documents."""
    return pieces_of(documents["cad_doc"], documents["cad_doc_len"], documents["positions"])
