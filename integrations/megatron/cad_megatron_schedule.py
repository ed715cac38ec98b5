"""Training with CAD the way Megatron-Core trains: its DistributedDataParallel (gradient buffers reduced over the
data x context group), its distributed optimizer (fp32 master weights and Adam state sharded over that group), and
its pipeline schedules (`get_forward_backward_func`: 1F1B with PP > 1), on packed THD micro-batches whose plans are
made ahead.

    from cad_megatron_schedule import MicroBatch, PlannedMicroBatches, megatron_ddp_and_optimizer, train_step
    model, optimizer = megatron_ddp_and_optimizer(config, gpt_model, lr=3e-4)   # model: [the DDP chunk]
    batches = PlannedMicroBatches(load, config)    # load(k) -> MicroBatch of micro-batch k (every stage, same docs)
    loss = train_step(model, optimizer, batches, num_microbatches=m, seq_length=tokens)

Plans: `PlannedMicroBatches` hands micro-batch k to the schedule and, before that, loads micro-batch k + 1 and asks
for its plan ahead (cad_megatron.attach_plan(ahead=True, tag=k + 1)): CAD's planning thread makes it while micro-batch
k computes, so no layer waits for a plan. Every pipeline stage runs attention, so every stage loads every micro-batch
(the same documents: the stage's data-parallel rank's), in the same order; its plan is made over that stage's CAD
group (cad_megatron.init_cad). Under tensor parallelism every TP rank loads the same micro-batch.

Megatron-Core 0.16 allocates these on CUDA (its gradient buffers, the schedules' token counts and p2p shapes): GPU
only. CAD under tensor, pipeline and context parallelism is tested on the CPU at the model level
(test_cad_megatron_tp.py).
"""
import dataclasses
import functools
from typing import Any, Optional

import torch

import cad_megatron

__all__ = ["MicroBatch", "PlannedMicroBatches", "forward_step", "megatron_ddp_and_optimizer", "train_step"]


@dataclasses.dataclass
class MicroBatch:
    """One rank's packed THD micro-batch: input_ids, labels, position_ids [1, t] (on the model's device), loss_mask
    [1, t] (0 where a token predicts nothing), packed (PackedSeqParams, qkv_format 'thd'), cu_seqlens_host (a CPU
    copy of packed.cu_seqlens_q, so that planning reads nothing back from the GPU; None under CAD's context-parallel
    layout, whose pieces are attached)."""
    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    packed: Any
    cu_seqlens_host: Optional[torch.Tensor] = None


class PlannedMicroBatches:
    """The schedule's data iterator: micro-batch k from load(k), its plan asked for ahead when micro-batch k - 1 is
    handed out (see the module). load(k) -> MicroBatch, for k = 0, 1, ... (every rank of a CAD group the same k in
    the same order). balance=False attaches no plan (CAD's local attention, or another core attention)."""

    def __init__(self, load, config, balance=True):
        self.load, self.config, self.balance = load, config, balance
        self.k = 0
        self.next = self._planned(0)

    def _planned(self, k):
        batch = self.load(k)
        if self.balance and getattr(batch.packed, "cad_plan", None) is None:
            batch.packed = cad_megatron.attach_plan(batch.packed, self.config, cu_seqlens_host=batch.cu_seqlens_host,
                                                    ahead=True, tag=k)
        return batch

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.next
        self.k += 1
        self.next = self._planned(self.k)  # planned on CAD's thread while `batch` computes
        return batch


def _loss(loss_mask, output_tensor):
    """Megatron's per-token loss (config.calculate_per_token_loss): the micro-batch's summed token loss, its token
    count, and the pair for reporting."""
    mask = loss_mask.reshape(-1).float()
    loss = (output_tensor.float().reshape(-1) * mask).sum()
    tokens = mask.sum().to(torch.int)
    return loss, tokens, {"lm loss": torch.stack([loss.detach(), tokens.float()])}


def forward_step(data_iterator, model):
    """get_forward_backward_func's forward_step_func: the next micro-batch through the model chunk (the first stage
    embeds input_ids, the last computes the token losses from labels; every stage's attention reads packed)."""
    batch = next(data_iterator)
    output = model(batch.input_ids, batch.position_ids, None, labels=batch.labels, packed_seq_params=batch.packed)
    return output, functools.partial(_loss, batch.loss_mask)


def megatron_ddp_and_optimizer(config, module, *, lr, weight_decay=0.0, clip_grad=1.0, bucket_size=None):
    """([module in Megatron's DistributedDataParallel], Megatron's distributed optimizer: Adam with fp32 master
    weights sharded over the data x context group). Sets what the schedule needs on config:
    calculate_per_token_loss (the loss is a sum over tokens, divided by the step's token count in
    finalize_model_grads), no_sync_func, finalize_model_grads_func and grad_scale_func. module: the model chunk
    (a GPTModel of this stage, on the GPU; wrap bf16 models in Float16Module first)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=True, bucket_size=bucket_size)
    chunk = DistributedDataParallel(config, ddp_config, module)
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=lr, weight_decay=weight_decay, clip_grad=clip_grad, bf16=config.bf16,
        fp16=config.fp16, params_dtype=config.params_dtype, use_distributed_optimizer=True), [chunk])
    config.calculate_per_token_loss = True
    config.no_sync_func = chunk.no_sync
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    return [chunk], optimizer


def train_step(model, optimizer, batches, *, num_microbatches, seq_length):
    """One step through Megatron's schedule (get_forward_backward_func: 1F1B with PP > 1, no pipelining otherwise)
    and the optimizer. seq_length: a micro-batch's tokens per data-parallel replica (each rank's tokens x the
    context-parallel size: the schedule's p2p shapes divide it by cp, and by tp under sequence parallelism).
    Returns the step's mean token loss over this stage's data x context group on the last pipeline stage, else
    None."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    for chunk in model:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    losses = get_forward_backward_func()(forward_step_func=forward_step, data_iterator=batches, model=model,
                                         num_microbatches=num_microbatches, seq_length=seq_length,
                                         micro_batch_size=1, forward_only=False)
    optimizer.step()
    if not ps.is_pipeline_last_stage():
        return None
    total = torch.stack([x["lm loss"] for x in losses]).sum(0)
    dist.all_reduce(total, group=ps.get_data_parallel_group(with_context_parallel=True))
    return float(total[0] / total[1])
