#!/usr/bin/env python3
"""diet_bench.py's parsing, measurement loop, summary, targets and table, driven by a fake timer whose
rates are known, so every ratio the summary reports can be checked exactly (no GPU, no torch).
usage: test_diet_bench.py BENCH_KERNELS_DIR DIET_FILE"""
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import unittest

BENCH_DIR, DIET_FILE = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else (None, None)
sys.path.insert(0, BENCH_DIR or os.path.join(os.path.dirname(__file__), "..", "..", "bench", "kernels"))
import diet_bench  # noqa: E402

HQ = 32


class FakeTimer:
    """cuDNN at `cudnn` TFLOP/s (per round: fwd, bwd), ours at `ours[name]` TFLOP/s (fwd, bwd)."""

    def __init__(self, cudnn_per_round, ours, skip, num_head_dims):
        self.cudnn_per_round, self.ours_rates, self.skip = cudnn_per_round, ours, set(skip)
        self.per_round = len(diet_bench.DENSE) * num_head_dims  # cuDNN calls in one round
        self.cudnn_calls, self.calls = 0, []

    def cudnn_dense(self, n, d):
        fwd, bwd = self.cudnn_per_round[self.cudnn_calls // self.per_round]
        self.cudnn_calls += 1
        if fwd is None:
            raise RuntimeError("no cuDNN engine")
        fl = diet_bench.dense_flops(n, d, HQ)
        self.calls.append(("cudnn", n, d))
        return fl / fwd / 1e9, 2.5 * fl / bwd / 1e9, "gqa"

    def release(self):
        self.calls.append(("release",))

    def ours(self, batch, d, warmups, reps):
        self.calls.append(("ours", batch["name"], d, warmups, reps))
        if batch["name"] in self.skip:
            raise diet_bench.SkipCase("needs 200 GiB")
        fwd, bwd = self.ours_rates[batch["name"]]
        fl = diet_bench.forward_flops(batch["segments"], d, HQ)
        return fl / fwd / 1e9, 2.5 * fl / bwd / 1e9


def batch(name, segments):
    tq = sum(s[1] for s in segments)
    tk = max(s[2] + s[3] for s in segments)
    return {"name": name, "tq": tq, "tk": tk, "segments": segments}


BATCHES = [batch("a", [(0, 100, 0, 100)]), batch("b", [(0, 50, 0, 200), (50, 10, 200, 10)]),
           batch("c", [(0, 64, 0, 64)]), batch("d", [(0, 8, 0, 8)]), batch("e", [(0, 9, 0, 9)]),
           batch("f", [(0, 7, 0, 70)])]


def fake(cudnn_per_round, skip=(), num_head_dims=2):
    ours = {"dense_causal_4k": (600, 500), "dense_causal_16k": (600, 450), "dense_causal_64k": (600, 400),
            "a": (570, 500), "b": (600, 450), "c": (660, 400), "d": (300, 250), "e": (540, 480), "f": (480, 360)}
    return FakeTimer(cudnn_per_round, ours, skip, num_head_dims)


class ParseTest(unittest.TestCase):
    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.remove, f.name)
        return f.name

    @unittest.skipUnless(DIET_FILE, "needs the committed diet file as argument")
    def test_committed_file(self):
        batches = diet_bench.parse_batches(DIET_FILE)
        with open(DIET_FILE) as f:
            data_lines = [line for line in f if line.strip() and not line.startswith("#")]
        self.assertEqual(len(batches), len(data_lines))
        self.assertGreaterEqual(len(batches), 40)
        for b in batches:
            # CAD's layout: query rows in segment order without gaps.
            self.assertEqual([s[0] for s in b["segments"]],
                             [sum(s[1] for s in b["segments"][:i]) for i in range(len(b["segments"]))])
            self.assertEqual(sum(s[1] for s in b["segments"]), b["tq"])

    def test_good_file(self):
        path = self.write("# c\n\nx 7 12 2 0,3,0,5 3,4,5,7\n")
        self.assertEqual(diet_bench.parse_batches(path),
                         [{"name": "x", "tq": 7, "tk": 12, "segments": [(0, 3, 0, 5), (3, 4, 5, 7)]}])

    def test_errors_name_the_line(self):
        cases = {"x 7 12\n": ":1: expected NAME TQ TK NSEG",
                 "# c\nx 7 12 2 0,3,0,5\n": ":2 (x): NSEG says 2 segments, the line has 1",
                 "x 7 12 1 0,3,0\n": ":1 (x) segment 0: expected q_offset",
                 "x -7 12 0\n": ":1 (x): TQ, TK and NSEG must be >= 0",
                 "x 7 12 1 0,3,0,q\n": ":1 (x): expected integers",
                 "x 7 12 1 5,3,0,5\n": ":1 (x) segment 0: (5, 3, 0, 5) is not a causal segment",
                 "x 7 12 1 0,6,0,5\n": "(0, 6, 0, 5) is not a causal segment",
                 "x 1 1 1 0,1,0,1\nx 1 1 1 0,1,0,1\n": "batch names are not unique"}
        for text, message in cases.items():
            path = self.write(text)
            with self.assertRaises(diet_bench.DietFileError) as e:
                diet_bench.parse_batches(path)
            self.assertIn(message, str(e.exception))
            self.assertIn(path, str(e.exception))


