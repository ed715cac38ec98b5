#!/usr/bin/env python3
"""trace_overlap.py -- what a profiled training step's timeline says about overlap (the trainer's --profile-trace).

    python3 bench/cad/trace_overlap.py OUT/train_prefix_aware_pingpong_65536_trace_rank0.json [...]

Per trace (one rank's profiled step, Chrome trace format as torch.profiler writes it), from its GPU kernels and
CUDA runtime calls:
- per CUDA stream: kernels, busy ms (union of its kernels' intervals), the share of that time in NCCL kernels;
- for every pair of busy streams: ms during which both ran kernels (the overlap ping-pong is meant to create);
- the GPU's span (first kernel start to last kernel end) and its idle ms (no kernel on any stream);
- host calls that wait for the GPU (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, blocking
  cudaMemcpy): count and ms -- each one stops the host from enqueueing ahead, so the two nano-batches' work can
  no longer interleave;
- kernel launches made by a thread that launches only NCCL kernels (a non-blocking NCCL communicator launches
  from a job thread of its own while the caller waits for it, plugins/nccl_communicator's wait_host_side): their
  count and how long after the last CUDA call of any other thread each came (median, p90, sum): the host time
  every exchange costs before anything after it can be enqueued.
Prints a markdown table per trace; --json writes the numbers.
"""
import argparse
import bisect
import json
import pathlib

WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaStreamWaitEvent")


