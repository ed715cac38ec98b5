#!/usr/bin/env python3
"""CAD attention in TorchTitan 0.2.x's trainer (PyPI torchtitan 0.2.2: the release that runs on torch 2.11; 0.3.0
imports torch.distributed.fsdp.DataParallelMeshDims, which torch 2.11 lacks -- train_titan_cad.py is the 0.3 recipe).

TorchTitan 0.2.x takes a TOML job file; a model is a registered TrainSpec (`model.name`) with flavors
(`model.flavor`), and `experimental.custom_import` imports the module that registers it. This module registers:
  llama3_cad           TorchTitan's Llama 3 whose attention layers call cad.varlen.varlen_attn; the model's
                       get_attention_masks -- called by the trainer once per micro-batch, before its forward, from the
                       packed batch's document boundaries -- makes the micro-batch's cad.plan there (ahead=True) and
                       hands it to every layer with the varlen metadata;
  llama3_cad_local     the same layers without plans (CAD's own varlen kernels on each rank's documents);
  llama3_torch_varlen  torch.nn.attention.varlen.varlen_attn (TorchTitan's VarlenAttentionWrapper compiles it with
                       mode="max-autotune-no-cudagraphs"; this calls it eagerly, K/V heads repeated);
  llama3_titan         TorchTitan's own model and attention unchanged: flavor 8B_varlen (its VarlenAttentionWrapper),
                       8B_flex (FlexAttention, block_causal document mask), or 8B (sdpa, no document mask);
Context parallelism (`parallelism.context_parallel_degree` > 1, training.dataset "pretrain_stream") and tensor
parallelism (`parallelism.tensor_parallel_degree` > 1) run through CAD: titan_parallel.py says how.
All with the no-download packed-document dataloader (the Pretrain recipe's lengths, synthetic tokens, EOS at every
document's end: 0.2.x finds documents by their EOS) and a tokenizer that reads no files.
Flavors (every spec): "8B" (Llama 3 8B's shape with $CAD_TT_LAYERS layers, default 4, and a vocabulary of
$CAD_TT_VOCAB, default 32768) and "debugmodel" (TorchTitan's, $CAD_TT_LAYERS or 2 layers); llama3_titan also
"8B_varlen", "8B_flex", "debugmodel_varlen", "debugmodel_flex".

    PYTHONPATH=host_adapter/python:integrations/torchtitan torchrun --nproc-per-node 2 \\
        integrations/torchtitan/titan_cad_spec.py --job.config_file integrations/torchtitan/llama3_cad.toml \\
        [--model.name llama3_torch_varlen] [--compile.enable] [--activation_checkpoint.mode full]

(the launcher is torchtitan.train.main with a trainer that records step times; where tensorboard and `datasets`
import, `python -m torchtitan.train --job.config_file ...` runs the same TOML). FSDP2, activation checkpointing and
torch.compile are TorchTitan's own (`parallelism.*`, `activation_checkpoint.mode`, `compile.enable`). With
per-op selective AC (selective_ac_option "op", as TorchTitan's Llama 3 8B TOML), CAD keeps a recomputed layer's
forward state on its owners (cad.init(keep_forward_tensors=False)): "auto" changes the recompute's ops, which per-op
SAC refuses. Rank 0 prints `CAD_TT step N step_s S loss L` and
writes every step to $CAD_TT_JSON.
"""
import dataclasses
import json
import os
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import titan_common  # noqa: E402
from titan_common import CAD_KEYS, STREAM, PackedStream, default_data_path, packed_documents  # noqa: E402
import titan_parallel  # noqa: E402

titan_common.prepare()

