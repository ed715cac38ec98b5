#!/usr/bin/env python3
"""Train a transformers Llama model (random weights from a config, nothing downloaded) on packed Pretrain-recipe
batches, data parallel (DDP or FSDP2), attention through CAD or local, under torchrun (or as one process).

    torchrun --nproc-per-node 4 examples/train_llama.py --attention cad --balancer prefix_aware \
        --context 4096 --layers 2 --steps 10 --device cpu
    torchrun --nproc-per-node 2 examples/train_llama.py --device cuda --model llama3-8b --layers 8 \
        --context 65536 --micro-batches 2 --checkpointing full --configs local,torch_varlen,prefix_aware,distca+pp

This program is the entry: the process group, the device, the configurations of --configs one after another. The
parts are the package's (cad.train): the command line (cad.train.llama_args), one configuration's steps
(cad.train.llama.train_one: what a step does, its records and the MFU formula are in that module's documentation,
which --help prints), the batch recipe (cad.train.recipe), the nano-batch split (cad.train.nano), the model and
its loss (cad.train.model). Copy it and change the loop, or call cad.train.llama.train_one from your own.
"""
import gc
import json
import os
import pathlib

import torch
import torch.distributed as dist

import cad
from cad.train import llama, llama_args
from cad.train.launch import launched_distributed, run_exiting_on_failure


def train(args):
    """Every configuration of the command line in this process, one after another (one start-up)."""
    distributed = launched_distributed()
    if distributed:
        dist.init_process_group(args.backend)
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    lengths = json.loads(pathlib.Path(args.data).read_text())
    for label, run in llama_args.configurations(args):
        if label is not None and rank == 0:
            print(f"==== configuration {label}", flush=True)
        llama.train_one(run, rank, world, device, lengths)
        # The next configuration starts from the same empty allocator. The collector first: FSDP2's and
        # autograd's reference cycles keep a finished configuration's model, gradients and optimizer state alive
        # until a collection runs, and on 2 H200s (2026-11-26) every later configuration's peak memory was
        # 2.5-3 GiB above the one before it, whatever its attention.
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    cad.shutdown()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


def main():
    args = llama_args.parse_args()
    if args.list_configs:  # what tests/multi_gpu/run.sh expects on disk: no second copy of the naming rules
        for name, (label, _) in zip((args.configs or "").split(","), llama_args.configurations(args)):
            print(f"{name}\t{label}")
        return
    run_exiting_on_failure("train_llama", train, args)


if __name__ == "__main__":
    main()
