"""slow_links_test.py -- the CPU-checkable parts of slow_links.py: stand-in parsing and refusals, the environment
each stand-in starts with, the emulated split's pair map and counts, the runs it plans, the dry run, the
InfiniBand classes. Run: python3 bench/nccl/slow_links_test.py (ctest topology.slow_links.unit)."""
import contextlib
import io
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import slow_links as sl  # noqa: E402


class StandIns(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(sl.parse_standin("p2p_off"), ("p2p_off", None))
        self.assertEqual(sl.parse_standin("channels:4"), ("channels", 4))
        self.assertEqual(sl.parse_standin("split:2"), ("split", 2))
        for bad in ("channels", "channels:0", "channels:65", "split:x", "p2p_off:2", "ib", ""):
            with self.assertRaises(sl.UsageError, msg=bad) as e:
                sl.parse_standin(bad)
            self.assertIn("stand-in", str(e.exception))

    def test_env(self):
        for name, k in (("nvlink", None), ("p2p_off", None), ("channels", 2), ("split", 2)):
            self.assertEqual(sl.standin_env(name, k)["NCCL_NVLS_ENABLE"], "0")
        self.assertEqual(sl.standin_env("p2p_off", None).get("NCCL_P2P_DISABLE"), "1")
        self.assertNotIn("NCCL_SHM_DISABLE", sl.standin_env("p2p_off", None))
        self.assertEqual(sl.standin_env("p2p_shm_off", None).get("NCCL_SHM_DISABLE"), "1")
        self.assertEqual(sl.standin_env("channels", 3)["NCCL_MAX_NCHANNELS"], "3")
        # The split slows its cross pairs with a communicator of its own, not the process-wide environment.
        self.assertEqual(set(sl.standin_env("split", 2)), {"NCCL_NVLS_ENABLE"})


class PairMap(unittest.TestCase):
    def test_two_nodes_of_two(self):
        cross = sl.pair_map(4, 2)
        self.assertEqual(cross[0], [False, False, True, True])
        self.assertEqual(cross[3], [True, True, False, False])
        for s in range(4):
            for d in range(4):
                self.assertEqual(cross[s][d], cross[d][s])  # symmetric: both directions slowed
            self.assertFalse(cross[s][s])

    def test_refusals(self):
        for world, per_node in ((4, 3), (4, 4), (4, 0), (6, 4)):
            with self.assertRaises(sl.UsageError):
                sl.pair_map(world, per_node)

    def test_counts_cover_every_peer_once(self):
        for world, per_node in ((4, 2), (8, 2), (8, 4)):
            for rank in range(world):
                intra, across = sl.split_counts(world, per_node, rank, 1000)
                self.assertEqual([a + b for a, b in zip(intra, across)], [1000] * world)
                self.assertEqual(sum(1 for c in across if c), world - per_node)


class Driver(unittest.TestCase):
    def test_args(self):
        a = sl.parse_args(["--gpus", "4", "--standins", "split:2,nvlink"])
        self.assertEqual(a.gpus_per_node, 2)
        self.assertEqual(a.parsed, [("split", 2), ("nvlink", None)])
        for bad in (["--gpus", "1"], ["--gpus", "4", "--standins", "split:2", "--gpus-per-node", "3"],
                    ["--gpus", "4", "--standins", ","], ["--gpus", "4", "--standins", "fast"]):
            with self.assertRaises(sl.UsageError, msg=str(bad)):
                sl.parse_args(bad)

    def test_runs(self):
        a = sl.parse_args(["--gpus", "4", "--standins", "channels:2,split:2", "--out", "/tmp/x"])
        planned = sl.runs(a)
        self.assertEqual([(t, i) for t, i, _, _ in planned], [("channels2", "torch"), ("channels2", "cad"),
                                                              ("split2", "torch")])
        cad_cmd = planned[1][3]
        self.assertIn('{"max_ctas": 2}', cad_cmd)
        self.assertIn("NCCL_MAX_NCHANNELS=2", cad_cmd)  # passed to every rank by mpirun -x
        self.assertIn("NCCL_NVLS_ENABLE=0", cad_cmd)
        self.assertIn("/tmp/x/channels2.cad.csv", cad_cmd)

    def test_host_staged_shares_one_gpu_over_the_mpi_plugin(self):
        a = sl.parse_args(["--gpus", "4", "--share-gpu", "--standins", "host_staged", "--out", "/tmp/x",
                           "--mpi-plugin", "/p/cad_mpi.so"])
        (tag, impl, _, cmd), = sl.runs(a)  # CAD's bench only: no torch run for the host-staged path
        self.assertEqual((tag, impl), ("host_staged", "cad"))
        self.assertEqual(cmd[cmd.index("-np") + 1], "4")
        self.assertIn("/p/cad_mpi.so", cmd)
        self.assertEqual(cmd[cmd.index("--device") + 1], "0")
        self.assertEqual(cmd[cmd.index("btl") + 1], "self,vader")
        self.assertIn("/tmp/x/host_staged.cad.csv", cmd)
        # Without --share-gpu each rank takes its local rank's GPU (the bench's default): no --device.
        (_, _, _, cmd), = sl.runs(sl.parse_args(["--gpus", "2", "--standins", "host_staged"]))
        self.assertNotIn("--device", cmd)
        # NCCL and torch take one GPU per rank: sharing is refused for every other stand-in.
        for other in ("nvlink", "host_staged,p2p_off", "split_host"):
            with self.assertRaises(sl.UsageError, msg=other) as e:
                sl.parse_args(["--gpus", "4", "--share-gpu", "--standins", other])
            self.assertIn("--share-gpu", str(e.exception))
        with self.assertRaises(sl.UsageError):
            sl.parse_standin("host_staged:2")

    def test_dry_run_prints_the_pair_map_and_starts_nothing(self):
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            rc = sl.main(["--gpus", "4", "--standins", "split:2", "--dry-run", "--out", "/nonexistent/never"])
        self.assertEqual(rc, 0)
        self.assertIn("rank 0: . . x x", text.getvalue())
        self.assertFalse(os.path.exists("/nonexistent/never"))

    def test_usage_error_exits_2(self):
        with contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(sl.main(["--gpus", "4", "--standins", "channels:0"]), 2)

    def test_summary_of_a_split_counts_only_cross_bytes(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "split2.torch.csv"), "w") as f:
                f.write("impl,world,bytes_per_rank,seconds,algbw_GBps,busbw_GBps\n"
                        "torch_split2,4,1048576,0.0001,10.486,7.864\n"
                        f"torch_split2,4,{1 << 30},0.02,53.687,40.265\n")
            summary, table = sl.summarize(d, ["split2"], 4, 2)
        entry = summary["split2"]["torch"]
        self.assertAlmostEqual(entry["latency_1MiB_us"], 100.0)
        self.assertAlmostEqual(entry["slow_link_GBps_1GiB"], (1 << 30) / 2 / 0.02 / 1e9)
        self.assertEqual(entry["ib_class"], "HDR 200 Gb/s")  # 26.8 GB/s per GPU across
        self.assertIn("| split2 | torch |", table)

    def test_ib_class(self):
        self.assertEqual(sl.ib_class(48.0), "NDR 400 Gb/s")
        self.assertEqual(sl.ib_class(20.0), "HDR 200 Gb/s")
        self.assertEqual(sl.ib_class(120.0), "XDR 800 Gb/s")
        self.assertEqual(sl.ib_class(12.0), "EDR 100 Gb/s")  # the host-memory links measured so far (~12 GB/s)


if __name__ == "__main__":
    unittest.main()
