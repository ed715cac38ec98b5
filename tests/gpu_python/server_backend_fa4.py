#!/usr/bin/env python3
"""CAD's servers through FlashAttention-4 (server_backend="fa4") on one GPU: checked against the project's kernel
and an fp32 reference, then its server batches timed beside ours. Not run by CI (no GPU there).

    python3 tests/gpu_python/server_backend_fa4.py check --out DIR   # O, LSE, dQ, dK, dV; world size 1 and 2
    python3 tests/gpu_python/server_backend_fa4.py bench --out DIR   # server compute per call, fa4 vs ours
    ... --backends default,fa4,default+fa4                          # which server_backend choices (both modes)

check: world size 1 (one process, the nccl communicator) and 2 (two processes sharing the GPU, host-staged over the
"host" communicator), bf16, Hq 16 / Hkv 4, D 128 and 64, causal with and without a window of 256, documents that the
balancer cuts (so servers get shards sharing K/V prefixes). Every rank runs the same inputs through a CAD context
per choice: server_backend "default" (our kernel), "fa4" and "torch" (fp32 math on the GPU: the reference), and any
per-direction choice --backends names (e.g. "default+fa4": our forward, FA4's backward given our O and LSE). Passes
when each of them is within a relative Frobenius difference of 1e-2 of the reference for O, LSE (over the rows
that see a key), dQ, dK, dV, and FA4's callbacks ran in exactly the directions given to FA4 (cad.server_backend.calls
around each context's call).

bench: the Pretrain recipe's buffers (cad.train.recipe over $CAD_DATA, seed 1) of --context tokens per rank, Hq 32 /
Hkv 8, D 128, bf16, causal, at world size 1 and 2 (2: two processes on one GPU, so their kernels share it: read its
times as what the batches cost, not as a step). Per round (--rounds, the backends' order rotated) one forward and
one backward per backend; the server backend's compute comes from CAD's own timing events (Context.call_times:
forward_server_ms, backward_server_ms), medians over rounds, each backend's over "default"'s. The K/V gather's
cost is inside fa4's numbers.

Both write JSON under --out (check.json, bench.json, one file per world size and rank) and exit non-zero on any
failure (a failed check, a rank that failed or hung, FA4 not available). Needs libcad_host and the plugins built for
CUDA (CAD_HOST_LIBRARY, CAD_PLUGIN_PATH, PYTHONPATH as tests/gpu_python/run.sh sets them; the plugins include
callback_attention) and FA4 importable (docs/kernels_fa4.md, "Installing FA4 on the GPU machine offline").
tests/gpu_python/server_backend_fa4.sh builds, runs both and the trainer comparison.
"""
import argparse
import datetime
import json
import os
import pathlib
import socket
import statistics
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TOLERANCE = 1e-2
BACKENDS = ("default", "fa4")  # --backends' default; check adds "torch", the reference
CHECK_DOCS = [[5000, 1200, 700, 90, 1], [300, 2600, 3900, 185]]  # per rank of 2; world size 1 takes both


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _inputs(lengths, hq, hkv, d, seed, device):
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = sum(lengths)
    q, k, v, d_o = (torch.randn(t, h, d, generator=g).to(device, torch.bfloat16) for h in (hq, hkv, hkv, hq))
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)
    return q, k, v, d_o, cu


