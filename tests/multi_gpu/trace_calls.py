#!/usr/bin/env python3
"""trace_calls.py -- where one rank's step goes around CAD's calls, from the trainer's --profile-trace timeline
(train_<config>_<context>_trace_rank<R>.json[.gz], written by examples/train_llama.py --profile-step N
--profile-trace; tests/multi_gpu/run.sh: PROFILE_STEP=N TRAINER_ARGS=--profile-trace).

    python3 tests/multi_gpu/trace_calls.py TRACE [TRACE ...] [--calls]

Per trace, on the compute stream (the stream with the most kernel time: the trainer's, where CAD's calls run):
- the step's span, the stream's busy time and its gaps (time it waited: for an exchange, another stream, the host);
- the busy time by kernel family (the trainer's: attention, cad data path -- here with device-to-device copies
  and memsets --, nccl, gemm, other);
- per CAD call (its attention kernels with the CAD copies and gaps between and around them): the attention time
  and the time the call adds beyond it: the gap before its first attention kernel since the last kernel that is
  not CAD's, the gap after its last one until the next such kernel, and CAD's own copy kernels inside. Summed
  over the calls, "beyond attention" is what the rank paid for CAD beside its attention compute; on the rank that
  sets the step it is what CAD costs over a perfectly balanced local step (bench/results/trainer_h200x2_2026-11-28_{b8371a0_2,3c8dbea}).

Timelines of two ranks of one step line up call by call: a call whose "before" is long on one rank and short on
the other is one where the first waited for the second (its compute ran longer) or for the bytes it received.
"""
import argparse
import gzip
import json
import pathlib
import sys

GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")
sys.path.append(str(pathlib.Path(__file__).resolve().parents[2] / "host_adapter" / "python"))  # if not installed
# The trainer's kernel families (its --profile-step summary's): one list of kernel names for both tools.
from cad.train.profiling import kernel_family  # noqa: E402


class TraceError(Exception):
    pass


def family(name):
    """The trainer's family of a GPU event, with device-to-device copies and memsets counted as CAD's data path (a
    call's own rows and its scratch: what a CAD call adds beside its attention on the compute stream)."""
    if name.startswith(("Memcpy DtoD", "Memset")):
        return "cad data path"
    return kernel_family(name)


def load(path):
    """The GPU events of a Chrome trace (torch.profiler's export), as (start us, duration us, name, stream)."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise TraceError(f"{path}: no such file")
    try:
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt") as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        raise TraceError(f"{path}: not a JSON trace ({e})") from e
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise TraceError(f"{path}: no 'traceEvents' list (expected torch.profiler's export_chrome_trace output)")
    gpu = []
    for e in events:
        if isinstance(e, dict) and e.get("cat") in GPU_EVENTS and e.get("ph") == "X":
            try:
                gpu.append((float(e["ts"]), float(e["dur"]), str(e["name"]), e.get("args", {}).get("stream")))
            except (KeyError, TypeError, ValueError) as err:
                raise TraceError(f"{path}: a GPU event without ts/dur/name: {e!r:.200}") from err
    if not gpu:
        raise TraceError(f"{path}: no GPU kernels (was the step profiled with CUDA activities on?)")
    return gpu


def compute_stream(gpu):
    busy = {}
    for _, dur, _, stream in gpu:
        busy[stream] = busy.get(stream, 0.0) + dur
    return max(busy, key=busy.get)


def analyse(gpu):
    """The numbers this tool prints for one trace (all ms)."""
    stream = compute_stream(gpu)
    ops = sorted((e for e in gpu if e[3] == stream), key=lambda e: e[0])
    ends = []  # ends[i]: when the stream was done with ops[: i + 1]
    idle = 0.0
    for i, (ts, dur, _, _) in enumerate(ops):
        if i > 0:
            idle += max(0.0, ts - ends[-1])
        ends.append(max(ts + dur, ends[-1] if ends else ts + dur))
    kinds = [family(name) for _, _, name, _ in ops]
    families = {}
    for (_, dur, _, _), kind in zip(ops, kinds):
        families[kind] = families.get(kind, 0.0) + dur / 1e3
    calls = []
    i = 0
    while i < len(ops):
        if kinds[i] != "attention":
            i += 1
            continue
        # The call: its attention kernels and the CAD copies before, between and after them.
        first = last = i
        stop = i
        while stop + 1 < len(ops) and kinds[stop + 1] in ("attention", "cad data path"):
            stop += 1
            if kinds[stop] == "attention":
                last = stop
        start = first
        while start > 0 and kinds[start - 1] == "cad data path":
            start -= 1
        # From the end of the kernel before it (not CAD's) to the start of the one after it.
        begin = ends[start - 1] if start > 0 else ops[start][0]
        finish = ops[stop + 1][0] if stop + 1 < len(ops) else ends[stop]
        attention = sum(ops[k][1] for k in range(first, last + 1) if kinds[k] == "attention") / 1e3
        before = (ops[first][0] - begin) / 1e3
        after = (finish - ends[last]) / 1e3
        beyond = (finish - begin) / 1e3 - attention
        calls.append({"kind": "backward" if any("bwd" in ops[k][2] for k in range(first, last + 1)) else "forward",
                      "attention_ms": attention, "before_ms": before, "after_ms": after,
                      "inside_ms": max(0.0, beyond - before - after), "beyond_ms": beyond,
                      "copies_ms": sum(ops[k][1] for k in range(start, stop + 1) if kinds[k] != "attention") / 1e3})
        i = stop + 1
    return {"stream": stream, "span_ms": (ends[-1] - ops[0][0]) / 1e3, "busy_ms": sum(e[1] for e in ops) / 1e3,
            "gaps_ms": idle / 1e3, "families_ms": families, "calls": calls}


def report(path, a, per_call):
    lines = [f"## {path}", "",
             f"compute stream {a['stream']}: span {a['span_ms']:.1f} ms, busy {a['busy_ms']:.1f} ms, gaps "
             f"{a['gaps_ms']:.1f} ms; busy by family: " +
             ", ".join(f"{k} {v:.1f}" for k, v in sorted(a["families_ms"].items(), key=lambda kv: -kv[1])), ""]
    calls = a["calls"]
    if per_call:
        lines += ["| call | kind | attention ms | before ms | after ms | copies ms | between its kernels ms |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for n, c in enumerate(calls):
            lines.append(f"| {n} | {c['kind']} | {c['attention_ms']:.2f} | {c['before_ms']:.2f} | {c['after_ms']:.2f} "
                         f"| {c['copies_ms']:.2f} | {c['inside_ms']:.2f} |")
        lines.append("")
    lines += ["| CAD calls | kind | attention ms | before ms | after ms | of which copies ms | beyond attention ms |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for kind in ("forward", "backward", "all"):
        chosen = [c for c in calls if kind == "all" or c["kind"] == kind]
        def total(key):
            return sum(c[key] for c in chosen)
        lines.append(f"| {len(chosen)} | {kind} | {total('attention_ms'):.1f} | {total('before_ms'):.1f} | "
                     f"{total('after_ms'):.1f} | {total('copies_ms'):.1f} | {total('beyond_ms'):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", help="trainer timelines (train_<config>_<context>_trace_rank<R>.json[.gz])")
    p.add_argument("--calls", action="store_true", help="also one row per CAD call")
    args = p.parse_args(argv)
    for path in args.traces:
        try:
            print(report(path, analyse(load(path)), args.calls))
        except TraceError as e:
            print(f"trace_calls.py: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
