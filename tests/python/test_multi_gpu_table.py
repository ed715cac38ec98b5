"""tests/multi_gpu/table.py on hand-made trainer records: the numbers docs/multi_gpu.md quotes (speedup vs the
faster local baseline, ideal speedup from its measured parts, realised share, ratio to per_doc_cp, ping-pong
saving, loss agreement, MFU, peak memory), the profiled step left out, skipped configurations, and the profile
and plan-arrival tables; and integrations/torchtitan/bench_table.py (TorchTitan's trainer on GPUs)."""
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
TABLE = REPO / "tests" / "multi_gpu" / "table.py"


def record(step, step_s, attention_s, loss=7.0, profiled=False, sent=None):
    r = {"step": step, "loss": loss, "losses": [loss] * len(step_s), "tokens_per_s": 1000.0 / max(step_s),
         "step_s": step_s, "attention_s": attention_s, "imbalance": 1.5, "profiled": profiled,
         "peak_memory_gib": [10.0, 12.5], "plan_ms": [3.0, 4.0], "plan_make_ms": [20.0, 35.0], "mfu": 0.4}
    if sent is not None:
        r["forward_bytes_sent_by_rank"] = sent
    return r


def write(tmp, name, steps, layers=4, timing="synchronized", profiled_step=None, skipped=None, summary=None):
    run = {"summary": {"layers": layers, "attention_timing": timing, **(summary or {})}, "steps": steps}
    if skipped:
        run["summary"]["skipped"] = skipped
    if profiled_step is not None:
        run["profiled_step"] = profiled_step
    (tmp / f"train_{name}_65536.json").write_text(json.dumps(run))


