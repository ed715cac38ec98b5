#!/usr/bin/env python3
"""Train a transformers Llama model pipeline parallel (GPipe or 1F1B) x data parallel, with core attention through
CAD balanced per pipeline tick across every rank, or local.

    torchrun --nproc-per-node 4 examples/train_pipeline.py --pp 2 --attention cad --pool tick \
        --context 1024 --layers 4 --micro-batches 4 --steps 3 --device cpu
    torchrun --nproc-per-node 2 examples/train_pipeline.py --device cuda --pp 2 --model llama3-8b --layers 4 \
        --context 32768 --micro-batches 4 --configs local,local_balanced,torch_varlen,cad_tick,cad_bubble,cad_stage \
        --json-out 'out_{config}.json'

This program is the entry: the process group, the device, the configurations of --configs one after another and
their comparison table. The parts are the package's (cad.train): the command line (cad.train.pipeline_args), one
configuration's ticks and steps (cad.train.pipeline.train_one: the layout, the schedules, the pools and the
measurements are in that module's documentation, which --help prints), the tick schedule beside cad.CallOrder
(cad.train.schedule), the stage's model (cad.train.pipeline_stage), records and the realised share
(cad.train.pipeline_report, cad.train.share).
"""
import datetime
import gc
import json
import os
import pathlib

import torch
import torch.distributed as dist

import cad
from cad.train import pipeline, pipeline_args
from cad.train.launch import launched_distributed, run_exiting_on_failure
from cad.train.pipeline_report import comparison_table


def train(args):
    """Every configuration of the command line in this process (same weights, same batches); then, with more than
    one, the comparison table. Returns {configuration: summary}."""
    distributed = launched_distributed()
    if distributed:
        # (NCCL: twice --timeout-ms, so that the trainer's own deadlines, which name the tick, come first)
        timeout = datetime.timedelta(milliseconds=args.timeout_ms * (2 if args.backend == "nccl" else 1))
        dist.init_process_group(args.backend, timeout=timeout)
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    lengths = json.loads(pathlib.Path(args.data).read_text())
    summaries = {}
    for label, run in pipeline_args.configurations(args):
        if label is not None and rank == 0:
            print(f"==== configuration {label}", flush=True)
        summaries[label or args.attention] = pipeline.train_one(run, rank, world, device, lengths)["summary"]
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    if rank == 0 and len(summaries) > 1:
        print(comparison_table(summaries), flush=True)
    cad.shutdown()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return summaries


def main():
    # As train_llama: a failed rank leaves at once (its traceback and the tick's message on stderr).
    run_exiting_on_failure("train_pipeline", train, pipeline_args.parse_args())


if __name__ == "__main__":
    main()