from torchtitan.components.dataloader import ParallelAwareDataloader  # noqa: E402
from torchtitan.components.tokenizer import BaseTokenizer  # noqa: E402
from torchtitan.models import attention as titan_attention  # noqa: E402
from torchtitan.models.llama3 import get_train_spec as llama3_train_spec  # noqa: E402
from torchtitan.models.llama3 import llama3_args  # noqa: E402
from torchtitan.models.llama3.model import model as llama3_model  # noqa: E402
from torchtitan.models.llama3.model.args import TransformerModelArgs  # noqa: E402
from torchtitan.models.llama3.model.model import Transformer  # noqa: E402
from torchtitan.protocols.train_spec import register_train_spec  # noqa: E402

import cad  # noqa: E402
import cad.varlen  # noqa: E402

from typing import NamedTuple, Optional  # noqa: E402


class CadVarlenMetadata(NamedTuple):
    """TorchTitan's VarlenMetadata plus the micro-batch's cad.Plan (a NamedTuple: it crosses compiled blocks)."""
    cu_seq_q: torch.Tensor
    cu_seq_k: torch.Tensor
    max_q: int
    max_k: int
    plan: Optional[cad.Plan] = None


# The attention's forward asserts isinstance(attention_masks, VarlenMetadata) (the module's global name): it accepts
# CAD's metadata too.
llama3_model.VarlenMetadata = (titan_attention.VarlenMetadata, CadVarlenMetadata)


class CadAttention(torch.nn.Module):
    """The inner attention of a varlen layer: (bs, heads, seq, dim) in, (bs*seq, heads, dim) out, as TorchTitan's
    VarlenAttentionWrapper; cad.varlen.varlen_attn (GQA without repeating K/V) with the micro-batch's plan."""

    def __init__(self, compute_dtype=torch.bfloat16):
        super().__init__()
        self.compute_dtype = compute_dtype

    def forward(self, xq, xk, xv, attention_masks, scale=None):
        q, k, v = (t.transpose(1, 2).flatten(0, 1) for t in (xq, xk, xv))
        if self.compute_dtype is not None:
            q, k, v = (t.to(self.compute_dtype) for t in (q, k, v))
        m = attention_masks
        out = cad.varlen.varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), m.cu_seq_q, m.cu_seq_k,
                                     m.max_q, m.max_k, scale=scale, window_size=(-1, 0),
                                     plan=getattr(m, "plan", None))
        return out.to(xq.dtype)


class TorchVarlenAttention(torch.nn.Module):
    """torch's varlen_attn called eagerly, K/V heads repeated (torch 2.11's takes no enable_gqa)."""

    def forward(self, xq, xk, xv, attention_masks, scale=None):
        from torch.nn.attention.varlen import varlen_attn
        q, k, v = (t.transpose(1, 2).flatten(0, 1).to(torch.bfloat16) for t in (xq, xk, xv))
        if k.shape[1] != q.shape[1]:
            r = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
        m = attention_masks
        out = varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), m.cu_seq_q, m.cu_seq_k, m.max_q, m.max_k,
                          scale=scale, window_size=(-1, 0))
        return out.to(xq.dtype)


class _SwappedAttention(Transformer):
    """TorchTitan's Llama 3 (attn_type "varlen", block_causal) with another inner attention in every layer."""
    make_inner = None

    def __init__(self, model_args):
        super().__init__(model_args)
        for block in self.layers.values():
            block.attention.inner_attention = type(self).make_inner()


def _compute_dtype():
    return torch.float32 if titan_common.cpu_requested() else torch.bfloat16  # CAD's CPU backend computes in fp32


class CadLocalTransformer(_SwappedAttention):
    make_inner = staticmethod(lambda: CadAttention(_compute_dtype()))


