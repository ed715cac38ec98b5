"""tests/multi_gpu/trace_calls.py on hand-made timelines: which kernels make up a CAD call, the time it adds
beyond its attention (before, after, copies), the compute stream's gaps, gzip input, and clear errors."""
import gzip
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOL = REPO / "tests" / "multi_gpu" / "trace_calls.py"
sys.path.insert(0, str(TOOL.parent))
import trace_calls  # noqa: E402


def kernel(name, start_ms, end_ms, stream=7, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": start_ms * 1e3, "dur": (end_ms - start_ms) * 1e3,
            "args": {"stream": stream}}


FWD = "void cad::kernels::detail::attention_fwd_sm90_kernel<128, 3, false>(...)"
BWD = "void cad::kernels::detail::attention_bwd_sm90_ws_kernel<128, 2, false>(...)"
PACK = "void cad::kernels::(anonymous namespace)::copy_row_ranges_kernel<uint4>(...)"
GEMM = "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT"


def timeline():
    return {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5},  # host events are ignored
        kernel(GEMM, 0, 10),
        kernel(PACK, 10.5, 11.0),               # a forward call: pack, wait, attention, wait, unpack
        kernel(FWD, 12, 20),
        kernel(PACK, 20.5, 21.0),
        kernel(GEMM, 22, 30),
        kernel("bwd_preprocess_kernel", 30, 31),  # a backward call: two attention kernels, nothing around
        kernel(BWD, 31, 41),
        kernel("Memcpy DtoD (Device -> Device)", 41.5, 42.0, cat="gpu_memcpy"),
        kernel(GEMM, 43, 50),
        kernel("ncclDevKernel_AllGather", 0, 45, stream=27),  # another stream: less kernel time than stream 7
    ]}


def test_calls_and_their_time_beyond_attention(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(timeline()))
    a = trace_calls.analyse(trace_calls.load(path))
    assert a["stream"] == 7
    assert abs(a["span_ms"] - 50.0) < 1e-9
    assert abs(a["gaps_ms"] - (0.5 + 1.0 + 0.5 + 1.0 + 0.5 + 1.0)) < 1e-9
    fwd, bwd = a["calls"]
    assert fwd["kind"] == "forward" and bwd["kind"] == "backward"
    assert abs(fwd["attention_ms"] - 8.0) < 1e-9
    assert abs(fwd["before_ms"] - 2.0) < 1e-9  # from the GEMM's end (10) to the attention (12)
    assert abs(fwd["after_ms"] - 2.0) < 1e-9   # from the attention's end (20) to the next GEMM (22)
    assert abs(fwd["copies_ms"] - 1.0) < 1e-9
    assert abs(fwd["beyond_ms"] - 4.0) < 1e-9
    assert abs(bwd["attention_ms"] - 11.0) < 1e-9  # preprocess and the backward kernel: one call
    assert abs(bwd["before_ms"]) < 1e-9 and abs(bwd["after_ms"] - 2.0) < 1e-9
    assert abs(bwd["copies_ms"] - 0.5) < 1e-9
    assert abs(a["families_ms"]["gemm"] - 25.0) < 1e-9


def test_command_line_reads_gzip_and_prints_the_totals(tmp_path):
    path = tmp_path / "train_x_65536_trace_rank0.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(timeline(), f)
    done = subprocess.run([sys.executable, str(TOOL), str(path), "--calls"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 2 | all |")]
    assert rows == ["| 2 | all | 19.0 | 2.0 | 4.0 | 1.5 | 6.0 |"], done.stdout
    assert "| 0 | forward | 8.00 | 2.00 | 2.00 | 1.00 | 0.00 |" in done.stdout


def test_errors_name_the_file_and_what_was_expected(tmp_path, capsys):
    # The tool's main (its exit status: the command line's, as test_command_line_reads_gzip_and_prints_the_totals
    # runs it), in this process: each interpreter of the tool imports torch (cad.train.profiling), seconds each.
    missing = tmp_path / "nope.json"
    assert trace_calls.main([str(missing)]) == 1
    err = capsys.readouterr().err
    assert str(missing) in err and "no such file" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"events": []}))
    assert trace_calls.main([str(bad)]) == 1
    err = capsys.readouterr().err
    assert "traceEvents" in err and str(bad) in err
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 0, "dur": 1}]}))
    assert trace_calls.main([str(empty)]) == 1
    assert "no GPU kernels" in capsys.readouterr().err

