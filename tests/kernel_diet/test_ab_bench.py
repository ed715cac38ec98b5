#!/usr/bin/env python3
"""ab_bench.py's loop, summary and table with fake libraries whose rates are known, so every ratio it
reports can be checked exactly (no GPU); and its command-line refusals.
usage: test_ab_bench.py BENCH_KERNELS_DIR"""
import contextlib
import io
import os
import sys
import unittest

BENCH_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "bench", "kernels")
sys.path.insert(0, BENCH_DIR)
import ab_bench  # noqa: E402
import diet_bench  # noqa: E402

HQ = 32


class FakeLibrary:
    """Runs every case at rates[case] = (fwd, bwd) TFLOP/s times `factor`; records the call order."""

    def __init__(self, name, rates, factor, calls, skip=()):
        self.name, self.rates, self.factor, self.calls, self.skip = name, rates, factor, calls, set(skip)

    def ours(self, case, d, warmups, reps):
        self.calls.append((self.name, case["name"], d, warmups, reps))
        if case["name"] in self.skip:
            raise diet_bench.SkipCase("does not fit")
        fl = diet_bench.forward_flops(case["segments"], d, HQ)
        fwd, bwd = self.rates[case["name"]]
        return fl / (fwd * self.factor) / 1e9, 2.5 * fl / (bwd * self.factor) / 1e9


CASES = [diet_bench.dense_case(4096),
         {"name": "b1", "tq": 256, "tk": 1024, "segments": [(0, 256, 0, 1024)]},
         {"name": "b2", "tq": 512, "tk": 512, "segments": [(0, 200, 0, 300), (200, 312, 300, 212)]}]
RATES = {"dense_causal_4k": (500.0, 400.0), "b1": (300.0, 200.0), "b2": (450.0, 350.0)}


class AbBench(unittest.TestCase):
    def run_fake(self, factors, rounds=2, skip_new=()):
        calls = []
        timers = [(n, FakeLibrary(n, RATES, f, calls, skip_new if n == "new" else ())) for n, f in factors]
        result = ab_bench.run_ab(CASES, [64, 128], rounds, timers, HQ, reps=3, warmups=1, log=lambda m: None)
        return result, calls

    def test_rates_ratios_and_the_order_rotating_by_round(self):
        result, calls = self.run_fake([("base", 1.0), ("new", 1.1)])
        # Round 1 runs base first, round 2 new first, for every case.
        self.assertEqual([c[0] for c in calls[:2]], ["base", "new"])
        self.assertEqual([c[0] for c in calls[12:14]], ["new", "base"])
        # Dense cases use the dense repeats, diet batches the given ones.
        self.assertEqual(calls[0][3:], (2, 10))
        self.assertEqual(calls[2][3:], (1, 3))
        s = ab_bench.summarize(result, ["base", "new"])
        row = s["cases"]["128"]["b1"]
        self.assertAlmostEqual(row["base_fwd"], 300.0, places=6)
        self.assertAlmostEqual(row["new_bwd"], 220.0, places=6)
        self.assertEqual(len(row["new_fwd_ratios"]), 2)
        self.assertAlmostEqual(row["new_fwd_ratio"], 1.1, places=9)
        sp = s["diet_spread"]["64/new/bwd"]
        self.assertAlmostEqual(sp["min"], 1.1, places=9)
        self.assertAlmostEqual(sp["max"], 1.1, places=9)
        text = ab_bench.render_markdown(s, ["base", "new"], {"gpu": "fake", "libs": {"base": "a", "new": "b"}})
        self.assertIn("| b1 | 300 | 330 | 200 | 220 | 1.100 1.100; 1.100 | 1.100 1.100; 1.100 |", text)
        self.assertIn("- 128/new/fwd: 1.100 / 1.100 / 1.100", text)

    def test_a_skipped_case_has_no_ratio_and_leaves_the_spread_to_the_others(self):
        result, _ = self.run_fake([("base", 1.0), ("new", 0.5)], skip_new=("b2",))
        s = ab_bench.summarize(result, ["base", "new"])
        self.assertIsNone(s["cases"]["64"]["b2"]["new_fwd_ratio"])
        self.assertIsNone(s["cases"]["64"]["b2"]["new_fwd"])
        sp = s["diet_spread"]["64/new/fwd"]
        self.assertAlmostEqual(sp["median"], 0.5, places=9)
        self.assertIn("| b2 | 450 | - |", ab_bench.render_markdown(s, ["base", "new"], {}))

    def test_three_libraries_each_against_the_first(self):
        result, calls = self.run_fake([("a", 1.0), ("b", 2.0), ("c", 0.8)], rounds=3)
        self.assertEqual([c[0] for c in calls[:3]], ["a", "b", "c"])
        self.assertEqual([c[0] for c in calls[18:21]], ["b", "c", "a"])
        s = ab_bench.summarize(result, ["a", "b", "c"])
        self.assertAlmostEqual(s["cases"]["64"]["dense_causal_4k"]["b_fwd_ratio"], 2.0, places=9)
        self.assertAlmostEqual(s["diet_spread"]["128/c/bwd"]["median"], 0.8, places=9)

    def test_deadline_stops_before_a_round_that_would_pass_it(self):
        # Every call takes one second of a fake clock: a round of 3 cases x 2 libraries takes 6 s, so with
        # a 15 s deadline rounds 1 and 2 run (ending at 6 and 12 s) and round 3 (12 + 6 > 15) does not.
        calls, saved = [], []
        timers = [(n, FakeLibrary(n, RATES, 1.0, calls)) for n in ("a", "b")]
        result = ab_bench.run_ab(CASES, [64], 5, timers, HQ, 3, 1, deadline_s=15, clock=lambda: float(len(calls)),
                                 log=lambda m: None, on_round=lambda r: saved.append(len(r["rounds"])))
        self.assertEqual(len(result["rounds"]), 2)
        self.assertEqual(saved, [1, 2])  # what a run cut short keeps

    def test_command_line_refusals(self):
        for argv, expected in ((["--lib", "only=/x.so"], "two or more"),
                               (["--lib", "a=/x.so", "--lib", "noequals"], "expected NAME=PATH"),
                               (["--lib", "a=/nonexistent/a.so", "--lib", "b=/nonexistent/b.so"],
                                "--lib a=/nonexistent/a.so: no such file")):
            err = io.StringIO()
            with self.assertRaises(SystemExit) as cm, contextlib.redirect_stderr(err):
                ab_bench.main(argv)
            self.assertEqual(cm.exception.code, 2)
            self.assertIn(expected, err.getvalue())


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]])
