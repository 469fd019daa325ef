#!/usr/bin/python3
"""The offload benchmark's optimizer parts, dry (no GPU): bench/
run-gpu-benchmarks.sh --dry-run offload-plan offload-pstar offload-waits
offload-sweep offload-margin trains tiny shapes on the CPU backend and prints,
for each, what the GPU call will print: the step against max(kernels, Adam,
copies) with the overlap on and off, the batch sweep's bound, the largest
size each margin plans. So the calls a GPU host gets are known to run.

Usage: offload_bench_dry_run_test.py BUILD_DIR SOURCE_DIR
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

BUILD_DIR = ""
SOURCE_DIR = ""


class OffloadBenchDryRunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="offload-dry-")
        out = os.path.join(cls.tmp.name, "bench")
        env = dict(os.environ, PSTAR_BUILD_DIR=BUILD_DIR)
        cls.proc = subprocess.run(
            ["bash", os.path.join(SOURCE_DIR, "bench", "run-gpu-benchmarks.sh"), out, "--dry-run", "offload-plan",
             "offload-pstar", "offload-waits", "offload-sweep", "offload-margin"],
            env=env, capture_output=True, text=True, timeout=600)
        cls.summary = open(os.path.join(out, "summary.txt")).read() if os.path.exists(
            os.path.join(out, "summary.txt")) else ""
        runs = os.path.join(out, "offload_runs.txt")
        cls.runs = open(runs).read().splitlines() if os.path.exists(runs) else []

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def fields(self, line):
        return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)

    def test_every_part_ran(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stdout[-3000:] + self.proc.stderr[-3000:])
        for part in ("offload-plan", "offload-pstar", "offload-waits", "offload-sweep", "offload-margin"):
            self.assertRegex(self.summary, r"--- %s \(exit 0, " % part)

    def test_waits_compare_the_overlap_on_and_off_against_their_bounds(self):
        self.assertRegex(self.summary, r"overlap on: step / max\(kernels, Adam, copies\) = [0-9.]+ against the 1\.15 target")
        self.assertRegex(self.summary, r"overlap off: step [0-9.]+ ms against the sum of kernels, Adam and copies")
        self.assertRegex(self.summary, r"model FLOP rate [0-9.]+ TFLOP/s \(8 N per token\)")
        waits = {self.fields(l)["overlap"]: self.fields(l) for l in self.runs if l.startswith("waits ")}
        self.assertEqual(set(waits), {"speculate", "off"})
        for overlap, f in waits.items():
            self.assertEqual(f["status"], "ok", overlap)
            self.assertGreater(float(f["step_ms"]), 0.0, overlap)
            self.assertGreater(float(f["kernel_ms"]), 0.0, overlap)
            self.assertGreater(float(f["adam_ms"]), 0.0, overlap)
            self.assertGreaterEqual(float(f["h2d_ms"]), 0.0, overlap)
        # Speculation ran (clipping is off in these runs) and kept every step.
        self.assertGreater(int(waits["speculate"]["speculated"]), 0)
        self.assertEqual(int(waits["speculate"]["rolled_back"]), 0)
        self.assertEqual(int(waits["off"]["speculated"]), 0)

    def test_the_sweep_names_each_batch_bound(self):
        bounds = re.findall(r"batch (\d+): kernels [0-9.]+ ms, Adam [0-9.]+ ms: (compute|Adam)-bound", self.summary)
        self.assertEqual(sorted(b for b, _ in bounds), ["1", "2"])

    def test_the_margin_part_plans_and_trains_each_ratio(self):
        for ratio in ("0.8", "1.0"):
            self.assertRegex(self.summary, r"ratio %s: \d+ layers \(\d+ parameters\) plan" % re.escape(ratio))
        self.assertEqual(len([l for l in self.runs if l.startswith("margin ") and " status=ok " in l]), 2)


if __name__ == "__main__":
    BUILD_DIR, SOURCE_DIR = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