class CadTransformer(CadLocalTransformer):
    """Plans per micro-batch, made ahead. TorchTitan 0.2's train_step loads all of a step's micro-batches (on the
    CPU) before the first forward; the launcher's trainer hands each to plan_ahead() as it is loaded, which asks
    for its cad.plan on CAD's planning thread from the host's document boundaries (no device read), so that
    micro-batch i+1's plan is made while micro-batch i computes. get_attention_masks (once per micro-batch, just
    before its forward) then takes those plans in order. Without plan_ahead (another trainer) it plans itself, at
    that point, from the device's boundaries. Every rank asks in the same order (the tag counts micro-batches)."""
    _micro_batch = 0
    used_ahead = 0  # micro-batches that ran with a plan asked for by plan_ahead (the trainer's records read it)
    plans_documents = True  # attends whole documents across ranks: context parallelism (titan_parallel)

    @property
    def share(self):
        """This rank's titan_parallel.Share (set by the spec's parallelize_fn; one rank's whole row otherwise)."""
        return getattr(self, "cad_share", titan_parallel.Share())

    def _plan(self, cu_seq_q, device, pieces=None):
        """The micro-batch's plan, made ahead, for this TP rank's heads: from its documents' boundaries cu_seq_q, or
        from its pieces (documents packed over the data x context ranks, titan_parallel)."""
        args = self.model_args
        num_heads, num_kv_heads = titan_parallel.heads(args, self.share.tp)
        shape = dict(causal=True, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=args.dim // args.n_heads,
                     dtype=_compute_dtype(), device=device, ahead=True, tag=CadTransformer._micro_batch)
        plan = cad.plan(cu_seq_q, **shape) if pieces is None else cad.plan_pieces(pieces, **shape)
        CadTransformer._micro_batch += 1
        return plan

    def _stream_metadata(self, documents, device):
        """The metadata of a rank's share of a PackedStream micro-batch (titan_parallel.stream_inputs' documents):
        the plan from its pieces; cu_seq_q the pieces' boundaries in its tokens."""
        pieces = titan_parallel.stream_pieces(documents)
        cu = torch.tensor([0] + [p[3] for p in pieces], dtype=torch.int32).cumsum(0).to(torch.int32)
        longest = max(p[3] for p in pieces)
        return CadVarlenMetadata(cu, cu, longest, longest, self._plan(cu, device, pieces))

    def plan_ahead(self, input_batch, tokenizer, device, extra_inputs=None):
        """Ask for the plan of a loaded micro-batch (`input_batch` still on the CPU, the CP group's row) that will
        run on `device`; returns that cad.Plan."""
        if not hasattr(self, "_planned"):
            self._planned = []
        if extra_inputs and CAD_KEYS[0] in extra_inputs:
            inputs, _, _, documents = titan_parallel.stream_inputs({"input": input_batch, **extra_inputs}, None,
                                                                   self.share)
            metadata = self._stream_metadata(documents, device)
            self._planned.append((tuple(inputs.shape), metadata))
            return metadata.plan
        masks = super().get_attention_masks(input_batch, tokenizer, extra_inputs)
        cu = masks.cu_seq_q.to(torch.int32)  # the plan's tensor: every layer passes it, so no layer reads it back
        plan = self._plan(cu, device)
        self._planned.append((tuple(input_batch.shape), CadVarlenMetadata(cu, cu, int(masks.max_q), int(masks.max_k),
                                                                          plan)))
        return plan

    def forget_planned(self):
        """Drop the metadata of micro-batches planned ahead that will not run (their look-ahead was closed and their
        plans released), so that no later micro-batch takes it; returns how many."""
        planned, self._planned = getattr(self, "_planned", []), []
        return len(planned)

    def get_attention_masks(self, input_batch, tokenizer, extra_inputs=None):
        """The micro-batch's metadata and plan (the one planned ahead, else made now). With PackedStream's
        documents, input_batch and extra_inputs are this rank's share (titan_parallel.stream_inputs)."""
        planned = getattr(self, "_planned", None)
        if planned:
            shape, metadata = planned.pop(0)
            CadTransformer.used_ahead += 1
            if shape != tuple(input_batch.shape):
                raise RuntimeError(f"CadTransformer: the micro-batch planned ahead had shape {shape}, the one being run "
                                   f"{tuple(input_batch.shape)}: micro-batches must run in the order they were loaded")
            return metadata
        if extra_inputs and CAD_KEYS[0] in extra_inputs:
            return self._stream_metadata(extra_inputs, input_batch.device)
        masks = super().get_attention_masks(input_batch, tokenizer, extra_inputs)
        return CadVarlenMetadata(masks.cu_seq_q, masks.cu_seq_k, int(masks.max_q), int(masks.max_k),
                                 self._plan(masks.cu_seq_q, input_batch.device))


