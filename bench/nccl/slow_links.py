#!/usr/bin/env python3
"""slow_links.py -- all-to-all bandwidth and latency (1 MiB .. 1 GiB per rank) of the slow-link stand-ins that
let one multi-GPU host stand for a link slower than NVLink (docs/slow_links.md says which InfiniBand class each
one stands for), with torch.distributed.all_to_all_single on NCCL as the anchor and, where the stand-in is an
NCCL setting, also CAD's NCCL communicator plugin (bench_nccl_all_to_all, through the plugin ABI).

Stand-ins (--standins, comma-separated; default all):
  nvlink          the anchor: NCCL as it is (NVLink), torch and CAD's communicator
  p2p_off         NCCL_P2P_DISABLE=1: every byte through host shared memory (NCCL's SHM transport)
  p2p_shm_off     NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: through NCCL's network transport (sockets, loopback)
  channels:K      NCCL_MAX_NCHANNELS=K NCCL_MIN_NCHANNELS=1 for torch; CAD's communicator with
                  {"max_ctas": K} (ncclConfig_t.maxCTAs, per communicator)
  split:K         an emulated split of the GPUs into "nodes" of --gpus-per-node: pairs inside a node exchange
                  over a full NCCL communicator, pairs across nodes over a second NCCL communicator of the
                  same ranks limited to K CTAs (ncclConfig_t.maxCTAs: per communicator, where NCCL's
                  environment is read once per process); both halves run at once on two streams and the
                  time is the whole all-to-all's
  split_host      the same split, the cross-node pairs staged through pinned host memory and exchanged by gloo
                  (device -> host copy, gloo send/recv, host -> device copy)
  host_staged     CAD's host-staged path alone: bench_nccl_all_to_all over CAD's mpi communicator (cad_mpi.so,
                  OpenMPI's shared-memory transport), each peer's bytes copied device -> pinned host -> device
                  around the host all_to_all_v, as plugins/cad's StagedWire does; no torch run. With
                  --share-gpu every process runs on GPU 0 (the only stand-in that can: NCCL refuses two ranks
                  on one GPU), so one GPU stands for --gpus GPUs behind a host-bound link
Every run sets NCCL_NVLS_ENABLE=0. Results: $OUT (or --out) gets <standin>.<impl>.csv per run (the columns of
bench_all_to_all.cpp), summary.json (per stand-in and implementation: the curve, peak bus bandwidth, latency at
1 MiB, the nearest InfiniBand class) and summary.md. Exits 1 on any failed run (a CAD benchmark that is not
built included) or wrong received bytes; a stand-in within 10% of nvlink at 1 GiB gets a warning.

  python3 bench/nccl/slow_links.py --gpus 4 [--gpus-per-node 2] [--standins nvlink,p2p_off,split:2]
      [--cad-bench build/bin/bench_nccl_all_to_all] [--plugin build/lib/cad/plugins/cad_nccl.so] [--out DIR]
  python3 bench/nccl/slow_links.py --gpus 4 --share-gpu --standins host_staged   (one GPU, 4 processes)
  python3 bench/nccl/slow_links.py --gpus 4 --dry-run     (no GPU: prints the runs, the pair map, and exits)
"""
import argparse
import csv
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = [1 << e for e in range(20, 31, 2)]  # 1 MiB .. 1 GiB per rank, x4 (bench_all_to_all.cpp's sizes)
# Per-GPU InfiniBand classes (one NIC per GPU, unidirectional payload bandwidth, ~90% of the line rate).
IB_CLASSES = [("EDR 100 Gb/s", 11.25), ("HDR 200 Gb/s", 22.5), ("NDR 400 Gb/s", 45.0), ("XDR 800 Gb/s", 90.0)]


class UsageError(Exception):
    pass


