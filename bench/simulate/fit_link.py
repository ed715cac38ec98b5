#!/usr/bin/env python3
"""fit_link.py -- `cad simulate`'s network term (bandwidth, latency, overlap) fitted on measured slow-link runs,
and the step times of the runs held out predicted with it.

Two kinds of input:

  trainer records (default: the 2-H200 runs of 2026-11-28 through host memory, NCCL_P2P_DISABLE=1; or --host-runs,
  e.g. the $OUT/<link>/ folders that tests/multi_gpu/overlap_auto.sh writes: it trains local, prefix_aware and
  prefix_aware_hg4 too): train_<config>_<context>.json files.
    link:    per step, the slowest rank's CAD collective time (exchange_comm_ms) against the bytes its exchanges
             move: passes (forward, recomputed forward, backward: 3 per layer, each moving the forward's bytes, as
             the simulator prices them) x layers x the largest rank's forward bytes per layer (every micro-batch's
             plan added up). With 2 ranks that is max(sent, received) of each rank; with more it is a floor.
             Least squares of  seconds = exchanges x latency + bytes / bandwidth  (exchanges = 3 x layers x
             micro-batches: the simulator charges the latency once per pass), over the unsplit CAD configurations'
             steps 1.. of the fitted runs.
    base:    the stand-in slows FSDP2's own collectives too (the same in every configuration): the measured local
             step minus `cad simulate --trainer`'s local step, mean over the fitted runs, is added as a fixed
             per-step term (named "link_fixed_ms" below).
    overlap: the share F of the exchange that head groups hide, net: (unsplit step - head-groups step) / the
             model's exchange time of the unsplit step, mean over the fitted runs (--groups-config names the
             configuration; default prefix_aware_hg4).
  Leave one run out: each run is predicted from a fit on the others (link, base and overlap), and its step time
  (local, unsplit CAD, head groups priced as `--pingpong on --overlap F` with the ping-pong compute factor 1) and
  its exchange time are compared with what it measured. The last fit uses every run.

  --curve SUMMARY.json --standin TAG [--impl cad]: a bench/nccl/slow_links.py summary (or host_staged_one_gpu.sh's,
  which holds one per process count: --key np4): latency and bandwidth least squares on the curve (seconds =
  latency + crossing bytes / bandwidth, relative errors), with each point's error, and its error when the fit
  leaves it out.

Prints markdown tables and the cad simulate flags of the final fit; --json FILE writes everything.

  python3 bench/simulate/fit_link.py [--cad build/bin/cad] [--dist ../shared/data/doclen_pretrain.json] [--json F]
  python3 bench/simulate/fit_link.py --curve OUT/summary.json --key np4 --standin host_staged
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
HOST_RUNS = ["trainer_h200x2_2026-11-28_6fc2a34_4/a/round1", "trainer_h200x2_2026-11-28_6fc2a34_4/a/round2",
             "trainer_h200x2_2026-11-28_6fc2a34_5/host"]
CALIBRATION = REPO / "docs" / "simulate" / "trainer_h200.json"
PASSES = 3  # forward, recomputed forward (full checkpointing), backward: each moves the forward's bytes


class FitError(Exception):
    pass


# ---- the records --------------------------------------------------------------------------------------------
def load_run(path):
    """{config: {"summary", "steps" (1..)}} of one record folder."""
    out = {}
    for f in sorted(pathlib.Path(path).glob("train_*.json")):
        d = json.loads(f.read_text())
        name = re.match(r"train_(.*)_\d+\.json", f.name).group(1)
        out[name] = {"summary": d["summary"], "steps": d["steps"][1:] or d["steps"]}
    if not out:
        raise FitError(f"{path}: no train_*.json")
    return out


def seeds(cfg):
    mb = cfg["summary"]["micro_batches"]
    return [1 + 1000 * s["step"] + m for s in cfg["steps"] for m in range(mb)]


def measured_step(cfg):
    return sum(max(s["step_s"]) for s in cfg["steps"]) / len(cfg["steps"])


def link_points(cfg):
    """Per step: (collectives, bytes moved by the busiest rank, its collective seconds)."""
    s = cfg["summary"]
    collectives = PASSES * s["layers"] * s["micro_batches"]
    pts = []
    for st in cfg["steps"]:
        if not st.get("forward_bytes_sent_by_rank") or not st.get("exchange_comm_ms"):
            continue
        moved = PASSES * s["layers"] * max(st["forward_bytes_sent_by_rank"])
        pts.append((collectives, moved, max(st["exchange_comm_ms"]) * 1e-3))
    return pts


def unsplit_cad(run):
    return [c for n, c in run.items() if c["summary"]["attention"] == "cad" and c["summary"].get("cad_head_groups", 1) == 1
            and not c["summary"].get("ping_pong") and not c["summary"].get("balanced_batches")]


def fit_latency_bandwidth(points):
    """Least squares of seconds = n x latency + bytes / bandwidth. A negative latency is fixed at 0 (and the slope
    refitted through the origin); returns (latency_s, bandwidth_Bps)."""
    if len(points) < 2:
        raise FitError(f"{len(points)} exchange points: need at least 2")
    sxx = sum(n * n for n, _, _ in points)
    sxb = sum(n * b for n, b, _ in points)
    sbb = sum(b * b for _, b, _ in points)
    sxy = sum(n * y for n, _, y in points)
    sby = sum(b * y for _, b, y in points)
    det = sxx * sbb - sxb * sxb
    latency, per_byte = None, None
    if abs(det) > 1e-30 * max(sxx * sbb, 1e-300):
        latency = (sbb * sxy - sxb * sby) / det
        per_byte = (sxx * sby - sxb * sxy) / det
    if latency is None or latency < 0 or per_byte <= 0:
        latency, per_byte = 0.0, sby / sbb
    if per_byte <= 0:
        raise FitError("the fitted bandwidth is not positive: the collective time does not grow with the bytes")
    return latency, 1.0 / per_byte


# ---- the model ----------------------------------------------------------------------------------------------
def simulate(args, cfg, calibration, link, overlap=None):
    s = cfg["summary"]
    balancer = "colocated" if s["attention"] in ("local", "torch_varlen") else s["balancer"]
    latency, bandwidth = link
    cmd = [args.cad, "simulate", "--model", "llama-8b", "--layers", str(s["layers"]), "--gpus", str(s["ranks"]),
           # Every GPU its own "node": each byte CAD moves crosses the fitted link.
           "--gpus-per-node", "1", "--dist", args.dist, "--context", str(s["context"]),
           "--microbatches", str(s["micro_batches"]), "--batch-seeds", ",".join(map(str, seeds(cfg))),
           "--balancers", balancer, "--trainer", str(calibration), "--checkpointing",
           "full" if s["checkpointing"] == "full" else "none", "--link-gbps", f"{bandwidth * 8 / 1e9:.6g}",
           "--link-latency-us", f"{latency * 1e6:.6g}", "--link-efficiency", "1", "--json", "--quiet"]
    if overlap is not None:
        cmd += ["--pingpong", "on", "--overlap", f"{overlap:.6g}"]
    else:
        cmd += ["--pingpong", "off"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise FitError("cad simulate failed: %s\n%s" % (" ".join(cmd), done.stderr))
    b = json.loads(done.stdout)["balancers"][0]
    mode = b["on" if overlap is not None else "off"]
    # The ranks' parts are per micro-batch: the step's exchange is the slowest rank's times the micro-batches.
    return {"step_s": mode["mean_step_seconds"], "exchange_s": s["micro_batches"] * mode["slowest_rank"]["comm_s"],
            "cmd": " ".join(cmd[1:])}


def calibration_with(base, fixed_ms, tmp, name):
    cal = json.loads(base.read_text())
    # The calibration takes no negative fixed term: a link that costs the local step less than the model says
    # (NVLink, where the model is a little high) is applied as 0.
    cal["step_fixed_ms"] = max(0.0, cal["step_fixed_ms"] + fixed_ms)
    cal["pingpong_compute_factor"] = 1.0  # head groups: the compute is not slowed by a split (their cost is in F)
    cal["fitted_on"] = cal["fitted_on"] + [f"link_fixed_ms {fixed_ms:.1f} from fit_link.py"]
    path = pathlib.Path(tmp) / name
    path.write_text(json.dumps(cal))
    return path


def fit_runs(args, runs, tmp):
    """Latency, bandwidth, the link's fixed per-step cost and the overlap from `runs` ({name: run})."""
    points = [p for run in runs.values() for c in unsplit_cad(run) for p in link_points(c)]
    link = fit_latency_bandwidth(points)
    zero = calibration_with(CALIBRATION, 0.0, tmp, "zero.json")
    extra = [measured_step(run["local"]) - simulate(args, run["local"], zero, link)["step_s"]
             for run in runs.values() if "local" in run]
    fixed_ms = 1e3 * sum(extra) / len(extra) if extra else 0.0
    cal = calibration_with(CALIBRATION, fixed_ms, tmp, "fit.json")
    shares = []
    for run in runs.values():
        if args.groups_config in run and args.unsplit_config in run:
            sim = simulate(args, run[args.unsplit_config], cal, link)
            saved = measured_step(run[args.unsplit_config]) - measured_step(run[args.groups_config])
            shares.append(saved / sim["exchange_s"])
    overlap = max(0.0, sum(shares) / len(shares)) if shares else None
    return {"latency_us": link[0] * 1e6, "bandwidth_GBps": link[1] / 1e9, "link_fixed_ms": fixed_ms,
            "overlap": overlap, "points": len(points), "link": link, "calibration": cal}