class TorchVarlenTransformer(_SwappedAttention):
    make_inner = TorchVarlenAttention


# ---- tokenizer, data -------------------------------------------------------------------------------------------------
class SyntheticTokenizer(titan_common.SyntheticIds, BaseTokenizer):
    """No files: ids are their own text; EOS is the last id of the vocabulary (titan_common.SyntheticIds)."""

    def __init__(self, vocab_size):
        super().__init__()
        self._set_vocab(vocab_size)


def _vocab_size(job_config):
    spec_args = _flavors(job_config.model.name)
    return spec_args[job_config.model.flavor].vocab_size


def build_synthetic_tokenizer(job_config):
    return SyntheticTokenizer(_vocab_size(job_config))


def build_packed_document_dataloader(dp_world_size, dp_rank, tokenizer, job_config, infinite=True, **kwargs):
    """training.dataset "pretrain_synthetic" (or "pretrain_synthetic_balanced": the measured ideal, titan_common.
    DATASETS); training.dataset_path: doclen_pretrain.json (default $CAD_DATA,
    ../shared/data, .bench_data)."""
    path = job_config.training.dataset_path or default_data_path()
    if path is None:
        raise FileNotFoundError("no doclen_pretrain.json: set training.dataset_path or CAD_DATA")
    lengths = json.loads(pathlib.Path(path).read_text())
    seed = job_config.debug.seed if job_config.debug.seed is not None else 1
    if job_config.training.dataset == STREAM:  # packed whole over the data x context ranks (titan_parallel)
        dataset = PackedStream(lengths, job_config.training.seq_len, tokenizer.get_vocab_size(), dp_rank,
                               dp_world_size, job_config.parallelism.context_parallel_degree, seed,
                               max_doc_len=max_doc_len(job_config), eos_id=tokenizer.eos_id)
        return ParallelAwareDataloader(dataset, dp_rank=dp_rank, dp_world_size=dp_world_size,
                                       batch_size=job_config.training.local_batch_size)
    dataset = packed_documents(job_config.training.dataset, lengths, job_config.training.seq_len,
                               tokenizer.get_vocab_size(), dp_rank, dp_world_size, seed, eos_id=tokenizer.eos_id)
    return ParallelAwareDataloader(dataset, dp_rank=dp_rank, dp_world_size=dp_world_size,
                                   batch_size=job_config.training.local_batch_size)


# ---- flavors and specs -----------------------------------------------------------------------------------------------
def max_doc_len(job_config):
    """The longest document of dataset "pretrain_stream": $CAD_TT_MAX_DOC_LEN, default the CP group's row
    (training.seq_len). A document may be longer than a rank's tokens (seq_len / context_parallel_degree)."""
    return int(os.environ.get("CAD_TT_MAX_DOC_LEN") or job_config.training.seq_len)


@dataclasses.dataclass
class CadModelArgs(TransformerModelArgs):
    """Llama 3's model args for the CAD specs: context parallelism with varlen attention is CAD's (TorchTitan's
    update_from_config refuses it, its own CP having no varlen path), and RoPE's table covers the longest
    document, whose positions run on across ranks."""

    def update_from_config(self, job_config, **kwargs):
        self.max_seq_len = max(job_config.training.seq_len, max_doc_len(job_config))


def _cad_args(args):
    return CadModelArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init})