def parse_standin(text):
    """'p2p_off' -> ('p2p_off', None); 'split:2' -> ('split', 2). UsageError naming the entry otherwise."""
    name, _, arg = text.partition(":")
    if name in ("nvlink", "p2p_off", "p2p_shm_off", "split_host", "host_staged"):
        if arg:
            raise UsageError(f"stand-in '{text}': '{name}' takes no ':K'")
        return name, None
    if name in ("channels", "split"):
        if not arg.isdigit() or not 1 <= int(arg) <= 64:
            raise UsageError(f"stand-in '{text}': '{name}:K' needs K in 1..64 (channels or CTAs)")
        return name, int(arg)
    raise UsageError(f"stand-in '{text}': expected nvlink, p2p_off, p2p_shm_off, channels:K, split:K, split_host "
                     "or host_staged")


def standin_env(name, k):
    """The environment a stand-in's processes start with (NCCL reads it once per process)."""
    env = {"NCCL_NVLS_ENABLE": "0"}
    if name in ("p2p_off", "p2p_shm_off"):
        env["NCCL_P2P_DISABLE"] = "1"
    if name == "p2p_shm_off":
        env["NCCL_SHM_DISABLE"] = "1"
    if name == "channels":
        env.update({"NCCL_MAX_NCHANNELS": str(k), "NCCL_MIN_NCHANNELS": "1"})
    return env


def pair_map(world, gpus_per_node):
    """cross[s][d] is True when ranks s and d sit in different emulated nodes (rank // gpus_per_node)."""
    if gpus_per_node < 1 or world % gpus_per_node != 0 or world // gpus_per_node < 2:
        raise UsageError(f"--gpus-per-node {gpus_per_node} must divide --gpus {world} into at least 2 nodes")
    return [[s // gpus_per_node != d // gpus_per_node for d in range(world)] for s in range(world)]


def split_counts(world, gpus_per_node, rank, per_peer):
    """This rank's send counts (bytes per peer) for the intra-node and the cross-node halves of one
    all-to-all of `per_peer` bytes to every rank: each peer's bytes go to exactly one half."""
    cross = pair_map(world, gpus_per_node)[rank]
    intra = [0 if c else per_peer for c in cross]
    across = [per_peer if c else 0 for c in cross]
    return intra, across


def ib_class(gbps):
    return min(IB_CLASSES, key=lambda c: abs(math.log(gbps / c[1])))[0] if gbps > 0 else "-"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, default=None, help="emulated node size of split:K (default gpus/2)")
    p.add_argument("--standins",
                   default="nvlink,p2p_off,p2p_shm_off,channels:2,channels:4,split:2,split:4,split_host,host_staged")
    p.add_argument("--cad-bench", default=os.path.join(ROOT, "build/bin/bench_nccl_all_to_all"))
    p.add_argument("--plugin", default=os.path.join(ROOT, "build/lib/cad/plugins/cad_nccl.so"))
    p.add_argument("--mpi-plugin", default=os.path.join(ROOT, "build/lib/cad/plugins/cad_mpi.so"),
                   help="host_staged's communicator")
    p.add_argument("--share-gpu", action="store_true", help="every process on GPU 0 (host_staged only)")
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--out", default=os.environ.get("OUT", "slow_links_out"))
    p.add_argument("--dry-run", action="store_true", help="print the runs and the pair map; start nothing")
    p.add_argument("--child", help=argparse.SUPPRESS)  # one torch stand-in, in its own process
    args = p.parse_args(argv)
    if args.gpus < 2:
        raise UsageError(f"--gpus {args.gpus}: an all-to-all needs at least 2 GPUs")
    if args.gpus_per_node is None:
        args.gpus_per_node = max(1, args.gpus // 2)
    args.parsed = [parse_standin(s) for s in args.standins.split(",") if s]
    if not args.parsed:
        raise UsageError("--standins is empty")
    if any(n in ("split", "split_host") for n, _ in args.parsed):
        pair_map(args.gpus, args.gpus_per_node)
    if args.share_gpu and any(n != "host_staged" for n, _ in args.parsed):
        raise UsageError("--share-gpu runs only host_staged (NCCL refuses two ranks on one GPU; torch's runs take "
                         "one GPU per rank)")
    return args


def label(name, k):
    return name if k is None else f"{name}{k}"


def runs(args):
    """Every run: (stand-in label, impl, env, command)."""
    out = []
    for name, k in args.parsed:
        env = standin_env(name, k)
        tag = label(name, k)
        if name == "host_staged":
            # OpenMPI's shared-memory transport only (what a host-bound link between a node's GPUs would use);
            # a generous timeout: 4 processes on one GPU move 4 GiB through one PCIe link per call at 1 GiB.
            cmd = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader",
                   "-np", str(args.gpus), args.cad_bench, args.mpi_plugin, "--csv", os.path.join(args.out, f"{tag}.cad.csv"),
                   "--config", json.dumps({"timeout_ms": 120000}), "--label", f"cad_{tag}"]
            if args.share_gpu:
                cmd += ["--device", "0"]
            out.append((tag, "cad", env, cmd))
            continue
        torch_cmd = [sys.executable, os.path.abspath(__file__), "--gpus", str(args.gpus), "--gpus-per-node",
                     str(args.gpus_per_node), "--standins", f"{name}" + (f":{k}" if k else ""), "--out", args.out,
                     "--child", tag]
        out.append((tag, "torch", env, torch_cmd))
        if name in ("nvlink", "p2p_off", "p2p_shm_off", "channels"):
            config = json.dumps({"max_ctas": k}) if name == "channels" else "{}"
            cad_cmd = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(args.gpus)]
            for key, value in env.items():
                cad_cmd += ["-x", f"{key}={value}"]
            cad_cmd += [args.cad_bench, args.plugin, "--csv", os.path.join(args.out, f"{tag}.cad.csv"), "--config",
                        config, "--label", f"cad_{tag}"]
            out.append((tag, "cad", env, cad_cmd))
    return out