def table(tmp):
    done = subprocess.run([sys.executable, str(TABLE), str(tmp)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 2 and cells[0] == "64K":
            rows.setdefault(cells[1], cells)  # the main table comes first; later tables repeat the names
    return rows, done.stdout


def paired(stdout):
    """The step-by-step table's rows: {config: cells}."""
    part = stdout.partition("Step by step")[2].partition("\n\n")[2]
    return {c[1]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in part.splitlines()
                              if line.startswith("| 64K"))}


def test_ideal_speedup_share_and_ratios(tmp_path):
    # local: two ranks; steps 1-2 counted (step 0 warms up; the profiled run is outside "steps"). Step 1: 2.0 s,
    # attention 1.0 / 0.2 -> ideal 2.0 - 1.0 + 0.6 = 1.6; step 2: 3.0 s, attention 1.5 / 0.5 -> ideal 2.5.
    # Means: 2.5 s, ideal 2.05.
    write(tmp_path, "local", [record(0, [9.0, 9.0], [5.0, 5.0]), record(1, [2.0, 1.9], [1.0, 0.2]),
                              record(2, [3.0, 2.8], [1.5, 0.5])],
          profiled_step=record(1, [99.0, 99.0], [50.0, 50.0], profiled=True))
    write(tmp_path, "per_doc_cp", [record(i, [t, t], [0.5, 0.5], sent=[2**20, 2**20])
                                   for i, t in enumerate([9.0, 2.5, 2.5, 2.5])])
    write(tmp_path, "prefix_aware", [record(i, [t, t], [0.5, 0.5], loss=7.0 * (1 + 1e-3), sent=[2**21, 2**21])
                                     for i, t in enumerate([9.0, 2.0, 2.0, 2.0])])
    write(tmp_path, "prefix_aware_pingpong", [record(i, [t, t], [0.1, 0.1], sent=[2**21, 2**21])
                                              for i, t in enumerate([9.0, 1.8, 1.8, 1.8])],
          timing="enqueue only (ping-pong on CUDA)")
    rows, _ = table(tmp_path)
    local, per_doc, ours, pp = rows["local"], rows["per_doc_cp"], rows["prefix_aware"], rows["prefix_aware_pingpong"]
    # columns: context, config, layers, step ms, tokens/s K, MFU %, peak GiB, imbalance, speedup, ideal, realised
    # share, vs per_doc_cp, measured max/mean, fwd MiB, ping-pong saved, loss diff, plan ms
    assert local[3] == "2500" and local[8] == "1.000" and local[10] == "0.00"
    assert local[9] == "1.220"                                   # 2.5 / 2.05
    assert ours[3] == "2000" and ours[8] == "1.250" and ours[9] == "1.220"
    assert ours[10] == "1.14"                                    # (1.25 - 1) / (1.2195 - 1)
    assert ours[11] == "1.250"                                   # per_doc_cp 2.5 s / 2.0 s
    assert per_doc[8] == "1.000" and per_doc[11] == "1.000"
    assert local[12] == "1.58"                                   # mean of 1.0/0.6 and 1.5/1.0
    assert ours[13] == "4" and per_doc[13] == "2"                # MiB per layer over all ranks
    assert pp[12] == "-" and pp[14] == "200"                     # enqueue-only timing; 2.0 - 1.8 s saved
    assert ours[15] == "1.0e-03" and local[15] == "0.0e+00"
    assert ours[6] == "12.5" and ours[16] == "4.00 / 35.0" and local[16] == "-"
    assert ours[5] == "40.0" and ours[7] == "1.500"


def test_a_local_balanced_run_gives_the_measured_ideal(tmp_path):
    # local 2.5 s (computed ideal 2.5 / 2.05 as above), local_balanced 2.0 s -> measured ideal 1.25; prefix_aware
    # 2.2 s -> speedup 1.136, shares 0.62 (computed) and 0.55 (measured).
    write(tmp_path, "local", [record(0, [9.0, 9.0], [5.0, 5.0]), record(1, [2.0, 1.9], [1.0, 0.2]),
                              record(2, [3.0, 2.8], [1.5, 0.5])])
    write(tmp_path, "local_balanced", [record(i, [t, t], [0.6, 0.6]) for i, t in enumerate([9.0, 2.0, 2.0])])
    write(tmp_path, "prefix_aware", [record(i, [t, t], [0.5, 0.5]) for i, t in enumerate([9.0, 2.2, 2.2])])
    rows, _ = table(tmp_path)
    assert rows["local"][9] == "1.220 / 1.250" and rows["prefix_aware"][9] == "1.220 / 1.250"
    assert rows["prefix_aware"][10] == "0.62 / 0.55"
    assert rows["local_balanced"][10] == "- / -"  # the ideal itself has no share of itself
    assert list(rows).index("local_balanced") < list(rows).index("prefix_aware")


def test_step_by_step_speedups_and_distance_to_the_ideal(tmp_path):
    # steps 1-3 (step 0 warms up): local 2.0 / 3.0 / 2.0 s, local_balanced 1.9 / 2.4 / 1.9, prefix_aware 1.95 / 2.5 /
    # 2.1 -> speedups 1.026 / 1.200 / 0.952 (one step slower), 50 / 100 / 200 ms behind the ideal
    write(tmp_path, "local", [record(i, [t, t], [0.5, 0.5]) for i, t in enumerate([9.0, 2.0, 3.0, 2.0])])
    write(tmp_path, "local_balanced", [record(i, [t, t], [0.5, 0.5]) for i, t in enumerate([9.0, 1.9, 2.4, 1.9])])
    write(tmp_path, "prefix_aware", [record(i, [t, t], [0.5, 0.5]) for i, t in enumerate([9.0, 1.95, 2.5, 2.1])])
    _, stdout = table(tmp_path)
    rows = paired(stdout)
    assert set(rows) == {"local_balanced", "prefix_aware"}  # the baseline is not paired with itself
    ours = rows["prefix_aware"]
    # columns: context, config, baseline, steps, speedup min / median / max, steps slower, ms behind the ideal
    assert ours[2] == "local" and ours[3] == "3" and ours[4] == "0.952 / 1.026 / 1.200" and ours[5] == "1"
    assert ours[6] == "50 / 200" and rows["local_balanced"][6] == "-"


def test_the_heading_names_the_window_pattern(tmp_path):
    steps = [record(i, [1.0, 1.0], [0.5, 0.5]) for i in range(2)]
    write(tmp_path, "local", steps, layers=6, summary={"window": 4096, "global_every": 6, "windowed_layers": 5})
    _, text = table(tmp_path)
    assert "6 layers, window 4096, every 6th layer global (5 of 6 windowed); baseline: local" in text
    write(tmp_path, "local", steps, layers=4, summary={"window": 4096, "global_every": None, "windowed_layers": 4})
    assert "4 layers, window 4096, every layer windowed; baseline" in table(tmp_path)[1]
    write(tmp_path, "local", steps, layers=4, summary={"window": -1, "global_every": None, "windowed_layers": 0})
    assert "4 layers; baseline" in table(tmp_path)[1]


def test_the_faster_local_baseline_and_skipped_configurations(tmp_path):
    """torch_varlen faster than local: it is the baseline (speedup, ideal speedup from its own parts); a skipped
    configuration is a row with its reason; an ideal speedup under 1.01 leaves no share to realise."""
    write(tmp_path, "local", [record(i, [2.0, 2.0], [1.0, 0.5]) for i in range(3)])
    write(tmp_path, "torch_varlen", [record(i, [1.6, 1.6], [0.4, 0.4]) for i in range(3)])
    write(tmp_path, "prefix_aware", [record(i, [1.5, 1.5], [0.4, 0.4]) for i in range(3)])
    write(tmp_path, "per_doc_cp", [], skipped="torch_varlen: not here")
    rows, out = table(tmp_path)
    assert "baseline: torch_varlen" in out
    assert rows["torch_varlen"][8] == "1.000" and rows["local"][8] == "0.800"
    assert rows["torch_varlen"][9] == "1.000" and rows["prefix_aware"][10] == "-"   # balanced: nothing to gain
    assert rows["prefix_aware"][8] == "1.067"                                        # 1.6 / 1.5
    assert rows["per_doc_cp"][2] == "skipped: torch_varlen: not here"
    assert rows["prefix_aware"][11] == "-"                                           # per_doc_cp has no steps


def test_profile_table(tmp_path):
    write(tmp_path, "local", [record(i, [1.0, 1.0], [0.2, 0.1]) for i in range(3)])
    for rank, ms in ((0, 10.0), (1, 30.0)):
        (tmp_path / f"train_local_65536_profile_rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "step": 2, "families_ms": {"attention": ms, "gemm": 2 * ms}, "kernels": []}))
    _, out = table(tmp_path)
    assert "| 64K | local | 2 | 2 | 30 | 0 | 0 | 60 | 0 |" in out, out


def test_without_per_doc_cp_the_ratio_is_a_dash(tmp_path):
    write(tmp_path, "local", [record(i, [2.0, 2.0], [1.0, 0.5]) for i in range(3)])
    write(tmp_path, "prefix_aware", [record(i, [1.8, 1.8], [0.8, 0.8]) for i in range(3)])
    rows, _ = table(tmp_path)
    assert rows["local"][11] == "-" and rows["prefix_aware"][11] == "-"
    assert rows["prefix_aware"][8] == "1.111"                    # 2.0 s / 1.8 s


def test_arrival_table(tmp_path):
    """The plan-make table (records with pre_plan_ms, trainer since 2026-11-26): the slowest and fastest rank's
    make, the spread of the ranks' arrival, time outside attention and GC pauses, means over steps 1.."""
    def with_arrival(step, make, pre, gc):
        r = record(step, [1.0, 1.2], [0.4, 0.5])
        r.update(plan_make_ms=make, pre_plan_ms=pre, gc_ms=gc, gc_full_collections=[1, 0])
        return r
    write(tmp_path, "local", [with_arrival(i, [0.0, 0.0], [5.0, 5.0], [0.0, 2.0]) for i in range(3)])
    write(tmp_path, "prefix_aware", [with_arrival(0, [300.0, 290.0], [1.0, 2.0], [9.0, 9.0]),
                                     with_arrival(1, [150.0, 10.0], [3.0, 143.0], [0.0, 120.0]),
                                     with_arrival(2, [50.0, 30.0], [20.0, 40.0], [4.0, 0.0])])
    _, out = table(tmp_path)
    # steps 1-2: make max (150 + 50) / 2, min (10 + 30) / 2, spread (140 + 20) / 2, outside 1.2 - 0.5 s,
    # GC max (120 + 4) / 2, full collections 1 + 1
    assert "| 64K | prefix_aware | 100.0 | 20.0 | 80.0 | 700 | 62.0 | 2 |" in out, out
    assert "| 64K | local | - | - | - | 700 | 2.0 | 2 |" in out, out


def test_exchange_table_leaves_out_the_attention_share_of_enqueue_only_times(tmp_path):
    """CAD's exchanges table: comm and stall ms per step (largest rank, steps 1..) and the stall's share of the
    step; its share of attention only where attention was timed with CUDA waits (else the times are enqueue
    times, --sync-attention-timing off)."""
    def with_exchange(step):
        r = record(step, [2.0, 2.0], [0.2, 0.25])
        r.update(exchange_comm_ms=[50.0, 40.0], exchange_stall_ms=[100.0, 80.0])
        return r
    write(tmp_path, "local", [record(i, [2.5, 2.5], [0.4, 0.5]) for i in range(3)])
    write(tmp_path, "prefix_aware", [with_exchange(i) for i in range(3)])
    _, out = table(tmp_path)
    assert "| 64K | prefix_aware | 50.0 | 100.0 | 5.0% | 0% | 40.0% |" in out, out  # waited for whole: none hidden
    write(tmp_path, "prefix_aware", [with_exchange(i) for i in range(3)],
          timing="enqueue only (--sync-attention-timing off)")
    _, out = table(tmp_path)
    assert "| 64K | prefix_aware | 50.0 | 100.0 | 5.0% | 0% | - |" in out, out
    # Head groups: exchanges joined after the work beside them, 20 of 50 ms still waited for: 60% hidden.
    def grouped(step):
        r = with_exchange(step)
        r.update(exchange_stall_ms=[20.0, 10.0])
        return r
    write(tmp_path, "prefix_aware", [grouped(i) for i in range(3)])
    _, out = table(tmp_path)
    assert "| 64K | prefix_aware | 50.0 | 20.0 | 1.0% | 60% | 8.0% |" in out, out


def test_call_table_gives_the_measured_server_balance(tmp_path):
    """CAD's calls table: the ranks' server compute per step (slowest / fastest), its measured max/mean beside the
    plan's, the slowest rank's compute above the mean, and the calls' time beyond their compute (largest rank)."""
    def with_calls(step):
        r = record(step, [2.0, 2.0], [0.2, 0.25])
        r.update(call_forward_ms=[150.0, 140.0], call_forward_server_ms=[110.0, 90.0],
                 call_backward_ms=[260.0, 250.0], call_backward_server_ms=[220.0, 200.0])
        return r
    write(tmp_path, "local", [record(i, [2.5, 2.5], [0.4, 0.5]) for i in range(3)])
    write(tmp_path, "prefix_aware", [with_calls(i) for i in range(3)])
    _, out = table(tmp_path)
    # Server totals 330 and 290 ms: max/mean 330 / 310; 20 ms above the mean; beyond compute 410 - 330 = 80 (rank
    # 0), 390 - 290 = 100 (rank 1). The plan predicted 1.5 (record()'s imbalance).
    # Forward alone 110 / 100, backward alone 220 / 210.
    assert "| 64K | prefix_aware | 110.0 / 90.0 | 220.0 / 200.0 | 1.065 | 1.100 / 1.048 | 1.500 | 20.0 | 100.0 |" \
        in out, out
    write(tmp_path, "prefix_aware", [record(i, [2.0, 2.0], [0.2, 0.25]) for i in range(3)])  # no call times
    _, out = table(tmp_path)
    assert "server fwd ms" not in out, out


def test_ideal_counts_the_imbalance_of_every_micro_batch(tmp_path):
    # Two micro-batches, a different rank slow in each: per step the sums are even (1.2 / 1.2), but each micro-
    # batch waits for its slow rank: 1.0 - 0.6 and 1.0 - 0.6 -> the ideal step is 3.0 - 0.8 = 2.2 s.
    steps = []
    for i in range(3):
        r = record(i, [3.0, 3.0], [1.2, 1.2])
        r["attention_s_by_micro_batch"] = [[1.0, 0.2], [0.2, 1.0]]
        steps.append(r)
    write(tmp_path, "local", steps)
    write(tmp_path, "prefix_aware", [record(i, [2.4, 2.4], [0.6, 0.6]) for i in range(3)])
    rows, _ = table(tmp_path)
    assert rows["local"][9] == "1.364"                            # 3.0 / 2.2 (one term per step would give 1.000)
    assert rows["prefix_aware"][8] == "1.250" and rows["prefix_aware"][10] == "0.69"  # 0.25 / 0.364


def test_trace_overlap_counts_streams_overlap_and_host_waits(tmp_path):
    from script_module import load_script
    tool = load_script(REPO / "bench" / "cad" / "trace_overlap.py")

    def kernel(stream, ts, dur, name="gemm"):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}
    # stream 7: 0-2000 us and 1500-3000 us (union 3 ms); stream 9: NCCL 2500-4000 us; idle 4000-5000; 5000-6000
    events = [kernel(7, 0, 2000), kernel(7, 1500, 1500), kernel(9, 2500, 1500, "ncclDevKernel_SendRecv"),
              kernel(7, 5000, 1000),
              {"ph": "X", "cat": "cpu_op", "name": "aten::item", "ts": 0, "dur": 1000, "tid": 1},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 10, "dur": 500, "tid": 1},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 10, "dur": 500}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    r = tool.analyse(path)
    assert r["span_ms"] == 6.0 and r["gpu_busy_ms"] == 5.0 and r["gpu_idle_ms"] == 1.0
    assert r["streams"]["7"]["busy_ms"] == 4.0 and r["streams"]["9"]["nccl_ms"] == 1.5
    assert r["overlaps"] == [{"streams": [7, 9], "overlap_ms": 0.5}]
    assert r["host_waits"] == {"cudaStreamSynchronize": {"calls": 1, "ms": 0.5}}
    assert r["host_wait_callers"] == [{"call": "cudaStreamSynchronize", "inside": "aten::item", "calls": 1, "ms": 0.5}]
    assert r["nccl_job_thread_launches"] == {"launches": 0}  # no thread here launches NCCL kernels only
    # A job thread (tid 2) launching an NCCL kernel 2 ms after the caller's (tid 1) last CUDA call at 1000-1010 us.
    events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1000, "dur": 10, "tid": 1,
                "args": {"correlation": 1}},
               {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernelEx", "ts": 3010, "dur": 30, "tid": 2,
                "args": {"correlation": 2}},
               dict(kernel(9, 3050, 10, "ncclDevKernel_SendRecv"), args={"stream": 9, "correlation": 2}),
               dict(kernel(7, 1020, 10), args={"stream": 7, "correlation": 1})]
    path.write_text(json.dumps({"traceEvents": events}))
    launches = tool.analyse(path)["nccl_job_thread_launches"]
    assert launches["launches"] == 1 and abs(launches["median_ms"] - 2.0) < 1e-9