class SummaryTest(unittest.TestCase):
    def run_fake(self, cudnn_per_round, skip=(), head_dims=(64, 128)):
        t = fake(cudnn_per_round, skip, len(head_dims))
        rounds = diet_bench.run_rounds(BATCHES, list(head_dims), len(cudnn_per_round), t, HQ, reps=3, warmups=1,
                                       log=lambda m: None)
        return t, rounds, diet_bench.summarize(BATCHES, rounds)

    def test_order_cudnn_first_then_ours_each_round(self):
        t, rounds, _ = self.run_fake([(600, 500)], head_dims=(128,))
        kinds = [c[0] for c in t.calls]
        self.assertEqual(kinds, ["cudnn"] * 3 + ["release"] + ["ours"] * (3 + len(BATCHES)))
        # Dense: 2 warm-ups, 10 repeats (5 at 64K); diet: the given warm-ups and repeats.
        self.assertEqual([c[3:] for c in t.calls if c[0] == "ours"][:4], [(2, 10), (2, 10), (2, 5), (1, 3)])

    def test_ratios_against_the_same_rounds_dense_16k(self):
        # Round 2's cuDNN is faster: the same kernel times give lower ratios in that round.
        _, rounds, s = self.run_fake([(600, 500), (660, 550)])
        self.assertEqual(len(rounds), 2)
        for d in ("64", "128"):
            fwd = s["head_dims"][d]["diet"]["fwd"]
            self.assertEqual(fwd["reference_tflops_per_round"], [600, 660])
            r1, r2 = fwd["per_round"]
            self.assertAlmostEqual(r1["min"], 300 / 600)
            self.assertAlmostEqual(r1["max"], 660 / 600)
            self.assertAlmostEqual(r1["median"], (540 / 600 + 570 / 600) / 2)
            self.assertAlmostEqual(r2["max"], 660 / 660)
            # Each batch's median over the two rounds, then min / median / max over batches.
            a = (570 / 600 + 570 / 660) / 2
            self.assertAlmostEqual(fwd["per_batch_median"]["a"], a)
            self.assertAlmostEqual(fwd["batches"]["min"], (300 / 600 + 300 / 660) / 2)
            bwd = s["head_dims"][d]["diet"]["bwd"]
            self.assertEqual([w["name"] for w in bwd["worst"]], ["d", "f", "c", "b", "e"])
            self.assertEqual(bwd["worst"][1]["max_kv"], 70)
            self.assertEqual(bwd["worst"][1]["segments"], 1)
            # Dense: ours / cuDNN at the same size, per round.
            dense16 = s["head_dims"][d]["dense"]["16384"]
            self.assertEqual(len(dense16["fwd"]["per_round"]), 2)
            self.assertAlmostEqual(dense16["fwd"]["per_round"][0], 1.0)
            self.assertAlmostEqual(dense16["bwd"]["per_round"][1], 450 / 550)

    def test_targets(self):
        _, _, s = self.run_fake([(600, 500)], head_dims=(128,))
        by = {t["what"]: t for t in s["targets"]}
        self.assertTrue(by["D=128 dense 4K fwd vs cuDNN (median of rounds)"]["met"])     # 1.00 >= 1.0
        self.assertTrue(by["D=128 dense 4K bwd vs cuDNN (median of rounds)"]["met"])     # 1.00 >= 0.95
        self.assertFalse(by["D=128 dense 64K bwd vs cuDNN (median of rounds)"]["met"])   # 0.80
        median_fwd = by["D=128 diet fwd median vs cuDNN dense 16K"]
        self.assertAlmostEqual(median_fwd["value"], (540 / 600 + 570 / 600) / 2)
        self.assertFalse(median_fwd["met"])  # 0.925 < 0.95
        self.assertFalse(by["D=128 diet fwd minimum vs cuDNN dense 16K"]["met"])  # 0.50 < 0.85
        self.assertEqual(len(s["targets"]), 3 * 2 + 4)

    def test_skipped_batches_are_listed_not_counted(self):
        _, rounds, s = self.run_fake([(600, 500)], skip=("d",), head_dims=(128,))
        self.assertEqual(rounds[0]["head_dims"]["128"]["diet"]["d"], {"skipped": "needs 200 GiB"})
        h = s["head_dims"]["128"]
        self.assertEqual(h["skipped"], ["d"])
        self.assertEqual(h["measured_batches"], len(BATCHES) - 1)
        self.assertAlmostEqual(h["diet"]["fwd"]["batches"]["min"], 480 / 600)

    def test_a_failed_cudnn_round_gives_no_ratios_and_the_run_goes_on(self):
        _, rounds, s = self.run_fake([(None, None), (600, 500)], head_dims=(128,))
        self.assertEqual(len(rounds), 2)
        self.assertEqual(rounds[0]["head_dims"]["128"]["cudnn_dense"]["16384"]["note"], "failed: no cuDNN engine")
        fwd = s["head_dims"]["128"]["diet"]["fwd"]
        self.assertIsNone(fwd["per_round"][0])
        self.assertAlmostEqual(fwd["per_round"][1]["min"], 300 / 600)
        self.assertAlmostEqual(fwd["per_batch_median"]["a"], 570 / 600)  # from round 2 alone
        self.assertEqual(len(s["head_dims"]["128"]["dense"]["4096"]["fwd"]["per_round"]), 1)
        diet_bench.render_markdown(s, {})

    def test_deadline_stops_before_a_round_that_would_pass_it(self):
        now = [0.0]

        def clock():
            now[0] += 25.0  # every call advances the fake clock
            return now[0]
        t = fake([(600, 500)] * 5, num_head_dims=1)
        rounds = diet_bench.run_rounds(BATCHES, [64], 5, t, HQ, 3, 1, deadline_s=60, clock=clock,
                                       log=lambda m: None)
        self.assertEqual(len(rounds), 1)
        rounds = diet_bench.run_rounds(BATCHES, [64], 3, fake([(600, 500)] * 3, num_head_dims=1), HQ, 3, 1,
                                       deadline_s=None, clock=clock, log=lambda m: None)
        self.assertEqual(len(rounds), 3)

    def test_table_and_json(self):
        _, rounds, s = self.run_fake([(600, 500), (600, 500)])
        json.dumps({"rounds": rounds, "summary": s})  # what --json writes must serialise
        text = diet_bench.render_markdown(s, {"gpu": "FakeGPU", "hq": 32, "hkv": 8, "batches_file": "x.txt",
                                              "num_batches": len(BATCHES), "reps": 3, "warmups": 1,
                                              "command": "diet_bench.py"})
        self.assertIn("GPU: FakeGPU; Hq=32 Hkv=8", text)
        self.assertIn("| 128 | 64K | 1.00 1.00 | 1.00 / 1.00 / 1.00 | 0.80 0.80 | 0.80 / 0.80 / 0.80 | "
                      "600 / 600; 400 / 500 |", text)
        self.assertIn("| 64 | bwd | 500 500 | 0.50 / 0.85 / 1.00; 0.50 / 0.85 / 1.00 | 0.50 / 0.85 / 1.00 |", text)
        self.assertIn("| 64 | fwd | d | 0.50 | 1 | 8 | 8 | 8 / 8 |", text)
        met = sum(t["met"] for t in s["targets"])
        self.assertIn(f"Targets: {met} of {len(s['targets'])} met", text)
        self.assertIn("- NOT met: D=64 diet bwd minimum vs cuDNN dense 16K: 0.50 (goal >= 0.85)", text)

    def test_estimate(self):
        one = [batch("x", [(0, 1000, 0, 1000)])]
        diet = diet_bench.forward_flops(one[0]["segments"], 128, HQ) * (3 + 1) * 3.5
        dense = sum(diet_bench.dense_flops(n, 128, HQ) * (2 + (5 if n >= 65536 else 10)) for n in diet_bench.DENSE)
        expected = 2 * (diet + 8 * dense) / 450e12
        self.assertAlmostEqual(diet_bench.estimate_seconds(one, [128], HQ, 2, 3, 1), expected)