def predict_run(args, run, fit):
    rows = []
    for name in ("local", args.unsplit_config, args.groups_config):
        if name not in run:
            continue
        cfg = run[name]
        overlap = fit["overlap"] if name == args.groups_config else None
        if name == args.groups_config and overlap is None:
            continue
        sim = simulate(args, cfg, fit["calibration"], fit["link"], overlap)
        row = {"config": name, "measured_step_ms": 1e3 * measured_step(cfg), "predicted_step_ms": 1e3 * sim["step_s"]}
        row["step_error"] = row["predicted_step_ms"] / row["measured_step_ms"] - 1
        if name == args.unsplit_config:
            pts = link_points(cfg)
            lat, bw = fit["link"]
            row["measured_exchange_ms"] = 1e3 * sum(y for _, _, y in pts) / len(pts)
            row["predicted_exchange_ms"] = 1e3 * sum(n * lat + b / bw for n, b, _ in pts) / len(pts)
            row["exchange_error"] = row["predicted_exchange_ms"] / row["measured_exchange_ms"] - 1
            row["simulated_exchange_ms"] = 1e3 * sim["exchange_s"]
        rows.append(row)
    return rows


def records_mode(args):
    runs = {r: load_run(RESULTS / r if not pathlib.Path(r).is_absolute() else r) for r in args.host_runs}
    report = {"runs": list(runs), "held_out": {}, "final": None}
    with tempfile.TemporaryDirectory() as tmp:
        if len(runs) > 1:
            for name in runs:
                fit = fit_runs(args, {k: v for k, v in runs.items() if k != name}, tmp)
                report["held_out"][name] = {"fit": {k: v for k, v in fit.items() if k not in ("link", "calibration")},
                                            "rows": predict_run(args, runs[name], fit)}
        final = fit_runs(args, runs, tmp)
        report["final"] = {k: v for k, v in final.items() if k not in ("link", "calibration")}
        report["final"]["rows"] = {name: predict_run(args, run, final) for name, run in runs.items()}
        lat, bw = final["link"]
        report["final"]["simulate_flags"] = (f"--link-gbps {bw * 8 / 1e9:.3g} --link-latency-us {lat * 1e6:.0f} "
                                             f"--link-efficiency 1 --overlap {final['overlap'] or 0:.2f}")
    return report