# ---- the torch side (one process per GPU; only in --child) -------------------------------------------------

def torch_worker(rank, world, port, tag, name, k, gpus_per_node, out_dir):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    slow = host = None
    pinned_in = pinned_out = None
    if name == "split":
        opts = dist.ProcessGroupNCCL.Options()
        opts.config.max_ctas = k
        opts.config.min_ctas = 1
        slow = dist.new_group(list(range(world)), backend="nccl", pg_options=opts)
    if name == "split_host":
        host = dist.new_group(list(range(world)), backend="gloo")
    main_stream, side_stream = torch.cuda.Stream(), torch.cuda.Stream()
    rows, failed = [], False
    for total in SIZES:
        per_peer = total // world
        nbytes = per_peer * world
        inp = (torch.arange(nbytes, device="cuda", dtype=torch.int64) % 251 + rank).to(torch.uint8)
        out = torch.empty_like(inp)
        cross = pair_map(world, gpus_per_node)[rank] if name in ("split", "split_host") else None
        if cross is not None:
            # all_to_all_single packs a split's chunks back to back, so each half gets its own buffers, laid out
            # in peer order once (as CAD's pack lays out its send buffer before the exchange).
            intra, across = split_counts(world, gpus_per_node, rank, per_peer)
            blocks = inp.view(world, per_peer)
            in_intra = blocks[[p for p in range(world) if not cross[p]]].reshape(-1).contiguous()
            in_cross = blocks[[p for p in range(world) if cross[p]]].reshape(-1).contiguous()
            out_intra, out_cross = torch.empty_like(in_intra), torch.empty_like(in_cross)
            if name == "split_host":
                pinned_in = torch.empty(in_cross.numel(), dtype=torch.uint8, pin_memory=True)
                pinned_out = torch.empty(in_cross.numel(), dtype=torch.uint8, pin_memory=True)
            cross_peers = [p for p in range(world) if cross[p]]

        def once():
            if cross is None:
                dist.all_to_all_single(out, inp)
                return
            if name == "split":
                # Cross pairs on their own stream over the CTA-limited communicator, intra pairs beside them.
                side_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side_stream):
                    dist.all_to_all_single(out_cross, in_cross, across, across, group=slow)
                dist.all_to_all_single(out_intra, in_intra, intra, intra)
                torch.cuda.current_stream().wait_stream(side_stream)
                return
            # split_host: intra pairs on NCCL, cross pairs through pinned host memory and gloo.
            dist.all_to_all_single(out_intra, in_intra, intra, intra)
            pinned_in.copy_(in_cross, non_blocking=True)
            torch.cuda.current_stream().synchronize()
            reqs = []
            for i, peer in enumerate(cross_peers):
                lo = i * per_peer
                reqs.append(dist.isend(pinned_in[lo:lo + per_peer], peer, group=host))
                reqs.append(dist.irecv(pinned_out[lo:lo + per_peer], peer, group=host))
            for r in reqs:
                r.wait()
            out_cross.copy_(pinned_out, non_blocking=True)

        def received():
            if cross is None:
                return out
            parts, i_intra, i_cross = [], 0, 0
            for p in range(world):
                if cross[p]:
                    parts.append(out_cross[i_cross * per_peer:(i_cross + 1) * per_peer])
                    i_cross += 1
                else:
                    parts.append(out_intra[i_intra * per_peer:(i_intra + 1) * per_peer])
                    i_intra += 1
            return torch.cat(parts)

        iters = 5 if total >= 256 << 20 else 20
        with torch.cuda.stream(main_stream):
            once()
            torch.cuda.synchronize()
            # Every peer's block must hold what that peer sent (the pattern above, shifted by its rank).
            want = torch.cat([(torch.arange(rank * per_peer, (rank + 1) * per_peer, device="cuda", dtype=torch.int64)
                               % 251 + peer).to(torch.uint8) for peer in range(world)])
            if not torch.equal(received(), want):
                print(f"[rank {rank}] {tag}: wrong bytes received at {nbytes} bytes per rank", file=sys.stderr)
                failed = True
            for _ in range(3):
                once()
            torch.cuda.synchronize()
            dist.barrier()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(main_stream)
            for _ in range(iters):
                once()
            stop.record(main_stream)
            torch.cuda.synchronize()
        seconds = start.elapsed_time(stop) / 1e3 / iters
        algbw = nbytes / seconds / 1e9
        busbw = algbw * (world - 1) / world
        rows.append(f"torch_{tag},{world},{nbytes},{seconds:.9f},{algbw:.3f},{busbw:.3f}")
        if rank == 0:
            print(f"torch_{tag} {nbytes:14d} {seconds * 1e6:12.1f} us {algbw:10.2f} GB/s {busbw:10.2f} GB/s", flush=True)
        del inp, out, want
        if cross is not None:
            del in_intra, in_cross, out_intra, out_cross
    flag = torch.tensor([1 if failed else 0], device="cuda")
    dist.all_reduce(flag)
    if rank == 0:
        with open(os.path.join(out_dir, f"{tag}.torch.csv"), "w") as f:
            f.write("impl,world,bytes_per_rank,seconds,algbw_GBps,busbw_GBps\n" + "\n".join(rows) + "\n")
    dist.destroy_process_group()
    if flag.item() != 0:
        sys.exit(1)


