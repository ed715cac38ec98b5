#!/usr/bin/env python3
"""link_curve.py -- a `cad simulate --link-curve` file from a measured slow-link stand-in: bench/nccl/slow_links.py's
summary.json holds, per stand-in and implementation, the all-to-all curve (bytes_per_rank, seconds). The
simulator's curve is one GPU's exchange by the bytes it sends to GPUs of other nodes, so each point's bytes are
those that cross the slow link: bytes_per_rank x (world - 1) / world where every pair is slowed (p2p_off,
p2p_shm_off, channels:K), bytes_per_rank x (world - gpus_per_node) / world for the emulated splits (split:K,
split_host). The seconds are the measured call's.

usage: python3 bench/simulate/link_curve.py SUMMARY.json --standin p2p_off [--impl cad|torch] --out FILE
Exits 2 naming the stand-in or implementation when the summary does not hold it, or when its curve is not
increasing in bytes (the simulator refuses such a curve too).
"""
import argparse
import json
import sys


def curve_file(summary, standin, impl):
    results = summary.get("results", {})
    if standin not in results:
        raise ValueError(f"stand-in '{standin}' is not in the summary (it holds: {', '.join(sorted(results)) or 'none'})")
    if impl not in results[standin]:
        raise ValueError(f"stand-in '{standin}' has no '{impl}' run (it has: {', '.join(sorted(results[standin]))})")
    run = summary.get("run", {})
    world, per_node = int(run.get("gpus", 0)), int(run.get("gpus_per_node", 0))
    if world < 2:
        raise ValueError(f"the summary's run.gpus is {world}; an all-to-all needs at least 2")
    split = standin.startswith("split")
    if split and not 0 < per_node < world:
        raise ValueError(f"stand-in '{standin}' is a split, but run.gpus_per_node is {per_node} of {world} GPUs")
    share = (world - per_node) / world if split else (world - 1) / world
    points = [{"bytes": p["bytes_per_rank"] * share, "seconds": p["seconds"]} for p in results[standin][impl]["curve"]]
    for a, b in zip(points, points[1:]):
        if not b["bytes"] > a["bytes"]:
            raise ValueError(f"stand-in '{standin}' ({impl}): bytes do not increase ({a['bytes']} then {b['bytes']})")
    return {"source": f"measured: bench/nccl/slow_links.py stand-in {standin} ({impl}), {world} GPUs"
                      + (f" in nodes of {per_node}" if split else "") + "; bytes are those crossing the slow link",
            "points": points}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("summary")
    p.add_argument("--standin", required=True)
    p.add_argument("--impl", default="cad", choices=["cad", "torch"])
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    try:
        with open(a.summary) as f:
            out = curve_file(json.load(f), a.standin, a.impl)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"link_curve.py: {a.summary}: {e}", file=sys.stderr)
        return 2
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"{a.out}: {len(out['points'])} points ({out['source']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