def print_records(report):
    print("| held-out run | fitted on | latency us per exchange | GB/s | link fixed ms | overlap | config | "
          "measured step ms | predicted | error | exchange ms measured / predicted | error |")
    print("|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for name, h in report["held_out"].items():
        f = h["fit"]
        others = ", ".join(r.split("2026-11-28_")[-1] for r in report["runs"] if r != name)
        for row in h["rows"]:
            ex = (f"{row['measured_exchange_ms']:.0f} / {row['predicted_exchange_ms']:.0f} | {100 * row['exchange_error']:+.1f}%"
                  if "exchange_error" in row else "- | -")
            print(f"| {name.split('2026-11-28_')[-1]} | {others} | {f['latency_us']:.0f} | {f['bandwidth_GBps']:.1f} | "
                  f"{f['link_fixed_ms']:.0f} | {f['overlap'] if f['overlap'] is None else round(f['overlap'], 3)} | "
                  f"{row['config']} | {row['measured_step_ms']:.0f} | {row['predicted_step_ms']:.0f} | "
                  f"{100 * row['step_error']:+.1f}% | {ex} |")
    f = report["final"]
    print(f"\nfit on all {len(report['runs'])} runs ({f['points']} exchange points): latency {f['latency_us']:.0f} us per "
          f"exchange, {f['bandwidth_GBps']:.2f} GB/s, link fixed {f['link_fixed_ms']:.0f} ms per step, overlap "
          f"{f['overlap']}\ncad simulate {f['simulate_flags']}")


# ---- a measured curve ---------------------------------------------------------------------------------------
def fit_curve(pts):
    """Relative least squares of seconds_i ~ L + x_i / B (each point weighted by 1 / seconds_i^2); a negative
    latency is fixed at 0. Returns (L seconds, seconds per byte)."""
    w = [1 / y ** 2 for _, y in pts]
    s1 = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, pts))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, pts))
    sy = sum(wi * y for wi, (_, y) in zip(w, pts))
    sxy = sum(wi * x * y for wi, (x, y) in zip(w, pts))
    det = s1 * sxx - sx * sx
    if len(pts) < 2 or det <= 0:
        raise FitError("a curve of fewer than 2 distinct sizes")
    lat = (sxx * sy - sx * sxy) / det
    per_byte = (s1 * sxy - sx * sy) / det
    if lat < 0:
        lat, per_byte = 0.0, sxy / sxx
    if per_byte <= 0:
        raise FitError("the fitted bandwidth is not positive: the curve's time does not grow with the bytes")
    return lat, per_byte


