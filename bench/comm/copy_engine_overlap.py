"""Does a transfer between two GPUs slow the attention kernel running beside it, and how much less with the copy
engines than with NCCL's kernels? One process, two GPUs (NVLink), no CAD plan: what an overlapped exchange costs.

On each GPU the project's forward attention kernel (cad.varlen.varlen_attn, local: persistent, one block per SM)
runs --calls times on a compute stream, on --tokens tokens cut into documents of --doc tokens (causal, Hq 32,
Hkv 8, D 128, bf16). Beside it, on a side stream of each GPU, --mib MiB go to the other GPU --copies times, as:
  none  no transfer (the kernel alone);
  ce    cudaMemcpyPeerAsync (tensor.copy_ across devices): the copy engines, no SM;
  nccl  torch.cuda.nccl.all_gather of the same bytes (NCCL's kernels, on SMs, both GPUs at once).
Printed per mode: the attention calls' time on GPU 0 (CUDA events, median over --rounds), the transfers' time and
bandwidth per direction (nccl: the bytes sent to the other GPU; its all_gather also copies them locally), and the
attention's slowdown against `none` (the defaults size the transfers to span the attention calls). Timings only.

    PYTHONPATH=host_adapter/python CAD_HOST_LIBRARY=build-gpu/lib/libcad_host.so \\
        CAD_PLUGIN_PATH=build-gpu/lib/cad/plugins python3 bench/comm/copy_engine_overlap.py
"""
import argparse
import statistics

import torch
import torch.cuda.nccl as nccl


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--doc", type=int, default=8192)
    p.add_argument("--calls", type=int, default=6)
    p.add_argument("--mib", type=int, default=128)
    p.add_argument("--copies", type=int, default=96)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit("copy_engine_overlap.py: needs 2 GPUs")
    from cad.varlen import varlen_attn
    devices = [torch.device("cuda", i) for i in (0, 1)]
    for d in devices:
        with torch.cuda.device(d):
            torch.empty(1, device=d)
    cu = torch.arange(0, args.tokens + 1, args.doc, dtype=torch.int32)
    cu = torch.cat([cu, torch.tensor([args.tokens], dtype=torch.int32)]) if cu[-1] != args.tokens else cu
    work, streams, side = [], [], []
    n = args.mib * 2**20 // 2
    for d in devices:
        q = torch.randn(args.tokens, 32, 128, device=d, dtype=torch.bfloat16)
        k = torch.randn(args.tokens, 8, 128, device=d, dtype=torch.bfloat16)
        v = torch.randn(args.tokens, 8, 128, device=d, dtype=torch.bfloat16)
        work.append((q, k, v, cu.to(d)))
        streams.append(torch.cuda.Stream(device=d))
        side.append(torch.cuda.Stream(device=d))
    send = [torch.randn(n, device=d, dtype=torch.bfloat16) for d in devices]
    recv = [torch.empty(n, device=d, dtype=torch.bfloat16) for d in devices]
    gathered = [torch.empty(2 * n, device=d, dtype=torch.bfloat16) for d in devices]
    longest = args.doc

    def attention(i):
        q, k, v, c = work[i]
        with torch.cuda.stream(streams[i]):
            for _ in range(args.calls):
                varlen_attn(q, k, v, c, c, longest, longest, window_size=(-1, 0))

    def transfers(mode):
        if mode == "ce":
            for i in (0, 1):
                with torch.cuda.stream(side[i]):
                    for _ in range(args.copies):
                        recv[1 - i].copy_(send[i], non_blocking=True)
        elif mode == "nccl":
            for _ in range(args.copies):
                nccl.all_gather(send, gathered, streams=side)

    results = {}
    for mode in ("none", "ce", "nccl", "none"):
        attn_ms, copy_ms = [], []
        for r in range(args.rounds + 1):
            for d in devices:
                torch.cuda.synchronize(d)
            events = {key: torch.cuda.Event(enable_timing=True) for key in ("a0", "a1", "c0", "c1")}
            events["a0"].record(streams[0])
            events["c0"].record(side[0])
            transfers(mode)
            attention(0)
            attention(1)
            events["a1"].record(streams[0])
            events["c1"].record(side[0])
            for d in devices:
                torch.cuda.synchronize(d)
            if r:  # round 0 warms up
                attn_ms.append(events["a0"].elapsed_time(events["a1"]))
                copy_ms.append(events["c0"].elapsed_time(events["c1"]))
        results.setdefault(mode, []).append((statistics.median(attn_ms), statistics.median(copy_ms)))
    base = statistics.mean(a for a, _ in results["none"])
    print(f"| mode | attention ms ({args.calls} calls, GPU 0) | slowdown | attention ms lost | transfers ms (side "
          f"stream) | GB/s per direction |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode, runs in results.items():
        for attn, copy in runs:
            moved = args.copies * args.mib * 2**20
            rate = f"{moved / (copy * 1e-3) / 1e9:.0f}" if mode != "none" and copy > 0 else "-"
            print(f"| {mode} | {attn:.2f} | {attn / base:.3f} | {attn - base:.2f} | {copy:.2f} | {rate} |")


if __name__ == "__main__":
    main()