def run_child(args):
    import socket
    import torch.multiprocessing as mp
    (name, k), = args.parsed
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(torch_worker, args=(args.gpus, port, args.child, name, k, args.gpus_per_node, args.out),
             nprocs=args.gpus, join=True)
    return 0


# ---- the driver ---------------------------------------------------------------------------------------------

def summarize(out_dir, tags, world, gpus_per_node):
    """Per run: the curve, the 1 MiB latency, bus bandwidth at 1 GiB and at its peak, and the InfiniBand class of
    the per-GPU bandwidth that leaves the GPU (the bus bandwidth; for a split, only the cross-node bytes: those
    are the ones a network would carry)."""
    summary, lines = {}, ["| stand-in | impl | 1 MiB latency (us) | 1 GiB busbw (GB/s) | peak busbw (GB/s) | "
                          "1 GiB per-GPU slow-link GB/s | InfiniBand class |", "|---|---|---:|---:|---:|---:|---|"]
    for tag in tags:
        for impl in ("torch", "cad"):
            path = os.path.join(out_dir, f"{tag}.{impl}.csv")
            if not os.path.exists(path):
                continue
            with open(path) as f:
                rows = list(csv.DictReader(f))
            curve = [{k: float(r[k]) for k in ("bytes_per_rank", "seconds", "algbw_GBps", "busbw_GBps")} for r in rows]
            if not curve:
                continue
            peak = max(c["busbw_GBps"] for c in curve)
            last = curve[-1]
            slow = last["busbw_GBps"]
            if tag.startswith("split"):
                slow = last["bytes_per_rank"] * (world - gpus_per_node) / world / last["seconds"] / 1e9
            entry = {"curve": curve, "latency_1MiB_us": curve[0]["seconds"] * 1e6, "busbw_1GiB": last["busbw_GBps"],
                     "peak_busbw": peak, "slow_link_GBps_1GiB": slow, "ib_class": ib_class(slow)}
            summary.setdefault(tag, {})[impl] = entry
            lines.append(f"| {tag} | {impl} | {entry['latency_1MiB_us']:.1f} | {entry['busbw_1GiB']:.1f} | {peak:.1f} | "
                         f"{slow:.1f} | {entry['ib_class'] if tag != 'nvlink' else '(NVLink)'} |")
    return summary, "\n".join(lines) + "\n"


