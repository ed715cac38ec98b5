"""fit_link_test.py -- the fits of fit_link.py on synthetic data: latency and bandwidth recovered from exact points
(trainer steps and a slow_links.py curve), a negative intercept fixed at 0, too few points refused, and the
exchange points read from a record (3 passes x layers x the busiest rank's forward bytes).
Run: python3 bench/simulate/fit_link_test.py (ctest simulate.fit_link.unit)."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fit_link as fl  # noqa: E402


class Fits(unittest.TestCase):
    def test_latency_and_bandwidth_recovered(self):
        lat, bw = 2e-3, 40e9
        pts = [(12, b, 12 * lat + b / bw) for b in (1e9, 2e9, 3.5e9)] + [(24, 1e9, 24 * lat + 1e9 / bw)]
        got_lat, got_bw = fl.fit_latency_bandwidth(pts)
        self.assertAlmostEqual(got_lat, lat, places=9)
        self.assertAlmostEqual(got_bw / bw, 1.0, places=6)

    def test_negative_latency_is_fixed_at_zero(self):
        pts = [(12, 1e9, 0.020), (12, 2e9, 0.050)]  # the line through them crosses below zero
        lat, bw = fl.fit_latency_bandwidth(pts)
        self.assertEqual(lat, 0.0)
        self.assertAlmostEqual(bw, (1e18 + 4e18) / (1e9 * 0.02 + 2e9 * 0.05))

    def test_too_few_points(self):
        with self.assertRaises(fl.FitError):
            fl.fit_latency_bandwidth([(12, 1e9, 0.02)])

    def test_curve(self):
        lat, bw = 30e-6, 12e9
        curve = [{"bytes_per_rank": b, "seconds": lat + b * 3 / 4 / bw, "algbw_GBps": 0, "busbw_GBps": 0}
                 for b in (1 << 20, 1 << 24, 1 << 30)]
        summary = {"np4": {"run": {"gpus": 4, "gpus_per_node": 2},
                           "results": {"host_staged": {"cad": {"curve": curve}}}}}
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(summary, f)
        try:
            args = type("A", (), {"curve": f.name, "key": "np4", "standin": "host_staged", "impl": "cad"})
            r = fl.curve_mode(args)
            self.assertAlmostEqual(r["latency_us"], 30.0, places=4)
            self.assertAlmostEqual(r["bandwidth_GBps"], 12.0, places=4)
            self.assertTrue(all(abs(row["error"]) < 1e-9 for row in r["rows"]))
            # Exact points: each size predicted as well by the other two alone.
            self.assertTrue(all(abs(row["held_out_error"]) < 1e-9 for row in r["rows"]))
            args.standin = "p2p_off"
            with self.assertRaises(fl.FitError):
                fl.curve_mode(args)
        finally:
            os.unlink(f.name)

    def test_points_of_a_record(self):
        cfg = {"summary": {"layers": 2, "micro_batches": 2},
               "steps": [{"step": 1, "forward_bytes_sent_by_rank": [1e8, 3e8], "exchange_comm_ms": [200.0, 210.0]},
                         {"step": 2, "forward_bytes_sent_by_rank": [2e8, 1e8], "exchange_comm_ms": [190.0, 180.0]}]}
        self.assertEqual(fl.link_points(cfg), [(12, 3 * 2 * 3e8, 0.21), (12, 3 * 2 * 2e8, 0.19)])
        self.assertEqual(fl.seeds(cfg), [1001, 1002, 2001, 2002])


if __name__ == "__main__":
    unittest.main()
