"""torch_all_to_all.py -- the anchor for bench_all_to_all.cpp: torch.distributed.all_to_all_single on
the NCCL backend, same sizes, same timing (after a barrier, CUDA events around back-to-back calls on
one stream, rank 0's mean per call), one process per GPU via mp.spawn.

    python3 bench/nccl/torch_all_to_all.py --gpus 4 --csv torch.csv
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world, port, csv_path):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    stream = torch.cuda.Stream()
    rows = []
    total = 1 << 20
    while total <= 1 << 30:
        per_peer = total // world
        nbytes = per_peer * world
        inp = torch.full((nbytes,), rank, dtype=torch.uint8, device="cuda")
        out = torch.empty_like(inp)
        iters = 10 if total >= 256 << 20 else 30
        with torch.cuda.stream(stream):
            for _ in range(5):
                dist.all_to_all_single(out, inp)
            stream.synchronize()
            dist.barrier()
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(iters):
                dist.all_to_all_single(out, inp)
            stop.record(stream)
            stream.synchronize()
        seconds = start.elapsed_time(stop) / 1e3 / iters
        algbw = nbytes / seconds / 1e9
        busbw = algbw * (world - 1) / world
        if rank == 0:
            print(f"torch  {nbytes:14d} {seconds * 1e6:12.1f} {algbw:12.2f} {busbw:12.2f}", flush=True)
            rows.append(f"torch,{world},{nbytes},{seconds:.9f},{algbw:.3f},{busbw:.3f}")
        del inp, out
        total *= 4
    if rank == 0 and csv_path:
        with open(csv_path, "w") as f:
            f.write("impl,world,bytes_per_rank,seconds,algbw_GBps,busbw_GBps\n" + "\n".join(rows) + "\n")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--csv", default="")
    parser.add_argument("--port", type=int, default=29517)
    args = parser.parse_args()
    mp.spawn(worker, args=(args.gpus, args.port, args.csv), nprocs=args.gpus, join=True)


if __name__ == "__main__":
    main()
