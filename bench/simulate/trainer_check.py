#!/usr/bin/env python3
"""`cad simulate` against the measured trainer runs (examples/train_llama.py on 2 and 4 H200s, docs/multi_gpu.md).

Standard library only; runs the `cad` CLI. Three modes:

  --fit     fit the trainer's overhead terms (docs/simulate/trainer_h200.json) to the FIT runs only
  --table   predict every measured configuration of every run (fitted and held out) and write the table of
            predicted against measured step time into docs/simulate/trainer_check.md (trainer-table markers)
  --scale   re-predict 8-1024 GPUs with the calibrated model and write that table into docs/simulate/trainer_check.md
  --pipeline        the GPipe pipeline trainer (examples/train_pipeline.py; gpu_h200x2_2026-11-27_c6bcbc7/pipe, 2 H200s, PP=2) against
                    `cad simulate --schedule gpipe` with the same calibration (not refitted); table into
                    docs/simulate/trainer_check.md (pipeline-table markers)
  --pipeline-scale  DistCA's pipeline configurations (34B, PP 4 and 8, 64-512 GPUs, 128K-512K) re-predicted

Every measured configuration is priced on the very batches it trained on: the trainer samples micro-batch m of
step s with seed 1 + 1000 s + m (examples/train_llama.py, --seed 1), and the measured step time is the mean
over steps 1.. (step 0 warms up) of the slowest rank's step, as the trainer's summary reports it.

    python3 bench/simulate/trainer_check.py --fit --table --scale

It lives in bench/simulate/, beside the simulator's other checks and tables (simulate_table.py, fit_rank_model.py):
docs/ holds text and data, not programs. What it writes stays in docs/ (the tables between their markers in
docs/simulate/trainer_check.md, the calibration docs/simulate/trainer_h200.json).
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = REPO / "bench" / "results"
FIT_RUNS = ["trainer_h200x2_2026-11-26_f420ed7"]
HELD_OUT_RUNS = ["trainer_h200x2_2026-11-26_f420ed7_2", "trainer_h200x2_2026-11-26_f420ed7_3", "trainer_h200x4_2026-11-26_f420ed7", "trainer_h200x2_2026-11-26_a0e8285",
                 "trainer_h200x2_2026-11-26_a0e8285_2", "trainer_h200x2_2026-11-26_a0e8285_3", "trainer_h200x4_2026-11-26_9f37d93",
                 # 2026-11-27, 4 H200s: 64K at 2 layers with ping-pong on one and two lanes, 32 layers, 256K
                 "trainer_h200x4_2026-11-27_02b3ee5/a", "trainer_h200x4_2026-11-27_02b3ee5/b", "trainer_h200x4_2026-11-27_02b3ee5/c",
                 # 2026-11-27: after the per-layer host sync was removed (0457bc7), 64K-256K on 2 H200s
                 "trainer_h200x2_2026-11-27_5c7d4d4",
                 # 2026-11-27, 2 and 4 H200s: no timing syncs, ping-pong through cad.PingPongLayer
                 "trainer_h200x2_2026-11-27_00fd4de", "trainer_h200x2_2026-11-27_13b3af9/rounds", "trainer_h200x4_2026-11-27_00fd4de",
                 "trainer_h200x4_2026-11-27_00fd4de/256k",
                 # 2026-11-27, later: pinned uploads; two more rounds on 2 H200s
                 "trainer_h200x2_2026-11-27_24bbc98", "trainer_h200x2_2026-11-27_24bbc98_2"] + [
                 # 2026-11-28: 2 and 4 H200s over NVLink (6fc2a34_4 and 6fc2a34_5's other half moved NCCL
                 # through host memory: another link, not modelled); only their
                 # configurations the model prices (RECENT_MODELLED), not the trials of options it has no term for
                 "trainer_h200x2_2026-11-28_c787de7/a", "trainer_h200x2_2026-11-28_17590da/a", "trainer_h200x2_2026-11-28_17590da_2/a", "trainer_h200x2_2026-11-28_17590da_3/a",
                 "trainer_h200x2_2026-11-28_6fc2a34/a/round1", "trainer_h200x2_2026-11-28_6fc2a34/a/round2", "trainer_h200x2_2026-11-28_6fc2a34_2/a",
                 "trainer_h200x2_2026-11-28_6fc2a34_3/a/round1", "trainer_h200x2_2026-11-28_6fc2a34_3/a/round2", "trainer_h200x2_2026-11-28_6fc2a34_5/nvlink",
                 "trainer_h200x4_2026-11-28_96a28a7/a/round1", "trainer_h200x4_2026-11-28_96a28a7/a/round2",
                 # 2026-11-28: 64K on 2 H200s, one folder per round
                 "trainer_h200x2_2026-11-28_2ffe240/a/round1", "trainer_h200x2_2026-11-28_2ffe240/a/round2",
                 "trainer_h200x2_2026-11-28_8181526/a/round1", "trainer_h200x2_2026-11-28_8181526/a/round2",
                 "trainer_h200x2_2026-11-28_1dcb5de/a/round1", "trainer_h200x2_2026-11-28_1dcb5de/a/round2",
                 "trainer_h200x2_2026-11-28_3ece391/a/round1", "trainer_h200x2_2026-11-28_3ece391/a/round2", "trainer_h200x2_2026-11-28_3ece391/a/round3",
                 "trainer_h200x2_2026-11-28_3ece391_2/a/round1", "trainer_h200x2_2026-11-28_3ece391_2/a/round2",
                 # 2026-11-28: the old per-tensor path (b8371a0; 3c8dbea_2's old*), then one collective
                 # per direction with own rows off the wire (3c8dbea*'s new*); 128K (k128) and 256K (k256), one round
                 "trainer_h200x2_2026-11-28_b8371a0/a/round1", "trainer_h200x2_2026-11-28_b8371a0/a/round2",
                 "trainer_h200x2_2026-11-28_3c8dbea/new1", "trainer_h200x2_2026-11-28_3c8dbea/new2",
                 "trainer_h200x2_2026-11-28_3c8dbea_2/new1", "trainer_h200x2_2026-11-28_3c8dbea_2/new2", "trainer_h200x2_2026-11-28_3c8dbea_2/old1",
                 "trainer_h200x2_2026-11-28_3c8dbea_2/old2", "trainer_h200x2_2026-11-28_3c8dbea_2/k128", "trainer_h200x2_2026-11-28_3c8dbea_3/k256",
                 # 2026-11-28, 76d405a: the same code at 64K (2 rounds in _76d405a and _76d405a_4), 128K with 1
                 # and 2 layers (_2, _3); micro-batch pairs (_pingpongmb) priced as ping-pong
                 "trainer_h200x2_2026-11-28_76d405a/train/a/round1", "trainer_h200x2_2026-11-28_76d405a/train/a/round2",
                 "trainer_h200x2_2026-11-28_76d405a_2/a", "trainer_h200x2_2026-11-28_76d405a_3/a", "trainer_h200x2_2026-11-28_76d405a_4/a/round1",
                 "trainer_h200x2_2026-11-28_76d405a_4/a/round2", "trainer_h200x2_2026-11-28_76d405a_5/a"]
RECENT_RUNS = set(HELD_OUT_RUNS[HELD_OUT_RUNS.index("trainer_h200x2_2026-11-28_c787de7/a"):])
# What the model has terms for: the attention (local, torch_varlen) or balancer, and ping-pong. The recent runs also
# tried the dynamic forward walk, the own tasks in place, head groups, NCCL options and balancer tolerances.
# Ping-pong is priced on the micro-batch's unsplit plan (its bytes and work, overlapped by the fitted compute factor):
# what micro-batch pairs (_pingpongmb, --ping-pong-nanos micro-batches) run; halves move more (the 2026-11-28 records at
# 76d405a), which the model does not count.
RECENT_MODELLED = re.compile(r"(local|torch_varlen|per_doc_cp|distca|prefix_aware)(_pingpong(mb)?)?")
# Ping-pong as it runs since 70d9028 (cad.PingPongLayer: one call per layer for both nano-batches) is fitted on
# trainer_h200x2_2026-11-27_00fd4de and checked on the records after it; the ping-pong rows of earlier runs measured a superseded implementation (a
# stage loop with per-layer host syncs, 7-15% slower than unsplit) and are reported apart.
PINGPONG_FIT_RUNS = ["trainer_h200x2_2026-11-27_00fd4de"]
PINGPONG_CURRENT_RUNS = PINGPONG_FIT_RUNS + ["trainer_h200x2_2026-11-27_13b3af9/rounds", "trainer_h200x4_2026-11-27_00fd4de",
                                             "trainer_h200x4_2026-11-27_00fd4de/256k", "trainer_h200x2_2026-11-27_24bbc98",
                                             "trainer_h200x2_2026-11-27_24bbc98_2"] + sorted(RECENT_RUNS)
CALIBRATION = REPO / "docs" / "simulate" / "trainer_h200.json"
# The check tables live on a data page of their own, linked from docs/simulate.md (the user page).
CHECK_DOC = REPO / "docs" / "simulate" / "trainer_check.md"
TRAINER = ("examples/train_llama.py --model llama3-8b --parallel fsdp2 --checkpointing full --micro-batches 2 "
           "(bf16, AdamW, loss chunk 4096), torchrun on H200s with NCCL; docs/multi_gpu.md")


def cad_binary(args):
    return args.cad or str(REPO / "build" / "bin" / "cad")


# ---- the measurements --------------------------------------------------------------------------------------
# (record, context) left out: trainer_h200x2_2026-11-26_a0e8285_2's shared 64K and 128K processes failed (a statistics race, fixed since) and
# their CAD configurations were re-run alone in fresh processes, which are not the measurement the others are.
EXCLUDED = {("trainer_h200x2_2026-11-26_a0e8285_2", 65536), ("trainer_h200x2_2026-11-26_a0e8285_2", 131072)}


def measured_configs(runs):
    out = []
    for run in runs:
        for path in sorted((DATA / run).glob("train_*.json")):
            d = json.loads(path.read_text())
            s, steps = d["summary"], d["steps"]
            if (run, s["context"]) in EXCLUDED or s.get("balanced_batches"):
                continue  # local_balanced trains other batches than the seeds' (the measured ideal)
            tail = steps[1:] or steps
            name = re.match(r"train_(.*)_\d+\.json", path.name).group(1)
            if run in RECENT_RUNS and not RECENT_MODELLED.fullmatch(name):
                continue
            ranks = s["ranks"]
            out.append({
                "run": run, "config": name, "attention": s["attention"], "balancer": s["balancer"],
                # Split steps, as run: --ping-pong-when worthwhile (config _autopingpong) may have kept them whole.
                "pingpong": bool(s["ping_pong"]) and any(r.get("ping_pong", True) for r in tail),
                "context": s["context"], "layers": s["layers"],
                "micro_batches": s["micro_batches"], "ranks": ranks, "checkpointing": s["checkpointing"],
                "seeds": [1 + 1000 * r["step"] + m for r in tail for m in range(s["micro_batches"])],
                "steps": len(tail),
                "step_s": sum(max(r["step_s"]) for r in tail) / len(tail),
                "attention_s": [sum(r["attention_s"][k] for r in tail) / len(tail) for k in range(ranks)],
                "plan_make_ms": sum(max(r["plan_make_ms"]) for r in tail) / len(tail),
                "attention_timing": s.get("attention_timing", ""),
            })
    return out


# ---- the model -----------------------------------------------------------------------------------------------
def simulate(args, cfg, calibration, detail=False):
    balancer = "colocated" if cfg["attention"] in ("local", "torch_varlen") else cfg["balancer"]
    cmd = [cad_binary(args), "simulate", "--model", "llama-8b", "--layers", str(cfg["layers"]),
           "--gpus", str(cfg["ranks"]), "--gpus-per-node", str(cfg["ranks"]), "--dist", args.dist,
           "--context", str(cfg["context"]), "--microbatches", str(cfg["micro_batches"]),
           "--batch-seeds", ",".join(map(str, cfg["seeds"])), "--balancers", balancer,
           "--trainer", str(calibration), "--checkpointing", "full" if cfg["checkpointing"] == "full" else "none",
           "--json", "--quiet"]
    if cfg["attention"] == "torch_varlen":
        cmd += ["--kernel", "torch_varlen"]
    if detail:
        cmd.append("--detail")
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("cad simulate failed: %s\n%s" % (" ".join(cmd), result.stderr))
    out = json.loads(result.stdout)
    return out["balancers"][0], " ".join(cmd[1:])


def neutral_calibration(path, **terms):
    base = {"trainer": TRAINER, "fitted_on": ["none: neutral terms for fitting"], "layer_us_per_token": 0,
            "head_us_per_token": 0, "step_fixed_ms": 0, "attention_scale": 1, "torch_varlen_attention_scale": 1,
            "attention_call_us": 0, "plan_make_ms": 0, "plan_make_us_per_task": 0, "plan_make_ns_per_token": 0, "exchange_fixed_us": 0, "pack_unpack_ns_per_byte": 0,
            "pingpong_compute_factor": 1, "source": {}}
    base.update(terms)
    path.write_text(json.dumps(base, indent=1))
    return path


def lstsq(rows, ys):
    """Least squares without intercept for a few unknowns (normal equations, Gauss-Jordan)."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] + [sum(r[i] * y for r, y in zip(rows, ys))]
         for i in range(n)]
    for c in range(n):
        p = max(range(c, n), key=lambda k: abs(a[k][c]))
        a[c], a[p] = a[p], a[c]
        if abs(a[c][c]) < 1e-300:
            raise ValueError("singular fit")
        for k in range(n):
            if k != c:
                f = a[k][c] / a[c][c]
                a[k] = [x - f * y for x, y in zip(a[k], a[c])]
    return [a[i][n] / a[i][i] for i in range(n)]