def _flavor(base, attn_type, layers, vocab=None):
    args = dataclasses.replace(llama3_args[base], attn_type=attn_type, n_layers=layers)
    if attn_type != "sdpa":
        args = dataclasses.replace(args, attn_mask_type="block_causal")
    if vocab:
        args = dataclasses.replace(args, vocab_size=vocab)
    return args


def _flavors(name):
    layers = os.environ.get("CAD_TT_LAYERS")
    vocab = int(os.environ.get("CAD_TT_VOCAB", 32768))
    l8, ld = int(layers or 4), int(layers or 2)
    if name == "llama3_titan":
        return {"8B": _flavor("8B", "sdpa", l8, vocab), "8B_varlen": _flavor("8B", "varlen", l8, vocab),
                "8B_flex": _flavor("8B", "flex", l8, vocab), "debugmodel": _flavor("debugmodel", "sdpa", ld),
                "debugmodel_varlen": _flavor("debugmodel", "varlen", ld),
                "debugmodel_flex": _flavor("debugmodel", "flex", ld)}
    return {"8B": _cad_args(_flavor("8B", "varlen", l8, vocab)),
            "debugmodel": _cad_args(_flavor("debugmodel", "varlen", ld))}


def _spec(name, model_cls):
    spec = llama3_train_spec()
    if name != "llama3_titan":  # CAD's layers: TP with the head check, CP as CAD's layout (titan_parallel)
        spec = dataclasses.replace(spec, parallelize_fn=titan_parallel.parallelize_cad)
    spec = dataclasses.replace(spec, model_cls=model_cls, model_args=_flavors(name),
                               build_dataloader_fn=build_packed_document_dataloader,
                               build_tokenizer_fn=build_synthetic_tokenizer, build_validator_fn=None)
    register_train_spec(name, spec)


for _name, _cls in (("llama3_cad", CadTransformer), ("llama3_cad_local", CadLocalTransformer),
                    ("llama3_torch_varlen", TorchVarlenTransformer), ("llama3_titan", Transformer)):
    try:
        _spec(_name, _cls)
    except ValueError:  # registered already (imported twice: as __main__ and by custom_import)
        pass


# ---- per-op selective activation checkpointing: CAD's forward saved, as TorchTitan saves its own attention ----------
def save_cad_attention_under_op_sac():
    """Put CAD's forward op on TorchTitan's per-op selective AC save list (llama3's `_op_sac_save_list`).

    That policy (selective_ac_option "op", TorchTitan's Llama 3 8B recipe) keeps the outputs of the ops on the list
    -- its own attention ops among them (SDPA, FlexAttention, torch's varlen_attn) -- and recomputes every other op
    in the backward. CAD's forward op was not on it, so every layer's backward ran CAD's forward again, exchanges
    included, which TorchTitan's own attention does not pay (an earlier table compared CAD under that handicap). The
    list is the policy's extension point in TorchTitan 0.2.x (0.3 has SelectiveAC.get_save_ops instead); the op
    added matches CAD's calls only. Each forward then runs once per step and its backward re-sends its inputs from
    the owners (cad.init(keep_forward_tensors=False), as before under this policy)."""
    from torchtitan.models.llama3.infra import parallelize
    parallelize._op_sac_save_list.add(torch.ops.cad.varlen_fwd.default)


save_cad_attention_under_op_sac()