class MainTest(unittest.TestCase):
    def test_main_writes_json_and_table(self):
        class Timer(FakeTimer):
            def __init__(self, lib, hq, hkv):
                super().__init__([(600, 500)] * 2, {n: (500, 400) for n in ["dense_causal_4k", "dense_causal_16k",
                                                                           "dense_causal_64k", "x", "y"]}, (), 1)
                self.device = f"Fake ({lib})"

            def software(self):
                return "fake"
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        path = os.path.join(tmp, "d.txt")
        with open(path, "w") as f:
            f.write("# c\nx 7 12 2 0,3,0,5 3,4,5,7\ny 3 3 1 0,3,0,3\n")
        saved, diet_bench.LibraryTimer = diet_bench.LibraryTimer, Timer
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                rc = diet_bench.main(["--lib", "lib.so", "--batches", path, "--rounds", "2", "--head-dims", "128",
                                      "--filter", "x", "--json", os.path.join(tmp, "o.json"),
                                      "--md", os.path.join(tmp, "o.md")])
        finally:
            diet_bench.LibraryTimer = saved
        self.assertIn("1 diet batches, head dims [128], 2 rounds: about", printed.getvalue())
        self.assertEqual(rc, 0)
        with open(os.path.join(tmp, "o.json")) as f:
            out = json.load(f)
        self.assertEqual(len(out["rounds"]), 2)
        self.assertEqual(list(out["rounds"][1]["head_dims"]["128"]["diet"]), ["x"])  # --filter
        self.assertEqual(out["meta"]["gpu"], "Fake (lib.so)")
        self.assertAlmostEqual(out["summary"]["head_dims"]["128"]["diet"]["bwd"]["batches"]["median"], 400 / 500)
        with open(os.path.join(tmp, "o.md")) as f:
            self.assertIn("| 128 | fwd | x | 0.83 | 2 | 4 | 7 | 7 / 12 |", f.read())


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]])
