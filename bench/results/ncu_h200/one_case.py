# One call of each case (1 warm-up, 1 timed), for ncu: python3 bench/results/ncu_h200/one_case.py LIB D [BWD 0/1] CASE...
# (run from the repository root; CASE: a diet batch name or a dense length)
import ctypes, sys
sys.path.insert(0, "bench/kernels")
import diet_bench
lib = diet_bench.KernelLibrary(sys.argv[1], 32, 8)
d = int(sys.argv[2]); bwd = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] in ("0", "1") else 0
names = sys.argv[4:] if len(sys.argv) > 3 and sys.argv[3] in ("0", "1") else sys.argv[3:]
batches = {b["name"]: b for b in diet_bench.parse_batches("bench/kernels/diet_batches.txt")}
for name in names:
    b = batches[name] if name in batches else diet_bench.dense_case(int(name))
    segs = b["segments"]
    flat = (ctypes.c_int64 * (4 * len(segs)))(*[x for s in segs for x in s])
    out = (ctypes.c_double * 2)(); err = ctypes.create_string_buffer(2048)
    rc = lib.lib.cad_kernel_time_case(flat, len(segs), b["tq"], b["tk"], 1, d, 32, 8, 1, 1, bwd, out, err, 2048)
    fl = diet_bench.forward_flops(segs, d, 32)
    print(f"{b['name']} D={d}: rc {rc} fwd {out[0]:.3f} ms {fl/out[0]/1e9:.0f} TFLOP/s bwd {out[1]:.3f} ms {2.5*fl/max(out[1],1e-9)/1e9:.0f} TFLOP/s {err.value.decode()}", flush=True)