def union_ms(intervals):
    """Total length (ms) of the union of [start, end) intervals given in us."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e3


def intersect(a, b):
    """Intervals where both interval sets are busy (each a list of disjoint sorted [s, e) after merging)."""
    def merged(xs):
        out = []
        for s, e in sorted(xs):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out
    a, b = merged(a), merged(b)
    i = j = 0
    out = []
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def analyse(path):
    events = json.loads(pathlib.Path(path).read_text())
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    streams, nccl, waits, callers = {}, {}, {}, {}
    # The host ops (per thread, as intervals) that enclose each waiting runtime call: who waited.
    cpu_ops = {}
    for ev in events:
        if ev.get("ph") == "X" and ev.get("cat") == "cpu_op" and "dur" in ev:
            cpu_ops.setdefault(ev.get("tid"), []).append((float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]),
                                                          ev.get("name", "")))
    for ev in events:
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        cat, name = ev.get("cat", ""), ev.get("name", "")
        span = (float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]))
        if cat == "kernel":
            stream = ev.get("args", {}).get("stream", ev.get("tid"))
            streams.setdefault(stream, []).append(span)
            if "nccl" in name.lower():
                nccl.setdefault(stream, []).append(span)
        elif cat == "cuda_runtime" and any(name.startswith(w) for w in WAITS):
            if name.startswith("cudaMemcpy") and "Async" in name:
                continue
            key = name.split("(")[0]
            count, ms = waits.get(key, (0, 0.0))
            waits[key] = (count + 1, ms + float(ev["dur"]) / 1e3)
            if key != "cudaStreamWaitEvent":  # a GPU-side wait, not a host one
                enclosing = [op for op in cpu_ops.get(ev.get("tid"), []) if op[0] <= span[0] and span[1] <= op[1]]
                # the outermost op names the Python-level call (e.g. aten::item), the innermost the kernel-level one
                who = " > ".join(op[2] for op in sorted(enclosing, key=lambda op: op[0])[:2]) or "(no enclosing op)"
                c, m = callers.get((key, who), (0, 0.0))
                callers[(key, who)] = (c + 1, m + float(ev["dur"]) / 1e3)
    if not streams:
        return {"trace": str(path), "error": "no GPU kernels in the trace"}
    async_launch = nccl_job_thread_delays(events)
    every = [x for spans in streams.values() for x in spans]
    start, end = min(s for s, _ in every), max(e for _, e in every)
    busy = {k: union_ms(v) for k, v in streams.items()}
    pairs = []
    keys = sorted(k for k in streams if busy[k] >= 1.0)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            both = union_ms(intersect(streams[a], streams[b]))
            if both > 0:
                pairs.append({"streams": [a, b], "overlap_ms": both})
    return {"trace": str(path), "span_ms": (end - start) / 1e3, "gpu_busy_ms": union_ms(every),
            "gpu_idle_ms": (end - start) / 1e3 - union_ms(every),
            "streams": {str(k): {"kernels": len(v), "busy_ms": busy[k], "nccl_ms": union_ms(nccl.get(k, []))}
                        for k, v in sorted(streams.items(), key=lambda kv: -busy[kv[0]])},
            "overlaps": sorted(pairs, key=lambda p: -p["overlap_ms"]),
            "host_waits": {k: {"calls": c, "ms": ms} for k, (c, ms) in sorted(waits.items())},
            "nccl_job_thread_launches": async_launch,
            "host_wait_callers": [{"call": k, "inside": who, "calls": c, "ms": ms}
                                  for (k, who), (c, ms) in sorted(callers.items(), key=lambda kv: -kv[1][1])]}


def nccl_job_thread_delays(events):
    """Launches by threads whose every launched kernel is an NCCL kernel (NCCL's job threads), and per launch the
    ms since the last CUDA call of any other thread (cudaEventQuery excluded: watchdogs poll it)."""
    runtime = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    kernel_of = {e.get("args", {}).get("correlation"): e.get("name", "") for e in events if e.get("cat") == "kernel"}
    launches = {}
    for e in runtime:
        if "Launch" in e["name"]:
            launches.setdefault(e.get("tid"), []).append(e)
    job_threads = {tid for tid, ls in launches.items()
                   if all("nccl" in kernel_of.get(l.get("args", {}).get("correlation"), "nccl").lower() for l in ls)}
    if not job_threads:
        return {"launches": 0}
    others = sorted(float(e["ts"]) + float(e.get("dur", 0)) for e in runtime
                    if e.get("tid") not in job_threads and e["name"] != "cudaEventQuery")
    delays = []
    for tid in job_threads:
        for l in launches[tid]:
            i = bisect.bisect_left(others, float(l["ts"])) - 1
            if i >= 0:
                delays.append((float(l["ts"]) - others[i]) / 1e3)
    delays.sort()
    if not delays:
        return {"launches": 0}
    return {"launches": len(delays), "median_ms": delays[len(delays) // 2], "p90_ms": delays[int(0.9 * len(delays))],
            "sum_ms": sum(delays)}


def markdown(r):
    if "error" in r:
        return f"{r['trace']}: {r['error']}\n"
    lines = [f"### {pathlib.Path(r['trace']).name}", "",
             f"GPU span {r['span_ms']:.1f} ms, busy {r['gpu_busy_ms']:.1f} ms, idle {r['gpu_idle_ms']:.1f} ms", "",
             "| stream | kernels | busy ms | of it NCCL ms |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {v['kernels']} | {v['busy_ms']:.1f} | {v['nccl_ms']:.1f} |" for k, v in r["streams"].items()]
    lines += ["", "| streams | both busy ms |", "|---|---:|"]
    lines += [f"| {p['streams'][0]} + {p['streams'][1]} | {p['overlap_ms']:.1f} |" for p in r["overlaps"][:10]]
    lines += ["", "| host call that waits | calls | ms |", "|---|---:|---:|"]
    lines += [f"| {k} | {v['calls']} | {v['ms']:.1f} |" for k, v in r["host_waits"].items()] or ["| (none) | 0 | 0 |"]
    a = r["nccl_job_thread_launches"]
    if a.get("launches"):
        lines += ["", f"NCCL kernels launched by NCCL's own job threads: {a['launches']}, each {a['median_ms']:.2f} ms "
                      f"(median; p90 {a['p90_ms']:.2f}) after the last CUDA call of another thread, {a['sum_ms']:.0f} ms "
                      f"in all"]
    lines += ["", "| host wait | inside (outermost ops) | calls | ms |", "|---|---|---:|---:|"]
    lines += [f"| {c['call']} | {c['inside']} | {c['calls']} | {c['ms']:.1f} |" for c in r["host_wait_callers"][:15]]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+", help="Chrome trace JSON files (the trainer's *_trace_rank<R>.json)")
    p.add_argument("--json", help="write every trace's numbers here")
    args = p.parse_args(argv)
    results = [analyse(t) for t in args.traces]
    for r in results:
        print(markdown(r))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
