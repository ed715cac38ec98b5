#!/usr/bin/env python3
"""split_comm.py -- CAD's own exchanges through the "split" communicator on one host (not run by CI).

4 GPUs as 2 "nodes" of 2 (--gpus, --gpus-per-node): the pairs inside a node over a full NCCL communicator
("fast"), the pairs across nodes over a second NCCL communicator of the same ranks limited to --inter-ctas CTAs
("slow", ncclConfig_t.maxCTAs is per communicator), both borrowed by a "split" instance that CAD uses as its
communicator. Three stacks, each in its own processes (one per GPU, a gloo group for the package's bootstrap):
  nccl        CAD over one plain NCCL communicator (the baseline)
  split_fast  CAD over split, "slow" with no CTA limit (what the split itself costs)
  split_slow  CAD over split, "slow" limited to --inter-ctas CTAs (only the cross-node pairs slowed)
Per stack and rank: bf16 CAD against fp32 sdpa per document (O, dQ, dK, dV; max error relative to max |ref| below
2e-2) on small batches, then --steps timed forward+backward steps on a larger one (--tokens per GPU; CUDA events).
Writes $OUT (or --out) /<stack>.rank<R>.json and summary.json (per stack the slowest rank's median step ms).
Exits 1 if any rank failed or any error bound was missed; timings are reported, never judged.
NCCL_NVLS_ENABLE=0 is set for every process. Needs a CUDA build: CAD_HOST_LIBRARY and CAD_PLUGIN_PATH pointing
at build/lib/libcad_host.so and build/lib/cad/plugins (with cad_split.so, cad_nccl.so, cad_cuda.so).

  OUT=/tmp/out python3 tests/multi_gpu/split_comm.py --gpus 4 --inter-ctas 1
"""
import argparse
import itertools
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "host_adapter", "python"))

LENGTHS = [[700, 33, 1, 290], [64, 128, 65, 1000], [1500, 3], [400, 400, 200]]
HQ, HKV, D = 32, 8, 128


def stack(name, gpus_per_node, inter_ctas, device, timeout_ms=60000):
    """The CAD stack of one rank for `name` (nccl, split_fast, split_slow)."""
    nccl = lambda ctas: {"bootstrap": "host", "device": device, "timeout_ms": timeout_ms, "max_ctas": ctas}  # noqa: E731
    instances = []
    if name == "nccl":
        instances.append({"name": "comm", "plugin": "nccl", "config": nccl(0)})
    else:
        instances.append({"name": "fast", "plugin": "nccl", "config": nccl(0)})
        instances.append({"name": "slow", "plugin": "nccl", "config": nccl(inter_ctas if name == "split_slow" else 0)})
        instances.append({"name": "comm", "plugin": "split",
                          "config": {"ranks_per_node": gpus_per_node, "intra": "fast", "inter": "slow",
                                     "timeout_ms": timeout_ms}})
    instances += [
        {"name": "plan_comm", "plugin": "host", "config": {"timeout_ms": timeout_ms}},
        {"name": "balancer", "plugin": "prefix_aware", "config": {"ranks_per_node": gpus_per_node}},
        {"name": "server", "plugin": "cuda", "config": {}},
        {"name": "cad", "plugin": "cad", "config": {"communicator": "comm", "balancer": "balancer",
                                                    "server_backend": "server", "keep_forward_tensors": True,
                                                    "plan_communicator": "plan_comm"}},
    ]
    return {"log_level": "warn", "instances": instances, "attention": "cad"}


def _fwd_bwd(fn, q, k, v, d_o):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = fn(*leaves)
    o.backward(d_o)
    return [o.detach().float()] + [t.grad.float() for t in leaves]