# ---- integrations/torchtitan/bench_table.py (TorchTitan's trainer on GPUs) --------------------------------------
TITAN_TABLE = REPO / "integrations" / "torchtitan" / "bench_table.py"


def titan_run(tmp, config, model, step_s, dataset="pretrain_synthetic", waits=None):
    steps = [{"step": i + 1, "step_s": s, "loss": 10.0 - 0.01 * i, "attention_calls": 16, "peak_gib": 20.0}
             for i, s in enumerate(step_s)]
    for r, w in zip(steps, waits or []):
        r["plan_wait_ms"] = w
    (tmp / f"{config}.json").write_text(json.dumps({"model": model, "flavor": "8B", "dataset": dataset, "world": 2,
                                                    "layers": 8, "seq_len": 65536, "steps": steps}))


def titan_rows(tmp):
    out = subprocess.run([sys.executable, str(TITAN_TABLE), str(tmp)], capture_output=True, text=True, check=True)
    head, _, body = out.stdout.partition("|---")
    return head, {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
                  for line in body.splitlines()[1:] if line.startswith("|")}


def test_titan_bench_table(tmp_path):
    # steps 1-2 warm up and are left out; local is the fastest configuration without plans (torch_varlen slower)
    titan_run(tmp_path, "cad", "llama3_cad", [9, 9, 2.0, 2.2, 2.0, 2.2], waits=[50, 40, 0, 0, 1.0, 3.0])
    titan_run(tmp_path, "local", "llama3_cad_local", [9, 9, 2.2, 2.4, 2.2, 2.4])
    titan_run(tmp_path, "local_balanced", "llama3_cad_local", [9, 9, 1.9, 2.1, 1.9, 2.1],
              dataset="pretrain_synthetic_balanced")
    titan_run(tmp_path, "torch_varlen", "llama3_torch_varlen", [9, 9, 2.5, 2.6, 2.5, 2.6])
    head, rows = titan_rows(tmp_path)
    assert "baseline: local" in head and "ideal (local / local_balanced): 1.150" in head and "steps 3-6" in head
    # columns: model, step s, tokens/s (K), peak, speedup, per-step min-max, share, calls, plan wait, loss
    assert rows["cad"][1] == "2.100" and rows["cad"][4] == "1.095" and rows["cad"][5] == "1.091-1.100"
    assert rows["cad"][6] == "0.63" and rows["cad"][8] == "1.0"  # (1.095 - 1) / (1.150 - 1); wait over steps 3-6
    assert rows["local_balanced"][0].endswith("(balanced rows)") and rows["local_balanced"][6] == "-"
    assert rows["torch_varlen"][4] == "0.902" and rows["local"][8] == "-"
    # no measured ideal: no share; nothing to read: a message and exit 1
    (tmp_path / "local_balanced.json").unlink()
    head, rows = titan_rows(tmp_path)
    assert "ideal (local / local_balanced): -" in head and rows["cad"][6] == "-"
    empty = tmp_path / "empty"
    empty.mkdir()
    out = subprocess.run([sys.executable, str(TITAN_TABLE), str(empty)], capture_output=True, text=True)
    assert out.returncode == 1 and "no <config>.json" in out.stderr