def _run(ctx, q, k, v, d_o, cu, causal, window):
    import cad
    plan = ctx.plan(cu, causal=causal, window_size=window, device=q.device)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o, lse = cad.varlen_attn(*leaves, cu, plan=plan, causal=causal, window_size=window, return_lse=True)
    o.backward(d_o)
    torch.cuda.synchronize()
    return {"o": o.detach(), "lse": lse.detach(), "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad}


def _fa4_calls(server_backend):
    """FA4's callbacks so far, per direction, over every key whose direction is FA4's (keys NAME_DEVICE or
    FORWARD-BACKWARD_DEVICE, cad.server_backend._register)."""
    counts = {d: 0 for d in server_backend.DIRECTIONS}
    for key, n in server_backend.calls.items():
        names = key.rsplit("_", 1)[0].split("-")
        for direction, name in zip(server_backend.DIRECTIONS, (names[0], names[-1])):
            counts[direction] += n[direction] if name == "fa4" else 0
    return counts


def _check_rank(rank, world, out, backends):
    import cad
    from cad import server_backend
    device = torch.device("cuda", 0)
    comm = "nccl" if world == 1 else "host"
    checked = [b for b in backends if b != "torch"]
    contexts = {b: cad.Context(server_backend=b, communicator=comm, timeout_ms=120000) for b in checked + ["torch"]}
    lengths = sum(CHECK_DOCS, []) if world == 1 else CHECK_DOCS[rank]
    cases, failures = [], []
    ran = {b: {d: 0 for d in server_backend.DIRECTIONS} for b in contexts}  # FA4's callbacks per choice
    for d in (128, 64):
        for causal, window in ((True, (-1, -1)), (True, (256, 0))):
            q, k, v, d_o, cu = _inputs(lengths, 16, 4, d, 10 + rank + d, device)
            got = {}
            for b in contexts:
                before = _fa4_calls(server_backend)
                got[b] = _run(contexts[b], q, k, v, d_o, cu, causal, window)
                after = _fa4_calls(server_backend)
                for direction in server_backend.DIRECTIONS:
                    ran[b][direction] += after[direction] - before[direction]
            ref = got["torch"]
            seen = torch.isfinite(ref["lse"])
            case = {"d": d, "causal": causal, "window": list(window), "tokens": sum(lengths)}
            for b in checked:
                errors = {n: _rel(got[b][n], ref[n]) for n in ("o", "dq", "dk", "dv")}
                errors["lse"] = _rel(got[b]["lse"][seen], ref["lse"][seen])
                errors["lse_rows_agree"] = bool(torch.equal(torch.isfinite(got[b]["lse"]), seen))
                case[f"{b}_vs_reference"] = errors
                bad = [n for n, e in errors.items() if (e is False) or (not isinstance(e, bool) and not e <= TOLERANCE)]
                if bad:
                    failures.append(f"rank {rank} of {world}, D {d}, window {window}: {b} differs from the reference "
                                    f"in {bad}: {errors}")
            if "fa4" in got and "default" in got:
                case["fa4_vs_default"] = {n: _rel(got["fa4"][n], got["default"][n]) for n in ("o", "dq", "dk", "dv")}
            cases.append(case)
    calls = dict(server_backend.calls)
    for b in checked:  # FA4's callbacks ran in every direction given to FA4, and in no other
        for direction, name in zip(server_backend.DIRECTIONS, server_backend.directions(b)):
            if (ran[b][direction] > 0) != (name == "fa4"):
                failures.append(f"rank {rank}: {b}: FA4's {direction} callback ran {ran[b][direction]} times ({ran})")
    for c in contexts.values():
        c.close()
    result = {"rank": rank, "world": world, "cases": cases, "calls": calls, "fa4_calls_by_choice": ran,
              "failures": failures}
    (out / f"check_w{world}_r{rank}.json").write_text(json.dumps(result, indent=1))
    for line in failures:
        print("FAIL", line, flush=True)
    if failures:
        raise AssertionError(f"{len(failures)} check(s) failed")
    print(f"rank {rank} of {world}: {len(cases)} cases agree", flush=True)


def _bench_rank(rank, world, out, context, rounds, backends):
    import cad
    from cad.train.recipe import sample_batch
    device = torch.device("cuda", 0)
    comm = "nccl" if world == 1 else "host"
    lengths = json.loads(pathlib.Path(os.environ["CAD_DATA"]).read_text())
    docs = sample_batch(lengths, context, world, 1)[rank]
    q, k, v, d_o, cu = _inputs(docs, 32, 8, 128, 20 + rank, device)
    backends = tuple(backends)
    contexts = {b: cad.Context(server_backend=b, communicator=comm, timeout_ms=300000) for b in backends}
    plans = {b: contexts[b].plan(cu, device=device) for b in backends}
    times = {b: {"forward_server_ms": [], "backward_server_ms": [], "call_ms": []} for b in backends}
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    for r in range(rounds + 2):  # 2 untimed rounds: FA4 compiles its kernels, the allocator warms
        order = backends[r % len(backends):] + backends[:r % len(backends)]  # each backend first in turn
        for b in order:
            dist.barrier()
            torch.cuda.synchronize()
            before = contexts[b].call_times(device) or {}
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            o = cad.varlen_attn(*leaves, cu, plan=plans[b])
            o.backward(d_o)
            end.record()
            torch.cuda.synchronize()
            after = contexts[b].call_times(device) or {}
            if r >= 2:
                for key in ("forward_server_ms", "backward_server_ms"):
                    times[b][key].append(after.get(key, 0.0) - before.get(key, 0.0))
                times[b]["call_ms"].append(start.elapsed_time(end))
            for t in leaves:
                t.grad = None
    medians = {b: {k: statistics.median(v) for k, v in times[b].items()} for b in backends}
    base = "default" if "default" in medians else backends[0]
    ratios = {b: {k: medians[b][k] / medians[base][k] if medians[base][k] else None for k in medians[base]}
              for b in backends if b != base}
    result = {"rank": rank, "world": world, "context": context, "documents": docs, "rounds": rounds,
              "medians_ms": medians, f"over_{base}": ratios, "times_ms": times,
              "plan_stats": plans[base].stats}
    if "fa4" in ratios:
        result["fa4_over_default"] = ratios["fa4"]
    (out / f"bench_w{world}_r{rank}_{context}.json").write_text(json.dumps(result, indent=1))
    for b in backends:
        print(f"rank {rank} of {world}, {context} tokens: {b}: median ms {medians[b]}"
              + (f"; {b} / {base}: {ratios[b]}" if b in ratios else ""), flush=True)
    for c in contexts.values():
        c.close()


def _worker(rank, world, port, body, args, errors):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    try:
        torch.cuda.set_device(0)
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
        body(rank, world, *args)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 -- reported to the parent, which exits non-zero
        errors.put((rank, traceback.format_exc()))
        raise


def _spawn(world, body, *args, timeout_s=1200):
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, body, args, errors)) for r in range(world)]
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
    for rank, text in failures:
        print(f"--- rank {rank} of {world} failed:\n{text}", file=sys.stderr, flush=True)
    if hung:
        print(f"ranks {hung} of {world} did not finish within {timeout_s} s", file=sys.stderr, flush=True)
    return not failures and not hung and all(p.exitcode == 0 for p in procs)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("what", choices=["check", "bench"])
    p.add_argument("--out", default=os.environ.get("OUT", "server_backend_fa4_out"), help="folder of the JSON files")
    p.add_argument("--worlds", default="1,2", help="world sizes, processes sharing the one GPU (default 1,2)")
    p.add_argument("--context", type=int, default=65536, help="bench: tokens per rank (default 65536)")
    p.add_argument("--rounds", type=int, default=5, help="bench: timed rounds (default 5)")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="server_backend choices, comma-separated (NAME or FORWARD+BACKWARD; default default,fa4)")
    args = p.parse_args()
    backends = args.backends.split(",")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from cad import server_backend
    ok, why = server_backend.available("fa4", "cuda")
    print(f"server_backend fa4: {why}", flush=True)
    if not ok:
        print("FAIL: the fa4 server backend is not available here", flush=True)
        return 1
    passed = True
    for world in (int(w) for w in args.worlds.split(",")):
        if args.what == "check":
            good = _spawn(world, _check_rank, out, backends)
        else:
            good = _spawn(world, _bench_rank, out, args.context, args.rounds, backends)
        print(f"{args.what} at world size {world}: {'passed' if good else 'FAILED'}", flush=True)
        passed &= good
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