def _rank(rank, world, name, args):
    import torch
    import cad
    from reference import random_batch, sdpa_varlen
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    cad.init(config=stack(name, args.gpus_per_node, args.inter_ctas, rank))
    record = {"stack": name, "rank": rank, "world": world, "errors": {}, "ok": True}
    # Exact enough: bf16 CAD against fp32 sdpa per document.
    q, k, v, cu = random_batch(LENGTHS[rank % len(LENGTHS)], HQ, HKV, D, seed=rank)
    qb, kb, vb = (t.to(dev, torch.bfloat16) for t in (q, k, v))
    d_o = torch.randn(q.shape, generator=torch.Generator().manual_seed(7 + rank)).to(dev, torch.bfloat16)
    plan = cad.plan(cu.to(dev))
    got = _fwd_bwd(lambda a, b, c: cad.varlen_attn(a, b, c, cu.to(dev), plan=plan, causal=True), qb, kb, vb, d_o)
    want = _fwd_bwd(lambda a, b, c: sdpa_varlen(a, b, c, cu, True), qb.float().cpu(), kb.float().cpu(),
                    vb.float().cpu(), d_o.float().cpu())
    for tensor, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        err = ((a.cpu() - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()
        record["errors"][tensor] = err
        record["ok"] = record["ok"] and err < 2e-2
    # Timed: documents of 1/8 .. 1/2 of --tokens, cut to fill it.
    g = torch.Generator().manual_seed(100 + rank)
    lengths, left = [], args.tokens
    while left > 0:
        n = min(left, int(torch.randint(args.tokens // 8, args.tokens // 2 + 1, (1,), generator=g)))
        lengths.append(n)
        left -= n
    cu_big = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device=dev)
    big = [torch.randn(args.tokens, h, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
           for h in (HQ, HKV, HKV)]
    grad = torch.randn(args.tokens, HQ, D, device=dev, dtype=torch.bfloat16)
    plan_big = cad.plan(cu_big)
    times = []
    for step in range(args.steps + 1):  # step 0 warms up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        o = cad.varlen_attn(*big, cu_big, plan=plan_big, causal=True)
        o.backward(grad)
        end.record()
        torch.cuda.synchronize()
        if step > 0:
            times.append(start.elapsed_time(end))
    record["step_ms"] = times
    record["tokens_per_gpu"] = args.tokens
    with open(os.path.join(args.out, f"{name}.rank{rank}.json"), "w") as f:
        json.dump(record, f, indent=1)
    if not record["ok"]:
        raise AssertionError(f"{name} rank {rank}: errors {record['errors']} (bound 2e-2)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--gpus-per-node", type=int, default=0, help="default: half the GPUs")
    p.add_argument("--inter-ctas", type=int, default=1, help="max_ctas of the cross-node NCCL communicator (1-64)")
    p.add_argument("--tokens", type=int, default=65536, help="tokens per GPU of the timed batch")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--stacks", default="nccl,split_fast,split_slow")
    p.add_argument("--out", default=os.environ.get("OUT", ""))
    args = p.parse_args()
    args.gpus_per_node = args.gpus_per_node or args.gpus // 2
    if not args.out:
        p.error("--out (or $OUT) is required")
    if args.gpus < 2 or args.gpus_per_node < 1 or args.gpus % args.gpus_per_node != 0:
        p.error(f"--gpus-per-node {args.gpus_per_node} must divide --gpus {args.gpus} (>= 2)")
    if not 1 <= args.inter_ctas <= 64:
        p.error("--inter-ctas must be in 1..64")
    stacks = [s for s in args.stacks.split(",") if s]
    for s in stacks:
        if s not in ("nccl", "split_fast", "split_slow"):
            p.error(f"--stacks: unknown stack '{s}' (nccl, split_fast, split_slow)")
    os.makedirs(args.out, exist_ok=True)
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    import harness
    summary, failed = {"gpus": args.gpus, "gpus_per_node": args.gpus_per_node, "inter_ctas": args.inter_ctas,
                       "tokens_per_gpu": args.tokens, "stacks": {}}, []
    for name in stacks:
        try:
            harness.run(args.gpus, _rank, name, args, timeout_s=600)
        except AssertionError as e:
            failed.append(name)
            print(f"FAIL {name}: {e}", file=sys.stderr)
        records = []
        for r in range(args.gpus):
            path = os.path.join(args.out, f"{name}.rank{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    records.append(json.load(f))
        if len(records) != args.gpus:
            if name not in failed:
                failed.append(name)
            print(f"FAIL {name}: {len(records)} of {args.gpus} ranks wrote a record", file=sys.stderr)
            continue
        summary["stacks"][name] = {
            "slowest_rank_median_step_ms": max(statistics.median(r["step_ms"]) for r in records),
            "max_error": max(max(r["errors"].values()) for r in records)}
        print(f"{name}: {summary['stacks'][name]}")
    summary["failed"] = failed
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
