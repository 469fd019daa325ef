#!/usr/bin/python3
"""scripts/make-bundle.sh on this build: the bundle must load every library
from itself (beyond glibc, the NVIDIA driver and, with --no-cuda-libs, the
CUDA toolkit), and its pstar must run from anywhere.

Usage: bundle_test.py BUILD_DIR SOURCE_DIR
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

BUILD_DIR = ""
SOURCE_DIR = ""

GLIBC = re.compile(
    r"^(linux-vdso|linux-gate|ld-linux[^/]*|libc|libm|libmvec|libpthread|libdl|librt|libutil|libresolv|"
    r"libnsl|libanl|libthread_db|libBrokenLocale|libnss_[a-z0-9]+|libc_malloc_debug)\.so")
DRIVER = re.compile(r"^(libcuda|libnvidia-[A-Za-z0-9-]+|libcudadebugger|libnvcuvid)\.so")
CUDA_RUNTIME = re.compile(
    r"^(libcudart|libcublas|libcublasLt|libnccl|libnvrtc[a-z.-]*|libnvJitLink|libcusparse|libcurand|libcufft|"
    r"libcusolver|libcudnn[a-z_]*|libnvToolsExt|libnvtx[a-z0-9_]*)\.so")

TINY_JOB = ("model: {n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 256, max_seq_len: 16}\n"
            "train: {batch_size: 2, seq_len: 8, steps: 3, log_every: 1}\n")


def run(argv, cwd=None, env=None):
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def ldd(path, env=None):
    """(name, resolved path or None) for each library ldd lists."""
    r = run(["ldd", path], env=env)
    out = []
    for line in r.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1] == "=>":
            out.append((fields[0], None if fields[2] == "not" else fields[2]))
        elif fields:
            out.append((os.path.basename(fields[0]), fields[0]))
    return out


def make_bundle(out, *flags):
    return run(["bash", os.path.join(SOURCE_DIR, "scripts", "make-bundle.sh"), BUILD_DIR, out, *flags])


class BundleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="pstar-bundle-")
        cls.bundle = os.path.join(cls.tmp, "bundle")
        # The CUDA runtime libraries (cuBLASLt alone is hundreds of MiB) stay
        # with the toolkit here; the plan test below covers bundling them.
        cls.made = make_bundle(cls.bundle, "--no-cuda-libs")
        cls.pstar_libs = [name for name, _ in ldd(os.path.join(BUILD_DIR, "bin", "pstar"))]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.assertEqual(self.made.returncode, 0, self.made.stderr)

    def elves(self):
        found = []
        for sub in ("bin", "tests", "lib"):
            top = os.path.join(self.bundle, sub)
            for dirpath, _, files in os.walk(top):
                found += [os.path.join(dirpath, f) for f in files if is_elf(os.path.join(dirpath, f))]
        return found

    def test_layout(self):
        b = self.bundle
        self.assertTrue(os.access(os.path.join(b, "bin", "pstar"), os.X_OK))
        self.assertTrue(os.access(os.path.join(b, "run-gpu-tests.sh"), os.X_OK))
        self.assertTrue(os.path.isfile(os.path.join(b, "source", "examples", "default.yaml")))
        self.assertTrue(os.path.isdir(os.path.join(b, "source", "tests", "fixtures")))
        with open(os.path.join(b, "BUNDLE.txt")) as f:
            manifest = f.read()
        self.assertRegex(manifest, r"needs glibc >= 2\.\d+")
        self.assertIn("from the host (--no-cuda-libs)", manifest)
        for name in ("worker_test", "kernels_cpu_test", "cuda_backend_test", "integration_test"):
            if os.path.exists(os.path.join(BUILD_DIR, "bin", name)):
                self.assertTrue(os.path.exists(os.path.join(b, "tests", name)), name)

    def test_every_library_resolves_inside_the_bundle(self):
        lib = os.path.realpath(os.path.join(self.bundle, "lib"))
        env = None
        if not is_elf(os.path.join(self.bundle, "bin", "pstar")):
            # No patchelf: wrapper scripts put lib/ on the search path.
            env = dict(os.environ, LD_LIBRARY_PATH=lib)
        elves = self.elves()
        self.assertGreater(len(elves), 3)
        bundled = 0
        for elf in elves:
            for name, path in ldd(elf, env):
                self.assertIsNotNone(path, f"{elf}: {name} not found")
                if GLIBC.match(name) or DRIVER.match(name):
                    continue
                real = os.path.realpath(path)
                if CUDA_RUNTIME.match(name):
                    # --no-cuda-libs: the toolkit's, never a copy in the bundle.
                    self.assertFalse(real.startswith(lib + os.sep), f"{elf}: {name} was bundled")
                    continue
                self.assertTrue(real.startswith(lib + os.sep), f"{elf}: {name} resolves to {path}, not the bundle")
                bundled += 1
        self.assertGreater(bundled, 0)
        # Never glibc or the driver.
        for name in os.listdir(lib):
            self.assertFalse(GLIBC.match(name) or DRIVER.match(name), f"{name} must not be bundled")

    def test_binaries_carry_a_relative_runpath(self):
        if shutil.which("patchelf") is None:
            self.skipTest("no patchelf: the bundle uses wrapper scripts")
        for name in os.listdir(os.path.join(self.bundle, "bin")):
            r = run(["patchelf", "--print-rpath", os.path.join(self.bundle, "bin", name)])
            self.assertTrue(r.stdout.startswith("$ORIGIN/../lib"), f"{name}: {r.stdout}")

    def test_pstar_runs_from_another_directory(self):
        elsewhere = tempfile.mkdtemp(dir=self.tmp)
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        pstar = os.path.join(self.bundle, "bin", "pstar")
        info = run([pstar, "info"], cwd=elsewhere, env=env)
        self.assertEqual(info.returncode, 0, info.stderr)
        self.assertTrue(info.stdout.startswith("pstar "), info.stdout)
        with open(os.path.join(elsewhere, "job.yaml"), "w") as f:
            f.write(TINY_JOB)
        train = run([pstar, "train", "--config", "job.yaml", "--set", "train.steps=2"], cwd=elsewhere, env=env)
        self.assertEqual(train.returncode, 0, train.stderr)
        self.assertIn("summary: steps=2 ", train.stdout)

    def test_the_runner_points_the_tests_at_the_bundle(self):
        worker_test = os.path.join(self.bundle, "tests", "worker_test")
        if not os.path.exists(worker_test):
            self.skipTest("worker_test is not built")
        results = os.path.join(self.tmp, "results")
        # Config.EveryExampleParses reads examples/ from PSTAR_SOURCE_DIR.
        r = run([os.path.join(self.bundle, "run-gpu-tests.sh"), results, "worker_test", "--",
                 "--gtest_filter=Config.EveryExampleParses"], cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(results, "summary.txt")) as f:
            self.assertIn("worker_test: PASSED | PASSED 1", f.read())
        self.assertTrue(os.path.isfile(os.path.join(results, "worker_test.xml")))
        self.assertTrue(os.path.isfile(os.path.join(results, "environment.txt")))
        # And the test really reads through the override: a wrong one fails it.
        bad = run([worker_test, "--gtest_filter=Config.EveryExampleParses"], cwd=self.tmp,
                  env=dict(os.environ, PSTAR_SOURCE_DIR=os.path.join(self.tmp, "nowhere")))
        self.assertNotEqual(bad.returncode, 0, bad.stdout)

    def test_the_plan_bundles_the_cuda_runtime_unless_told_not_to(self):
        cudart = [n for n in self.pstar_libs if n.startswith("libcudart.so")]
        if not cudart:
            self.skipTest("a build without CUDA")
        plan = make_bundle(os.path.join(self.tmp, "unused"), "--list")
        self.assertEqual(plan.returncode, 0, plan.stderr)
        lines = {l.split()[2]: l.split()[0] for l in plan.stdout.splitlines() if len(l.split()) >= 3}
        self.assertEqual(lines[cudart[0]], "bundle")
        self.assertEqual(lines["libstdc++.so.6"], "bundle")
        self.assertEqual(lines["libc.so.6"], "host")
        plan = make_bundle(os.path.join(self.tmp, "unused"), "--list", "--no-cuda-libs")
        lines = {l.split()[2]: l.split()[0] for l in plan.stdout.splitlines() if len(l.split()) >= 3}
        self.assertEqual(lines[cudart[0]], "host")
        self.assertEqual(lines["libstdc++.so.6"], "bundle")
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "unused")))


if __name__ == "__main__":
    BUILD_DIR, SOURCE_DIR = os.path.realpath(sys.argv[1]), os.path.realpath(sys.argv[2])
    unittest.main(argv=sys.argv[:1], verbosity=2)