def test_several_folders_give_one_table_pooled_over_the_runs(tmp_path):
    # Two runs of local / local_balanced / prefix_aware (steps 1-2 counted; step 0 warms up), a third with
    # prefix_aware only. Run a: local 2.5, ideal 2.0, ours 2.1 -> share (2.5/2.1 - 1) / (2.5/2.0 - 1) = 0.76;
    # run b: 2.7, 2.2, 2.2 -> 1.00. Pooled means 2.6, 2.1, 2.15: speedup 1.209, ideal 1.238, share 0.88.
    runs = {"a": (2.5, 2.0, 2.1), "b": (2.7, 2.2, 2.2)}
    for folder, (local, ideal, ours) in runs.items():
        (tmp_path / folder).mkdir()
        for name, t in (("local", local), ("local_balanced", ideal), ("prefix_aware", ours)):
            write(tmp_path / folder, name, [record(i, [x, x], [0.5, 0.5]) for i, x in enumerate([9.0, t, t])])
    (tmp_path / "c").mkdir()
    write(tmp_path / "c", "prefix_aware", [record(i, [x, x], [0.5, 0.5]) for i, x in enumerate([9.0, 2.3, 2.3])])
    done = subprocess.run([sys.executable, str(TABLE), str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Pooled over 3 runs" in done.stdout
    rows = {c[1]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in done.stdout.splitlines()
                              if line.startswith("| 64K"))}
    # columns: context, config, runs, step mean (min / max), speedup, measured ideal, pooled share, share per run
    ours = rows["prefix_aware"]
    assert ours[2] == "3" and ours[3] == "2200 (2100 / 2300)"   # every run that trained it
    assert ours[4] == "1.209" and ours[5] == "1.238" and ours[6] == "0.88"  # the runs with a baseline and ideal
    assert ours[7] == "0.76 1.00 -"
    assert rows["local"][6] == "0.00" and rows["local_balanced"][6] == "-"
    # A folder without records is named.
    (tmp_path / "empty").mkdir()
    done = subprocess.run([sys.executable, str(TABLE), str(tmp_path / "a"), str(tmp_path / "empty")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "empty" in done.stderr