def curve_mode(args):
    data = json.loads(pathlib.Path(args.curve).read_text())
    if args.key:
        data = data[args.key]
    run, results = data["run"], data["results"]
    if args.standin not in results or args.impl not in results[args.standin]:
        raise FitError(f"{args.curve}: no {args.standin} / {args.impl} in the summary")
    world, per_node = run["gpus"], run["gpus_per_node"]
    share = (world - per_node) / world if args.standin.startswith("split") else (world - 1) / world
    pts = [(c["bytes_per_rank"] * share, c["seconds"]) for c in results[args.standin][args.impl]["curve"]]
    lat, per_byte = fit_curve(pts)
    rows = []
    for i, (x, y) in enumerate(pts):
        row = {"bytes": x, "measured_s": y, "predicted_s": lat + x * per_byte, "error": (lat + x * per_byte) / y - 1}
        others = pts[:i] + pts[i + 1:]
        if len(others) >= 2 and len({o[0] for o in others}) >= 2:  # the size predicted by a fit without it
            l2, p2 = fit_curve(others)
            row["held_out_error"] = (l2 + x * p2) / y - 1
        rows.append(row)
    return {"standin": args.standin, "impl": args.impl, "world": world, "latency_us": lat * 1e6,
            "bandwidth_GBps": 1 / per_byte / 1e9, "rows": rows,
            "simulate_flags": f"--link-gbps {8 / per_byte / 1e9:.3g} --link-latency-us {lat * 1e6:.0f} --link-efficiency 1"}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--cad", default=str(REPO / "build" / "bin" / "cad"))
    near = [d / "shared" / "data" / "doclen_pretrain.json" for d in (REPO.parent, REPO.parent.parent)]
    p.add_argument("--dist", default=os.environ.get("CAD_DATA") or str(next((d for d in near if d.exists()), near[0])),
                   help="the Pretrain lengths (default $CAD_DATA, else ../shared/data/doclen_pretrain.json)")
    p.add_argument("--host-runs", nargs="+", default=HOST_RUNS, help="record folders (under bench/results or absolute)")
    p.add_argument("--unsplit-config", default="prefix_aware")
    p.add_argument("--groups-config", default="prefix_aware_hg4")
    p.add_argument("--curve", help="a slow_links.py summary.json instead of trainer records")
    p.add_argument("--key", help="with --curve: the summary inside (host_staged_one_gpu.sh: np2, np4)")
    p.add_argument("--standin", default="host_staged")
    p.add_argument("--impl", default="cad")
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    try:
        if args.curve:
            report = curve_mode(args)
            print(f"{report['standin']} ({report['impl']}, {report['world']} ranks): latency {report['latency_us']:.1f} us, "
                  f"{report['bandwidth_GBps']:.2f} GB/s per rank\n| bytes crossing | measured s | predicted s | error | "
                  "error with this size held out |\n|---:|---:|---:|---:|---:|")
            for r in report["rows"]:
                held = f"{100 * r['held_out_error']:+.1f}%" if "held_out_error" in r else "-"
                print(f"| {r['bytes']:.0f} | {r['measured_s']:.6f} | {r['predicted_s']:.6f} | {100 * r['error']:+.1f}% | "
                      f"{held} |")
            print("cad simulate " + report["simulate_flags"])
        else:
            report = records_mode(args)
            print_records(report)
    except FitError as e:
        print(f"fit_link.py: {e}", file=sys.stderr)
        return 1
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