def main(argv):
    try:
        args = parse_args(argv)
    except UsageError as e:
        print(f"slow_links.py: {e}", file=sys.stderr)
        return 2
    if args.child:
        return run_child(args)
    planned = runs(args)
    if args.dry_run:
        if any(n in ("split", "split_host") for n, _ in args.parsed):
            cross = pair_map(args.gpus, args.gpus_per_node)
            print(f"pair map ({args.gpus} GPUs, nodes of {args.gpus_per_node}; x = cross-node, slowed):")
            for s, row in enumerate(cross):
                print(f"  rank {s}: " + " ".join("x" if c else "." for c in row))
        for tag, impl, env, cmd in planned:
            print(f"{tag:14s} {impl:5s} " + " ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(cmd))
        return 0
    os.makedirs(args.out, exist_ok=True)
    failures = []
    for tag, impl, env, cmd in planned:
        plugin = args.mpi_plugin if tag == "host_staged" else args.plugin
        if impl == "cad" and not (os.path.exists(args.cad_bench) and os.path.exists(plugin)):
            failures.append(f"{tag} cad: {args.cad_bench} or {plugin} not built (a CUDA build with NCCL)")
            continue
        print(f"== {tag} ({impl})", flush=True)
        done = subprocess.run(cmd, env={**os.environ, **env})
        if done.returncode != 0:
            failures.append(f"{tag} {impl}: exit {done.returncode}")
    tags = [label(n, k) for n, k in args.parsed]
    summary, table = summarize(args.out, tags, args.gpus, args.gpus_per_node)
    meta = {"gpus": args.gpus, "gpus_per_node": args.gpus_per_node, "standins": tags, "failures": failures,
            "share_gpu": args.share_gpu}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"run": meta, "results": summary}, f, indent=1)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(table)
    print(table)
    # A stand-in no slower than NVLink stands for nothing: said loudly, but the curves are still the result.
    anchor = summary.get("nvlink", {}).get("torch")
    for tag in tags:
        for impl, entry in summary.get(tag, {}).items():
            if tag != "nvlink" and anchor is not None and entry["busbw_1GiB"] >= 0.9 * anchor["busbw_1GiB"]:
                print(f"WARNING: {tag} {impl}: {entry['busbw_1GiB']:.1f} GB/s at 1 GiB is within 10% of nvlink's "
                      f"{anchor['busbw_1GiB']:.1f}: not a stand-in for a slower link", file=sys.stderr)
    for f in failures:
        print("FAIL: " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