def nonneg_lstsq(rows, ys, names):
    """lstsq, dropping (fixing at 0) any unknown that comes out negative, one at a time."""
    keep = list(range(len(names)))
    while True:
        sol = lstsq([[r[i] for i in keep] for r in rows], ys)
        worst = min(range(len(keep)), key=lambda k: sol[k])
        if sol[worst] >= 0 or len(keep) == 1:
            full = [0.0] * len(names)
            for k, i in enumerate(keep):
                full[i] = max(0.0, sol[k])
            return full, [names[i] for i in range(len(names)) if i not in keep]
        keep.pop(worst)


def fit(args):
    tmp = pathlib.Path(args.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    configs = measured_configs(FIT_RUNS)
    plain = [c for c in configs if not c["pingpong"]]
    neutral = neutral_calibration(tmp / "neutral.json")
    detail = {id(c): simulate(args, c, neutral, detail=True)[0]["detail"] for c in configs}

    def per_rank_sum(c, key):
        """Per rank: the detail's trainer_off[key] summed over micro-batches, averaged over steps."""
        out = [0.0] * c["ranks"]
        for mb in detail[id(c)]:
            for r, rk in enumerate(mb["ranks"]):
                out[r] += rk["trainer_off"][key] / c["steps"]
        return out

    notes = {}
    # 1. The attention call: local runs, measured attention seconds per rank and step (synchronised calls) =
    # scale x the rate table's kernel seconds (forward twice: the recomputed forward) + calls x a fixed cost.
    # torch_varlen: its own scale, the same per-call cost.
    def calls(c):
        return c["layers"] * (3 if c["checkpointing"] == "full" else 2) * c["micro_batches"]

    pts = [(m, p, calls(c)) for c in plain if c["attention"] == "local"
           for m, p in zip(c["attention_s"], per_rank_sum(c, "attention_s"))]
    (s_local, call_us), dropped_a = nonneg_lstsq([[p, n * 1e-6] for _, p, n in pts], [m for m, _, _ in pts],
                                                 ["attention_scale", "attention_call_us"])
    notes["local"] = len(pts)
    pts = [(m, p, calls(c)) for c in plain if c["attention"] == "torch_varlen"
           for m, p in zip(c["attention_s"], per_rank_sum(c, "attention_s"))]
    s_tv = sum((m - n * call_us * 1e-6) * p for m, p, n in pts) / sum(p * p for _, p, _ in pts)
    notes["torch_varlen"] = len(pts)
    scale = {"local": s_local, "torch_varlen": s_tv}
    # 2. CAD's exchanges: CAD's measured attention call (kernels, exchanges, pack/unpack) minus the scaled kernel
    # time and the NCCL curve's time for its bytes = passes x fixed + bytes moved x per-byte.
    rows, ys = [], []
    for c in plain:
        if c["attention"] != "cad":
            continue
        kern, wire = per_rank_sum(c, "attention_s"), per_rank_sum(c, "exchange_s")
        passes = c["layers"] * (3 if c["checkpointing"] == "full" else 2) * c["micro_batches"]
        for r in range(c["ranks"]):
            moved = sum(mb["ranks"][r]["bytes_sent"] + mb["ranks"][r]["bytes_received"]
                        for mb in detail[id(c)]) / c["steps"] * c["layers"] * (3 if c["checkpointing"] == "full" else 2)
            rows.append([passes * 1e-6, moved * 1e-9])
            ys.append(c["attention_s"][r] - scale["local"] * kern[r] - calls(c) * call_us * 1e-6 - wire[r])
    (fixed_us, ns_per_byte), dropped_x = nonneg_lstsq(rows, ys, ["exchange_fixed_us", "pack_unpack_ns_per_byte"])
    # 3. The plan make: per step, the slowest rank's make time (all the step's plans) against plans and tasks.
    rows, ys = [], []
    for c in plain:
        if c["attention"] != "cad":
            continue
        tasks = 0.0  # the slowest make's rank: the most tasks served (the plan's per-rank part)
        for mb in detail[id(c)]:
            tasks += max(rk["tasks_served"] for rk in mb["ranks"]) / c["steps"]
        rows.append([c["micro_batches"], tasks * 1e-3, c["micro_batches"] * c["context"] * 1e-6])
        ys.append(c["plan_make_ms"])
    (plan_ms, plan_us_task, plan_ns_token), dropped_p = nonneg_lstsq(
        rows, ys, ["plan_make_ms", "plan_make_us_per_task", "plan_make_ns_per_token"])
    # 4. The rest of the step: measured step minus the model's step with every term above and none of the
    # linear ones = micro-batches x tokens x (layers x layer_us + head_us) + fixed.
    partial = neutral_calibration(tmp / "partial.json", attention_scale=scale["local"],
                                  torch_varlen_attention_scale=scale["torch_varlen"], exchange_fixed_us=fixed_us,
                                  pack_unpack_ns_per_byte=ns_per_byte, plan_make_ms=plan_ms,
                                  plan_make_us_per_task=plan_us_task, plan_make_ns_per_token=plan_ns_token,
                                  attention_call_us=call_us)
    rows, ys = [], []
    for c in plain:
        res, _ = simulate(args, c, partial)
        tokens = c["micro_batches"] * c["context"]
        rows.append([tokens * c["layers"] * 1e-6, tokens * 1e-6, 1e-3])
        ys.append(c["step_s"] - res["off"]["mean_step_seconds"])
    (layer_us, head_us, fixed_ms), dropped_l = nonneg_lstsq(rows, ys, ["layer_us_per_token", "head_us_per_token",
                                                                       "step_fixed_ms"])
    # 5. Ping-pong: CAD's ping-pong runs, the compute factor that fits their steps best (a scan; the model's
    # max() makes it piecewise).
    terms = dict(attention_scale=scale["local"], torch_varlen_attention_scale=scale["torch_varlen"],
                 exchange_fixed_us=fixed_us, pack_unpack_ns_per_byte=ns_per_byte, plan_make_ms=plan_ms,
                 plan_make_us_per_task=plan_us_task, plan_make_ns_per_token=plan_ns_token,
                 attention_call_us=call_us, layer_us_per_token=layer_us, head_us_per_token=head_us,
                 step_fixed_ms=fixed_ms)
    pp = [c for c in measured_configs(PINGPONG_FIT_RUNS) if c["pingpong"] and c["attention"] == "cad"]
    best = None
    for factor in [1 + k / 200 for k in range(0, 41)]:  # 1.000 .. 1.200
        cal = neutral_calibration(tmp / "pp.json", pingpong_compute_factor=factor, **terms)
        err = sum((simulate(args, c, cal)[0]["on"]["mean_step_seconds"] / c["step_s"] - 1) ** 2 for c in pp)
        if best is None or err < best[1]:
            best = (factor, err)
    factor = best[0]

    def r(x, n=4):
        return float("%.*g" % (n, x))

    runs = ", ".join("bench/results/" + x for x in FIT_RUNS)
    n_plain, n_cad = len(plain), sum(c["attention"] == "cad" for c in plain)
    cal = {
        "comment": "The overhead terms of a real training step, for `cad simulate --trainer` (schema: "
                   "tools/simulate/trainer_calibration.h). Written by `python3 bench/simulate/trainer_check.py "
                   "--fit` from the fitted runs only; the other runs are held out (docs/simulate.md).",
        "trainer": TRAINER, "fitted_on": ["bench/results/" + x for x in FIT_RUNS],
        "layer_us_per_token": r(layer_us), "head_us_per_token": r(head_us), "step_fixed_ms": r(fixed_ms),
        "attention_scale": r(scale["local"]), "torch_varlen_attention_scale": r(scale["torch_varlen"]),
        "attention_call_us": r(call_us), "plan_make_ms": r(plan_ms), "plan_make_us_per_task": r(plan_us_task),
        "plan_make_ns_per_token": r(plan_ns_token), "exchange_fixed_us": r(fixed_us),
        "pack_unpack_ns_per_byte": r(ns_per_byte), "pingpong_compute_factor": r(factor),
        "source": {
            "attention_scale": f"{runs}, local without ping-pong ({notes['local']} rank x context points): least "
                               "squares of the measured attention seconds per rank and step (synchronised calls) on "
                               "the rate table's kernel seconds for the same batches (forward counted twice) and the "
                               "number of attention calls" +
                               (" (came out negative: fixed at 0)" if "attention_scale" in dropped_a else ""),
            "attention_call_us": "the same fit as attention_scale: the fixed cost of one attention call" +
                                 (" (came out negative: fixed at 0)" if "attention_call_us" in dropped_a else ""),
            "torch_varlen_attention_scale": f"{runs}, torch_varlen without ping-pong ({notes['torch_varlen']} "
                                            "points): the same fit with attention_call_us fixed",
            "exchange_fixed_us": f"{runs}, CAD without ping-pong ({n_cad} configurations x ranks): measured CAD "
                                 "attention call minus scaled kernel time minus the NCCL curve's time for the "
                                 "plan's bytes, fitted as passes x fixed + bytes x per-byte" +
                                 (" (came out negative: fixed at 0)" if "exchange_fixed_us" in dropped_x else ""),
            "pack_unpack_ns_per_byte": "the same fit as exchange_fixed_us; bytes = sent + received per pass" +
                                       (" (came out negative: fixed at 0)" if "pack_unpack_ns_per_byte" in dropped_x
                                        else ""),
            "plan_make_ms": f"{runs}, CAD without ping-pong ({n_cad} configurations): the slowest rank's plan "
                            "make per step fitted as plans x fixed + tasks served x per-task + tokens x per-token" +
                            (" (came out negative: fixed at 0)" if "plan_make_ms" in dropped_p else ""),
            "plan_make_us_per_task": "the same fit as plan_make_ms" +
                                     (" (came out negative: fixed at 0)" if "plan_make_us_per_task" in dropped_p
                                      else ""),
            "plan_make_ns_per_token": "the same fit as plan_make_ms (tokens of the rank)" +
                                      (" (came out negative: fixed at 0)" if "plan_make_ns_per_token" in dropped_p
                                       else ""),
            "layer_us_per_token": f"{runs}, every configuration without ping-pong ({n_plain}): measured step minus "
                                  "the model's attention, exchanges and plan make, fitted as micro-batches x tokens x "
                                  "(layers x layer + head) + fixed" +
                                  ("; fixed at 0: " + ", ".join(dropped_l) if dropped_l else ""),
            "head_us_per_token": "the same fit as layer_us_per_token",
            "step_fixed_ms": "the same fit as layer_us_per_token",
            "pingpong_compute_factor": f"{', '.join('bench/results/' + x for x in PINGPONG_FIT_RUNS)} (ping-pong as "
                                       f"cad.PingPongLayer runs it), CAD with ping-pong ({len(pp)} configurations): "
                                       "the factor in "
                                       "1.000-1.200 (steps of 0.005) with the least squared relative step error",
        },
    }
    CALIBRATION.write_text(json.dumps(cal, indent=1) + "\n")
    print(json.dumps({k: v for k, v in cal.items() if k not in ("source", "comment")}, indent=1))


# ---- the tables ----------------------------------------------------------------------------------------------
def replace_between(text, tag, body):
    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text:
        return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    return text.rstrip() + "\n\n" + block + "\n"


def role(c):
    """fit / held out for the terms the configuration's step depends on; a ping-pong row of an implementation
    since replaced is neither."""
    if c["pingpong"]:
        if c["run"] not in PINGPONG_CURRENT_RUNS:
            return "superseded ping-pong"
        return "fit" if c["run"] in PINGPONG_FIT_RUNS else "held out"
    return "fit" if c["run"] in FIT_RUNS else "held out"


def table(args):
    rows, worst = [], {"fit": (0, None), "held out": (0, None), "superseded ping-pong": (0, None)}
    order = {"local": 0, "torch_varlen": 1, "per_doc_cp": 2, "distca": 3, "prefix_aware": 4}
    configs = measured_configs(FIT_RUNS + HELD_OUT_RUNS)
    # Records in the order they were made: FIT_RUNS and HELD_OUT_RUNS list them that way.
    configs.sort(key=lambda c: (c["ranks"], c["run"] not in FIT_RUNS, (FIT_RUNS + HELD_OUT_RUNS).index(c["run"]),
                                c["run"], c["context"], c["pingpong"], order.get(c["config"].replace("_pingpong", ""), 9)))
    errors = {"fit": [], "held out": [], "superseded ping-pong": []}
    for c in configs:
        res, cmd = simulate(args, c, CALIBRATION)
        mode = res["on"] if c["pingpong"] else res["off"]
        pred = mode["mean_step_seconds"]
        err = pred / c["step_s"] - 1
        kind = role(c)
        errors[kind].append(err)
        if abs(err) > abs(worst[kind][0]):
            worst[kind] = (err, c)
        s = mode["slowest_rank"]
        rows.append(f"| {c['run'].replace('trainer_', '')} | {kind} | {c['ranks']} | {c['context'] // 1024}K | "
                    f"{c['layers']} | {c['config']} | {c['step_s'] * 1e3:.0f} | {pred * 1e3:.0f} | {err * 100:+.1f}% | "
                    f"{s['linear_s'] * 1e3:.0f} / {s['attention_s'] * 1e3:.0f} / {s['comm_s'] * 1e3:.0f} / "
                    f"{s['plan_s'] * 1e3:.1f} |")
    lines = ["| run | role | GPUs | tokens/GPU | layers | config | measured step (ms) | predicted (ms) | error | "
             "predicted slowest rank per micro-batch: linear / attention / exchange / plan (ms) |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---|"] + rows
    summary = []
    for kind in ("fit", "held out", "superseded ping-pong"):
        e = errors[kind]
        if not e:
            continue
        w, c = worst[kind]
        summary.append(f"- **{kind}** ({len(e)} configurations): mean |error| {sum(abs(x) for x in e) / len(e) * 100:.1f}%, "
                       f"worst {w * 100:+.1f}% ({c['run'].replace('trainer_', '')} {c['context'] // 1024}K "
                       f"{c['config']}); {sum(abs(x) <= 0.10 for x in e)} of {len(e)} within 10%.")
    cal = json.loads(CALIBRATION.read_text())
    terms = "\n".join(f"| `{k}` | {cal[k]} | {cal['source'][k]} |" for k in cal["source"])
    example = ("build/bin/cad simulate --model llama-8b --layers 2 --gpus 2 --gpus-per-node 2 --dist "
               "/work/shared/data/doclen_pretrain.json --context 65536 --microbatches 2 --batch-seeds 1001,1002,2001,2002 "
               "--trainer docs/simulate/trainer_h200.json")
    body = "\n".join(["Command: `python3 bench/simulate/trainer_check.py --table` (after `--fit`). One configuration, by hand:",
                      "", f"    {example}", "", "The fitted terms (`docs/simulate/trainer_h200.json`):", "",
                      "| term | value | fitted to |", "|---|---:|---|", terms, "", *summary, "", *lines])
    CHECK_DOC.write_text(replace_between(CHECK_DOC.read_text(), "trainer-table", body))
    print("\n".join(summary))


def scale(args):
    gpus = [8, 32, 128, 512, 1024]
    contexts = [65536, 131072, 262144]
    lines = ["| GPUs | tokens/GPU | step colocated (s) | per_doc_cp | distca | prefix_aware | prefix_aware + ping-pong | "
             "prefix_aware vs colocated | prefix_aware vs per_doc_cp | same, kernel-level model (no trainer terms) | "
             "plan make per micro-batch (s): per_doc_cp / prefix_aware |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for g in gpus:
        for ctx in contexts:
            base = [cad_binary(args), "simulate", "--model", "llama-8b", "--gpus", str(g), "--dist", args.dist,
                    "--context", str(ctx), "--microbatches", "2", "--steps", str(args.scale_steps), "--json", "--quiet"]
            out = json.loads(subprocess.run(base + ["--trainer", str(CALIBRATION)], capture_output=True, text=True,
                                            check=True).stdout)
            plain = json.loads(subprocess.run(base, capture_output=True, text=True, check=True).stdout)
            b = {x["name"]: x for x in out["balancers"]}
            p = {x["name"]: x for x in plain["balancers"]}
            st = {n: b[n]["off"]["mean_step_seconds"] for n in b}
            pa_pp = b["prefix_aware"]["on"]["mean_step_seconds"]
            best_pa = min(st["prefix_aware"], pa_pp)
            kl = (p["colocated"]["on"]["mean_step_seconds"] / p["prefix_aware"]["on"]["mean_step_seconds"],
                  p["per_doc_cp"]["on"]["mean_step_seconds"] / p["prefix_aware"]["on"]["mean_step_seconds"])
            lines.append(f"| {g} | {ctx // 1024}K | {st['colocated']:.1f} | {st['per_doc_cp']:.1f} | {st['distca']:.1f} | "
                         f"{st['prefix_aware']:.1f} | {pa_pp:.1f} | {st['colocated'] / best_pa:.2f} | "
                         f"{min(st['per_doc_cp'], b['per_doc_cp']['on']['mean_step_seconds']) / best_pa:.2f} | "
                         f"{kl[0]:.2f} / {kl[1]:.2f} | {b['per_doc_cp']['off']['slowest_rank']['plan_s']:.3f} / "
                         f"{b['prefix_aware']['off']['slowest_rank']['plan_s']:.3f} |")
            print(lines[-1], flush=True)
    cmd = ("build/bin/cad simulate --model llama-8b --gpus N --dist /work/shared/data/doclen_pretrain.json --context C "
           f"--microbatches 2 --steps {args.scale_steps} --trainer docs/simulate/trainer_h200.json --json")
    body = "\n".join([f"Command: `python3 bench/simulate/trainer_check.py --scale`, i.e. for each cell `{cmd}` (and the "
                      "same without `--trainer` for the last column).", "", *lines])
    CHECK_DOC.write_text(replace_between(CHECK_DOC.read_text(), "trainer-scale", body))


# ---- the pipeline trainer (examples/train_pipeline.py, GPipe; docs/multi_gpu.md "Pipeline parallel") -------------
PIPE_RUN = "gpu_h200x2_2026-11-27_c6bcbc7/pipe"
PIPE_CONFIGS = ["local", "torch_varlen", "cad_tick", "cad_stage"]


def pipeline_measured():
    out = []
    for path in sorted((DATA / PIPE_RUN).glob("pipe_*.json")):
        d = json.loads(path.read_text())
        s, steps = d["summary"], d["steps"]
        tail = steps[1:] or steps
        config = re.match(r"pipe_\d+_\d+_(.*)\.json", path.name).group(1)
        ranks = s["ranks"]
        out.append({
            "config": config, "attention": s["attention"], "pool": s.get("pool"), "balancer": s.get("balancer"),
            "context": s["context"], "layers": s["layers"], "pp": s["pp"], "dp": s["dp"], "ranks": ranks,
            "micro_batches": s["micro_batches"], "checkpointing": s["checkpointing"],
            # train_pipeline.py: micro-batch m of step k has seed --seed (1) + 1000 k + m
            "seeds": [1 + 1000 * r["step"] + m for r in tail for m in range(s["micro_batches"])],
            "step_s": sum(r["step_ms"] for r in tail) / len(tail) * 1e-3,
            # the forward phase: the rank whose forward ticks end last (the last stage), its forward ticks' sum
            "forward_s": sum(max(sum(t["tick_s"][k] for t in r["ticks"] if t["phase"] == "forward")
                                 for k in range(ranks)) for r in tail) / len(tail),
            # per rank, attention seconds per step (every call, synchronised), summed over the ticks
            "attention_s": [sum(sum(t["attention_s"][k] for t in r["ticks"]) for r in tail) / len(tail)
                            for k in range(ranks)],
        })
    return out


def pipeline_simulate(args, cfg, calibration, extra=()):
    cad_balancer = cfg["attention"] == "cad"
    cmd = [cad_binary(args), "simulate", "--model", "llama-8b", "--layers", str(cfg["layers"]),
           "--gpus", str(cfg["ranks"]), "--gpus-per-node", str(cfg["ranks"]), "--pp", str(cfg["pp"]),
           "--schedule", "gpipe", "--dist", args.dist, "--context", str(cfg["context"]),
           "--microbatches", str(cfg["micro_batches"]), "--batch-seeds", ",".join(map(str, cfg["seeds"])),
           "--balancers", cfg["balancer"] if cad_balancer else "colocated", "--trainer", str(calibration),
           "--checkpointing", "full" if cfg["checkpointing"] == "full" else "none", "--json", "--quiet", "--detail",
           *extra]
    if cad_balancer:
        cmd += ["--pool", cfg["pool"]]
    if cfg["attention"] == "torch_varlen":
        cmd += ["--kernel", "torch_varlen"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("cad simulate failed: %s\n%s" % (" ".join(cmd), result.stderr))
    return json.loads(result.stdout)["balancers"][0], " ".join(cmd[1:])


def pipeline_table(args):
    rows, errors, example = [], [], None
    order = {c: i for i, c in enumerate(PIPE_CONFIGS)}
    configs = sorted(pipeline_measured(), key=lambda c: (c["context"], c["micro_batches"], order.get(c["config"], 9)))
    for c in configs:
        res, cmd = pipeline_simulate(args, c, CALIBRATION)
        example = example or cmd
        pred = res["off"]["mean_step_seconds"]
        err = pred / c["step_s"] - 1
        errors.append((err, c))
        layers = c["layers"] // c["pp"]
        steps = max(t["step"] for t in res["ticks"]) + 1
        # Attention as the trainer times it (CUDA synchronised around each call): a rank's own calls, and under tick
        # pooling also its waits inside the collective calls for the other stages' non-attention work and head
        # (lockstep: the tick's time less the rank's own non-attention and head).
        if c["attention"] == "cad" and c["pool"] == "tick":
            attn = [sum(t["seconds"] - layers * t["ranks"][k]["non_attention_per_layer_s"] - t["ranks"][k]["head_s"]
                        for t in res["ticks"]) / steps for k in range(c["ranks"])]
        else:
            attn = [sum(layers * t["ranks"][k]["attention_per_layer_s"] for t in res["ticks"]) / steps
                    for k in range(c["ranks"])]
        phase = {ph: sum(t["seconds"] for t in res["ticks"] if t["phase"] == ph) / steps
                 for ph in ("forward", "backward")}
        rows.append(f"| {c['context'] // 1024}K | {c['config']} | {c['step_s'] * 1e3:.0f} | {pred * 1e3:.0f} | "
                    f"{err * 100:+.1f}% | {c['forward_s'] * 1e3:.0f} / {(c['step_s'] - c['forward_s']) * 1e3:.0f} | "
                    f"{phase['forward'] * 1e3:.0f} / {phase['backward'] * 1e3:.0f} | "
                    f"{' / '.join(f'{a * 1e3:.0f}' for a in c['attention_s'])} | "
                    f"{' / '.join(f'{a * 1e3:.0f}' for a in attn)} |")
        print(rows[-1], flush=True)
    worst = max(errors, key=lambda e: abs(e[0]))
    summary = (f"- {len(errors)} configurations: mean |error| {sum(abs(e) for e, _ in errors) / len(errors) * 100:.1f}%, "
               f"worst {worst[0] * 100:+.1f}% ({worst[1]['context'] // 1024}K {worst[1]['config']}); "
               f"{sum(abs(e) <= 0.10 for e, _ in errors)} of {len(errors)} within 10%.")
    lines = ["| tokens per micro-batch | config | measured step (ms) | predicted (ms) | error | measured forward / "
             "backward phase (ms) | predicted forward / backward ticks (ms) | measured attention per step, stage 0 / 1 "
             "(ms) | predicted as timed, stage 0 / 1 (ms) |",
             "|---:|---|---:|---:|---:|---|---|---|---|"] + rows
    body = "\n".join(["Command: `python3 bench/simulate/trainer_check.py --pipeline` (the calibration as fitted on the "
                      "data-parallel record trainer_h200x2_2026-11-26_f420ed7, nothing refitted). One configuration, by hand:", "",
                      f"    build/bin/cad {example.replace(str(REPO) + '/', '').replace(args.dist, '/work/shared/data/doclen_pretrain.json')}",
                      "", summary, "", *lines])
    CHECK_DOC.write_text(replace_between(CHECK_DOC.read_text(), "pipeline-table", body))
    print(summary)


def shape_scaled_calibration(path, shape):
    """The trainer calibration for another model shape: its per-token terms scaled by the shape's FLOPs per
    token over Llama-8B's (layer: the linear layers; head: the output projection); every other term as fitted.
    An assumption (the terms were fitted on the 8B shape only), labelled in the file."""
    def linear(h, heads, kv, d, mlp):
        return 2.0 * (h * (heads + 2 * kv) * d + heads * d * h + 3.0 * h * mlp)
    shapes = {"llama-8b": (4096, 32, 8, 128, 14336, 128256), "34b": (8192, 64, 8, 128, 22016, 32000)}
    h8, *_ = shapes["llama-8b"]
    h, heads, kv, d, mlp, vocab = shapes[shape]
    cal = json.loads(CALIBRATION.read_text())
    layer_ratio = linear(h, heads, kv, d, mlp) / linear(*shapes["llama-8b"][:5])
    head_ratio = (h * vocab) / (h8 * shapes["llama-8b"][5])
    cal["layer_us_per_token"] = round(cal["layer_us_per_token"] * layer_ratio, 4)
    cal["head_us_per_token"] = round(cal["head_us_per_token"] * head_ratio, 4)
    cal["fitted_on"] = cal["fitted_on"] + [f"scaled to the {shape} shape by FLOPs per token (layer x {layer_ratio:.3f}, "
                                           f"head x {head_ratio:.3f})"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cal, indent=1))
    return path, layer_ratio, head_ratio


def pipeline_scale(args):
    cal, layer_ratio, head_ratio = shape_scaled_calibration(pathlib.Path(args.tmp) / "trainer_h200_34b.json", "34b")
    lines = ["| PP | GPUs (DP) | tokens/GPU | micro-batches | step local (s) | CAD per tick (s) | CAD per stage (s) | "
             "CAD in bubbles (s) | bubbles + per stage (s) | tick vs local | stage vs local | bubble vs local | "
             "bubble_stage vs local | attention imbalance local / tick / stage |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for pp in args.pipeline_pp:
        for g in args.pipeline_gpus:
            for ctx in args.pipeline_contexts:
                m = 2 * pp
                base = [cad_binary(args), "simulate", "--model", "34b", "--gpus", str(g), "--pp", str(pp),
                        "--schedule", "gpipe", "--dist", args.dist, "--context", str(ctx), "--microbatches", str(m),
                        "--steps", "1", "--trainer", str(cal), "--json", "--quiet"]
                res = {}
                for pool, names in (("tick", "colocated,prefix_aware"), ("stage", "prefix_aware"),
                                    ("bubble", "prefix_aware"), ("bubble_stage", "prefix_aware")):
                    out = json.loads(subprocess.run(base + ["--balancers", names, "--pool", pool],
                                                    capture_output=True, text=True, check=True).stdout)
                    b = {x["name"]: x for x in out["balancers"]}
                    res.setdefault("local", b.get("colocated"))
                    res[pool] = b["prefix_aware"]
                st = {k: v["off"]["mean_step_seconds"] for k, v in res.items()}
                lines.append(f"| {pp} | {g} ({g // pp}) | {ctx // 1024}K | {m} | {st['local']:.1f} | {st['tick']:.1f} | "
                             f"{st['stage']:.1f} | {st['bubble']:.1f} | {st['bubble_stage']:.1f} | "
                             f"{st['local'] / st['tick']:.2f} | {st['local'] / st['stage']:.2f} | "
                             f"{st['local'] / st['bubble']:.2f} | {st['local'] / st['bubble_stage']:.2f} | "
                             f"{res['local']['attention_imbalance']:.2f} / {res['tick']['attention_imbalance']:.2f} / "
                             f"{res['stage']['attention_imbalance']:.2f} |")
                print(lines[-1], flush=True)
    cmd = ("build/bin/cad simulate --model 34b --gpus G --pp PP --schedule gpipe --dist /work/shared/data/doclen_pretrain.json "
           "--context C --microbatches 2PP --steps 1 --trainer TRAINER_34B --balancers colocated,prefix_aware --pool tick|stage|bubble|bubble_stage "
           "--json")
    body = "\n".join([f"Command: `python3 bench/simulate/trainer_check.py --pipeline-scale`, i.e. for each cell `{cmd}`, "
                      f"where TRAINER_34B is docs/simulate/trainer_h200.json with its per-token terms scaled to the 34B "
                      f"shape by FLOPs per token (layer x {layer_ratio:.3f}, head x {head_ratio:.3f}; an assumption: "
                      "the terms were fitted on the 8B shape).", "", *lines])
    CHECK_DOC.write_text(replace_between(CHECK_DOC.read_text(), "pipeline-scale", body))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fit", action="store_true")
    p.add_argument("--table", action="store_true")
    p.add_argument("--scale", action="store_true")
    p.add_argument("--cad", default=None, help="the cad binary (default build/bin/cad)")
    p.add_argument("--dist", default=os.environ.get("CAD_DATA", str(REPO.parent / "shared" / "data" /
                                                                    "doclen_pretrain.json")))
    p.add_argument("--tmp", default="/tmp/cad_trainer_check")
    p.add_argument("--scale-steps", type=int, default=2)
    p.add_argument("--pipeline", action="store_true", help="the GPipe pipeline trainer's record on 2 H200s (gpu_h200x2_2026-11-27_c6bcbc7/pipe) against the model")
    p.add_argument("--pipeline-scale", action="store_true", help="DistCA's pipeline configurations (34B, GPipe)")
    p.add_argument("--pipeline-pp", type=lambda t: [int(x) for x in t.split(",")], default=[4, 8])
    p.add_argument("--pipeline-gpus", type=lambda t: [int(x) for x in t.split(",")], default=[64, 128, 256, 512])
    p.add_argument("--pipeline-contexts", type=lambda t: [int(x) for x in t.split(",")],
                   default=[131072, 262144, 524288])
    args = p.parse_args()
    if not (args.fit or args.table or args.scale or args.pipeline or args.pipeline_scale):
        p.error("say --fit, --table, --scale, --pipeline and/or --pipeline-scale")
    if args.fit:
        fit(args)
    if args.table:
        table(args)
    if args.scale:
        scale(args)
    if args.pipeline:
        pipeline_table(args)
    if args.pipeline_scale:
        pipeline_scale(args)


if __name__ == "__main__":
    main()