# ---- the launcher's trainer: step times ----------------------------------------------------------------------------
class PlanOneAhead:
    """The trainer's micro-batches, each loaded one micro-batch before TorchTitan asks for it and handed to `plan`
    (the model's plan_ahead) as it loads. TorchTitan 0.2 loads a step's micro-batches when the step starts, so the
    next step's first micro-batch is loaded, and its plan asked for, while this step computes: no step waits for
    its first plan (with a plan asked for only when its own step loads, a step of one micro-batch always did).
    The data iterator runs one micro-batch ahead of training; `planned_in_an_earlier_step` counts the micro-batches
    that TorchTitan took from here whose plan was asked for before their step began, and take_plans() returns what
    `plan` returned for the micro-batches taken since the last call (the trainer reads both once per step, so
    nothing here outlives a step's micro-batches but the one loaded ahead). The end of the data (StopIteration,
    TorchTitan's DataloaderExhaustedError) and a failure to plan the micro-batch loaded ahead are raised when the
    trainer reaches that micro-batch, not when the look-ahead does: the micro-batch before it still trains.
    close() hands the micro-batch loaded ahead back (it was not trained); after it, next() raises: no micro-batch
    is ever skipped without a word. look_ahead=False loads and plans each micro-batch only when TorchTitan asks
    for it: where checkpoints are saved, since a checkpoint's dataloader state would count the micro-batch
    loaded ahead as trained and a resumed run would skip it."""

    def __init__(self, source, plan, look_ahead=True):
        self.source, self.plan, self.look_ahead = source, plan, look_ahead
        self.step = 0
        self.planned_in_an_earlier_step = 0
        self._taken_plans = []
        self._next = None  # (step in which it was loaded, micro-batch, its plan), or the exception met loading it
        self._closed = False

    @classmethod
    def for_source(cls, current, source, plan, look_ahead=True):
        """`current` when it looks ahead of `source`; else a new PlanOneAhead over `source`, `current` closed
        first. A micro-batch that `current` had loaded ahead would then never train: that is refused, naming it."""
        if current is not None and current.source is source and not current._closed:
            return current
        if current is not None and current.close() is not None:
            raise RuntimeError("titan_cad_spec: the trainer was given another data iterator while a micro-batch of "
                               "the one before was loaded ahead: that micro-batch would never train (pass the same "
                               "iterator to every step, or close() the look-ahead and train what it hands back)")
        return cls(source, plan, look_ahead)

    def _load(self):
        try:
            batch = next(self.source)
            self._next = (self.step, batch, self.plan(batch))
        except Exception as exc:  # noqa: BLE001 -- the end of the data, whatever TorchTitan calls it, or a plan
            self._next = exc      # that could not be asked for: raised when the trainer reaches this micro-batch

    def begin_step(self, step):
        self.step = step

    def take_plans(self):
        plans, self._taken_plans = self._taken_plans, []
        return plans

    def close(self):
        """Stop looking ahead. Waits for the plan of the micro-batch loaded ahead (every rank asked for it, so every
        rank makes it) and gives the plan back: after the last step one is always outstanding, and its planning
        collectives must be done before the process group they run on is destroyed (TorchTitan destroys it right
        after Trainer.close). Returns that micro-batch, which no step took (None when there is none): handed back,
        not dropped. next() raises after close()."""
        self._closed = True
        pending, self._next = self._next, None
        if not isinstance(pending, tuple):
            return None
        _, batch, plan = pending
        if plan is not None:
            try:
                plan.wait()
            except Exception as exc:  # noqa: BLE001 -- closing after a failure: the failure is what gets reported
                print(f"titan_cad_spec: the plan of the micro-batch loaded ahead was not made: {exc}", file=sys.stderr,
                      flush=True)
            finally:
                plan.release()
        return batch

    def __iter__(self):
        return self

    def __next__(self):
        if self._closed:
            raise RuntimeError("titan_cad_spec: next() on a PlanOneAhead after close() (close() handed back the "
                               "micro-batch it had loaded ahead; make a new one to go on)")
        if not self.look_ahead:
            batch = next(self.source)
            self._taken_plans.append(self.plan(batch))
            return batch
        if self._next is None:  # the very first micro-batch: nothing ran before it to hide its plan behind
            self._load()
        current = self._next
        if isinstance(current, BaseException):
            raise current
        self._load()
        loaded_in, batch, plan = current
        if loaded_in < self.step:
            self.planned_in_an_earlier_step += 1
        self._taken_plans.append(plan)
        return batch


