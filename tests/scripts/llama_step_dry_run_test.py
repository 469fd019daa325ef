#!/usr/bin/python3
"""The Llama step benchmark, dry (no GPU): bench/run-gpu-benchmarks.sh
--dry-run llama-step trains pstar's tiny Llama-family stand-in (grouped-query
attention, RoPE, SwiGLU, RMSNorm, the vocabulary in row parts) plain and
--profile, and bench/torch_llama_train.py the same architecture on the CPU;
the summary carries pstar's profile with the family's ops and the in_memory
line with both sides' rates and their ratio, the PyTorch model having
exactly pstar's parameter count. So the call a GPU host gets is known to run.

Usage: llama_step_dry_run_test.py BUILD_DIR SOURCE_DIR
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

BUILD_DIR = ""
SOURCE_DIR = ""


class LlamaStepDryRunTest(unittest.TestCase):
    def test_the_dry_run_compares_the_same_architecture_and_profiles_its_ops(self):
        with tempfile.TemporaryDirectory(prefix="llama-step-dry-") as tmp:
            out = os.path.join(tmp, "bench")
            r = subprocess.run(["bash", os.path.join(SOURCE_DIR, "bench", "run-gpu-benchmarks.sh"), out, "--dry-run",
                                "llama-step"], env=dict(os.environ, PSTAR_BUILD_DIR=BUILD_DIR, PYTHON="/usr/bin/python3"),
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            summary = open(os.path.join(out, "summary.txt")).read()
        self.assertIn("--- llama-step (exit 0,", summary)
        self.assertIn("DRY RUN", summary)
        line = re.search(r"^in_memory: model=llama-1b .*$", summary, re.M)
        self.assertIsNotNone(line, summary)
        fields = dict(kv.split("=", 1) for kv in line.group(0).split()[1:])
        self.assertRegex(fields["pstar_tokens_per_s"], r"^[0-9.]+$")
        # PyTorch eager ran the same model (a parameter count that differed
        # from pstar's would leave it unmeasured) and the ratio is taken.
        self.assertRegex(fields["eager_tokens_per_s"], r"^[0-9.]+$", line.group(0))
        self.assertRegex(fields["pstar_over_best_torch"], r"^[0-9.]+$")
        # The profile has the family's ops, and they and the rest sum to the step.
        for op in ("rmsnorm.fwd", "rmsnorm.bwd", "rope.fwd", "rope.bwd", "swiglu.fwd", "swiglu.bwd", "attention.bwd"):
            self.assertRegex(summary, r"pstar   op +%s +[0-9]+ calls" % re.escape(op))
        share = re.search(r"ops [0-9.]+ s = ([0-9.]+)%, idle", summary)
        self.assertIsNotNone(share, summary)
        self.assertGreater(float(share.group(1)), 90.0)


if __name__ == "__main__":
    BUILD_DIR, SOURCE_DIR = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
