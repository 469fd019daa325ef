#!/usr/bin/python3
"""The attention benchmark, dry (no GPU): bench/run-gpu-benchmarks.sh
--dry-run attention runs bin/cuda_attention_bench (which says it skips) and
bench/torch_sdpa.py on the CPU at a tiny shape, and the summary carries both
sides' lines and the ratio line. So the call a GPU host gets is known to run.
The bench binary's bad flags get one line and exit 2.

Usage: attention_bench_dry_run_test.py BUILD_DIR SOURCE_DIR
"""
import os
import subprocess
import sys
import tempfile
import unittest

BUILD_DIR = ""
SOURCE_DIR = ""


class AttentionBenchDryRunTest(unittest.TestCase):
    def setUp(self):
        self.bench = os.path.join(BUILD_DIR, "bin", "cuda_attention_bench")
        if not os.path.exists(self.bench):
            self.skipTest("no bin/cuda_attention_bench: this build has no CUDA")

    def test_the_dry_run_prints_both_sides_and_the_ratio(self):
        with tempfile.TemporaryDirectory(prefix="attention-dry-") as tmp:
            out = os.path.join(tmp, "bench")
            r = subprocess.run(["bash", os.path.join(SOURCE_DIR, "bench", "run-gpu-benchmarks.sh"), out, "--dry-run",
                                "attention"], env=dict(os.environ, PSTAR_BUILD_DIR=BUILD_DIR, PYTHON="/usr/bin/python3"),
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            summary = open(os.path.join(out, "summary.txt")).read()
        self.assertIn("--- attention (exit 0,", summary)
        self.assertIn("DRY RUN", summary)
        self.assertRegex(summary, r"skipped: no CUDA device|attention: side=pstar kernel=mma ")
        self.assertRegex(summary, r"attention: side=torch backend=\w+ B=1 NH=2 T=64 hs=64 dtype=bf16 fwd_ms=[0-9.]+ ")
        self.assertRegex(summary, r"ratio: shape=hs64 ")

    def test_bad_flags_get_one_line_and_exit_2(self):
        for args in (["--dtype", "fp32"], ["--seq", "0"], ["--heads", "x"], ["--nonsense", "1"], ["--batch"]):
            r = subprocess.run([self.bench] + args, capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, (args, r.stderr))


if __name__ == "__main__":
    BUILD_DIR, SOURCE_DIR = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