def recording_trainer():
    from torchtitan.train import Trainer

    class RecordingTrainer(Trainer):
        """TorchTitan's Trainer plus every step's device-synchronized wall time (the slowest rank's) and loss;
        cad.init before the first plan."""

        def __init__(self, job_config):
            super().__init__(job_config)
            self.records, self._last_loss, self._peak_gib = [], None, None
            log = self.metrics_processor.log

            def capture(step, global_avg_loss, global_max_loss, grad_norm, *a, **k):
                self._last_loss = float(global_avg_loss)
                if self.device.type == "cuda":  # read before TorchTitan's log resets the peak statistics
                    self._peak_gib = torch.cuda.max_memory_allocated(self.device) / 2 ** 30
                return log(step, global_avg_loss, global_max_loss, grad_norm, *a, **k)
            self.metrics_processor.log = capture
            if job_config.model.name.startswith("llama3_cad"):
                ac = job_config.activation_checkpoint
                keep = False if (ac.mode, ac.selective_ac_option) == ("selective", "op") else "auto"
                # CAD's group: this TP index's data x context ranks (the world without TP or PP)
                cad.init(group=titan_parallel.cad_group(self.parallel_dims),
                         balancer=os.environ.get("CAD_TT_BALANCER", "prefix_aware"), keep_forward_tensors=keep)

        def post_dataloading_process(self, input_dict, labels):
            """TorchTitan's, except for PackedStream's micro-batches (documents packed over the data x context
            ranks): this rank's cp share of the row and the plan from its pieces, in place of TorchTitan's
            prepare_context_parallel_input (titan_parallel)."""
            if CAD_KEYS[0] not in input_dict:
                if self.parallel_dims.cp_enabled and job_uses_cad(self.job_config):
                    raise ValueError(f"llama3_cad: context_parallel_degree {self.parallel_dims.cp} needs "
                                     f"training.dataset \"{STREAM}\" (documents packed whole over the data x context "
                                     f"ranks), got {self.job_config.training.dataset!r}")
                return super().post_dataloading_process(input_dict, labels)
            model = self.model_parts[0]
            inputs, labels, extra_inputs, documents = titan_parallel.stream_inputs(input_dict, labels, model.share)
            masks = model.get_attention_masks(inputs, self.tokenizer, documents)
            return inputs, labels, extra_inputs, {"attention_masks": masks}

        def _sync(self):
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        def _planning(self, data_iterator):
            """The micro-batches one ahead of TorchTitan, each handed to the model's plan_ahead as it loads (CAD);
            one PlanOneAhead for the whole run (TorchTitan passes the same iterator to every step)."""
            current = getattr(self, "_plan_one_ahead", None)
            if current is None or current.source is not data_iterator:
                model = self.model_parts[0]

                def plan(batch):
                    input_dict, _ = batch
                    return model.plan_ahead(input_dict["input"], self.tokenizer, self.device,
                                            {k: v for k, v in input_dict.items() if k != "input"})
                look_ahead = not self.job_config.checkpoint.enable
                if not look_ahead and (not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0):
                    print("titan_cad_spec: checkpoints are saved, so micro-batches are planned as they load, not one "
                          "ahead (a checkpoint would count the one loaded ahead as trained)", flush=True)
                self._plan_one_ahead = PlanOneAhead.for_source(current, data_iterator, plan, look_ahead)
            self._plan_one_ahead.begin_step(self.step)
            return self._plan_one_ahead

        def train_step(self, data_iterator, *args, **kwargs):
            if hasattr(self.model_parts[0], "plan_ahead"):
                data_iterator = self._planning(data_iterator)
            self._sync()
            cad.attention_time(reset=True)  # and the call count
            start = time.perf_counter()
            result = super().train_step(data_iterator, *args, **kwargs)
            self._sync()
            calls = cad.attention_calls()
            t = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=self.device)
            if torch.distributed.is_initialized():
                torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            # attention_calls: this rank's CAD attention calls whose work ran (forwards, recomputed ones included,
            # and backwards): 2 per layer and micro-batch where per-op SAC saves the forward, 3 where it recomputes it.
            record = {"step": self.step, "step_s": float(t.item()), "loss": self._last_loss, "attention_calls": calls}
            if hasattr(self.model_parts[0], "plan_ahead"):  # how many of the step's micro-batches had plans made ahead
                record["micro_batches_planned_ahead"], CadTransformer.used_ahead = CadTransformer.used_ahead, 0
                # ... how many of them were asked for before the step began (the look-ahead), and how long the
                # step's forwards waited for their plans (0: every plan was ready)
                ahead = self._plan_one_ahead
                record["planned_in_an_earlier_step"], ahead.planned_in_an_earlier_step = \
                    ahead.planned_in_an_earlier_step, 0
                record["plan_wait_ms"] = sum(plan.wait_ms for plan in ahead.take_plans())
            if self._peak_gib is not None:  # the step's peak, as capture() read it before log() reset it
                record["peak_gib"], self._peak_gib = self._peak_gib, None
            self.records.append(record)
            if os.environ.get("CAD_TT_GRADS") and self.step == 1:
                save_gradients(self.model_parts[0], os.environ["CAD_TT_GRADS"])
            if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
                print(f"CAD_TT step {self.step} step_s {record['step_s']:.4f} loss {record['loss']}", flush=True)
            return result

        def close(self):
            path = os.environ.get("CAD_TT_JSON")
            rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
            if path and rank0 and getattr(self, "records", None):
                jc = self.job_config
                steady = [r["step_s"] for r in self.records[1:]] or [self.records[0]["step_s"]]
                summary = {"model": jc.model.name, "flavor": jc.model.flavor, "dataset": jc.training.dataset,
                           "torchtitan": _version(),
                           "balancer": os.environ.get("CAD_TT_BALANCER", "prefix_aware"),
                           "world": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
                           "layers": self.model_args.n_layers, "seq_len": jc.training.seq_len,
                           "context_parallel": self.parallel_dims.cp, "tensor_parallel": self.parallel_dims.tp,
                           # a row of seq_len tokens per CP group and TP group (the table's tokens/s)
                           "tokens_per_step": jc.training.seq_len * self.parallel_dims.world_size
                           // (self.parallel_dims.cp * self.parallel_dims.tp),
                           "compile": jc.compile.enable, "activation_checkpoint": jc.activation_checkpoint.mode,
                           "mean_step_s_after_first": sum(steady) / len(steady), "steps": self.records}
                pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
                pathlib.Path(path).write_text(json.dumps(summary, indent=1))
            if getattr(self, "_plan_one_ahead", None) is not None and self._plan_one_ahead.close() is not None:
                self.model_parts[0].forget_planned()  # handed back: the run ends before it
                if rank0:
                    print("titan_cad_spec: the run ended with one micro-batch loaded ahead, not trained (its plan was "
                          "waited for and released)", flush=True)
            # CAD's stacks (their planning thread and its gloo group) go before TorchTitan's main destroys the
            # process groups, not at exit after them (a planning collective on a destroyed group aborts).
            cad.shutdown()
            super().close()

    return RecordingTrainer


def job_uses_cad(job_config):
    return job_config.model.name.startswith("llama3_cad")


def save_gradients(model, path):
    """Every parameter's whole gradient after the first step (FSDP and TP shards gathered: collective), written by
    rank 0 to `path` ($CAD_TT_GRADS) for a comparison with another layout's run."""
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        grads[name.replace("_checkpoint_wrapped_module.", "")] = None if g is None else g.detach().cpu().clone()
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        torch.save(grads, path)


def _version():
    import torchtitan
    return getattr(torchtitan, "__version__", "?")


if __name__ == "__main__":
    sys.modules.setdefault("titan_cad_spec", sys.modules["__main__"])
    from torchtitan.train import main
    main(recording_trainer())
    titan_common.leave_after_training()
