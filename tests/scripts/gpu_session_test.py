#!/usr/bin/python3
"""The GPU session's preparation and its runner, dry (no GPU): scripts/
gpu-prepare.sh downloads the packages, scripts/gpu-session.sh --dry-run
unpacks them into a private prefix, builds the worker side against it and
proves no file of the system's own packages took part; what it leaves in
OUTDIR fits what comes back from a GPU host (at most 8 files). A package
missing from the prefix is caught, not hidden by the system's copy.

Usage: gpu_session_test.py BUILD_DIR SOURCE_DIR
"""
import os
import shutil
import subprocess
import sys
import tarfile
import unittest

BUILD_DIR = ""
SOURCE_DIR = ""


def read(path):
    with open(path) as f:
        return f.read()


def run(argv, env=None, timeout=1500):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=timeout)


class GpuSessionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = os.path.join(BUILD_DIR, "gpu-session-test")
        os.makedirs(cls.work, exist_ok=True)
        cls.debs = os.path.join(cls.work, "debs")
        r = run(["bash", os.path.join(SOURCE_DIR, "scripts", "gpu-prepare.sh"), cls.debs], timeout=600)
        if r.returncode != 0:
            raise AssertionError("gpu-prepare.sh failed:\n" + r.stdout + r.stderr)
        # Run again at once (the tests below read the directory, never write it).
        cls.before_rerun = cls.deb_mtimes()
        cls.rerun = run(["bash", os.path.join(SOURCE_DIR, "scripts", "gpu-prepare.sh"), cls.debs], timeout=600)
        cls.after_rerun = cls.deb_mtimes()

    @classmethod
    def deb_mtimes(cls):
        return {n: os.stat(os.path.join(cls.debs, n)).st_mtime_ns for n in os.listdir(cls.debs) if n.endswith(".deb")}

    def test_prepare_is_small_and_checksummed(self):
        names = sorted(n for n in os.listdir(self.debs) if n.endswith(".deb"))
        listed = read(os.path.join(SOURCE_DIR, "scripts", "gpu", "packages.txt"))
        packages = [p for line in listed.splitlines() for p in line.split("#")[0].split()]
        self.assertEqual(len(names), len(packages))
        size = sum(os.path.getsize(os.path.join(self.debs, n)) for n in names)
        self.assertLess(size, 48 << 20, "what travels to the GPU host must stay well under 64 MiB")
        manifest = read(os.path.join(self.debs, "MANIFEST")).split()
        self.assertEqual(sorted(manifest[1::2]), names)
        # Running it again keeps what is there: a file is named by its
        # package and version, so one whose version the package lists
        # replaced in between is the only kind that may change.
        self.assertEqual(self.rerun.returncode, 0, self.rerun.stderr)
        kept = set(self.before_rerun) & set(self.after_rerun)
        self.assertTrue(kept)
        self.assertEqual({n: self.before_rerun[n] for n in kept}, {n: self.after_rerun[n] for n in kept})

    def test_dry_run_builds_in_isolation(self):
        out = os.path.join(self.work, "out")
        shutil.rmtree(out, ignore_errors=True)
        # nvcc first on PATH is a wrapper script outside the toolkit, as on
        # hosts that install /usr/local/bin/nvcc: the runner must still find
        # the toolkit's libraries and hand CMake the real compiler.
        dry = run([shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc", "--dryrun", "-x", "cu", "-E", "/dev/null"])
        top = [l.split("=", 1)[1] for l in dry.stderr.splitlines() if l.startswith("#$ TOP=")]
        self.assertTrue(top, dry.stderr[-2000:])
        real_nvcc = os.path.realpath(os.path.join(top[0], "bin", "nvcc"))
        wrapper_bin = os.path.join(self.work, "wrapper-bin")
        os.makedirs(wrapper_bin, exist_ok=True)
        with open(os.path.join(wrapper_bin, "nvcc"), "w") as f:
            f.write("#!/bin/sh\nexec %s \"$@\"\n" % real_nvcc)
        os.chmod(os.path.join(wrapper_bin, "nvcc"), 0o755)
        r = run(["bash", os.path.join(SOURCE_DIR, "scripts", "gpu-session.sh"), out, "--quick", "--dry-run"],
                # A CI machine of two cores builds everything while other
                # tests run beside it: more time than a GPU host's call has.
                env={"DEPS_DIR": self.debs, "WORK_DIR": os.path.join(self.work, "session"),
                     "BUILD_LIMIT_S": "1200", "DEADLINE_S": "1400",
                     "PATH": wrapper_bin + os.pathsep + os.environ.get("PATH", "")})
        summary_path = os.path.join(out, "summary.txt")
        summary = read(summary_path) if os.path.exists(summary_path) else "(none)"
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-2000:])
        for line in ("isolation: passed", "build: passed", "verdict: PASSED", "libnccl.so: ", "kernels-cuda: passed",
                     "tune: passed"):
            self.assertIn(line, summary)
        self.assertLessEqual(len(os.listdir(out)), 8)
        self.assertEqual(sorted(os.listdir(out)), ["logs.tar.gz", "summary.txt"])
        with tarfile.open(os.path.join(out, "logs.tar.gz")) as t:
            logs = t.getnames()
            self.assertIn("logs/build.log", logs)
            iso = t.extractfile("logs/isolation.log").read().decode()
        self.assertIn("passed: nothing came from the system's packages", iso)
        self.assertIn("libyaml-cpp.so.0.7 => " + os.path.join(self.work, "session", "deps"), iso)
        # The binaries it built resolved their libraries in the prefix (RUNPATH and the runner's search).
        cache = read(os.path.join(self.work, "session", "build", "CMakeCache.txt"))
        self.assertIn("PSTAR_BUILD_OPERATOR:BOOL=OFF", cache)
        toolkit = os.path.dirname(os.path.dirname(real_nvcc))
        compiler = [l.split("=", 1)[1] for l in cache.splitlines() if l.startswith("CMAKE_CUDA_COMPILER:")]
        self.assertEqual(compiler, [os.path.join(toolkit, "bin", "nvcc")])
        self.assertIn("libcudart.so: " + toolkit, summary)
        self.assertIn("yaml-cpp_DIR:PATH=" + os.path.join(self.work, "session", "deps"), cache)

    def test_a_package_missing_from_the_prefix_is_caught(self):
        # The prefix without yaml-cpp: CMake falls back to the system's, and
        # the isolation check names it.
        root = os.path.join(self.work, "partial-root")
        debs = os.path.join(self.work, "partial-debs")
        shutil.rmtree(debs, ignore_errors=True)
        os.makedirs(debs)
        kept = []
        for line in read(os.path.join(self.debs, "MANIFEST")).splitlines(keepends=True):
            digest, name = line.split()
            if not name.startswith("libyaml-cpp"):
                shutil.copy(os.path.join(self.debs, name), debs)
                kept.append(line)
        with open(os.path.join(debs, "MANIFEST"), "w") as f:
            f.writelines(kept)
        r = run(["bash", os.path.join(SOURCE_DIR, "scripts", "gpu", "unpack-debs.sh"), debs, root])
        self.assertEqual(r.returncode, 0, r.stderr)
        build = os.path.join(self.work, "partial-build")
        shutil.rmtree(build, ignore_errors=True)
        r = run(["cmake", "-G", "Ninja", "-S", SOURCE_DIR, "-B", build, "-DPSTAR_BUILD_OPERATOR=OFF",
                 "-DPSTAR_WITH_CUDA=OFF", "-DPSTAR_DEPS_ROOT=" + root])
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        r = run(["/usr/bin/python3", os.path.join(SOURCE_DIR, "scripts", "gpu", "check_isolation.py"), build, root,
                 SOURCE_DIR])
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("yaml-cpp_DIR=/usr/", r.stdout)
        self.assertIn("nothing was built", r.stdout)

    def test_unpack_never_writes_into_the_system(self):
        for target in ("/", "/usr", "/usr/local"):
            r = run(["bash", os.path.join(SOURCE_DIR, "scripts", "gpu", "unpack-debs.sh"), self.debs, target])
            self.assertEqual(r.returncode, 2, target)
            self.assertIn("refusing", r.stderr)

    def test_a_tampered_package_is_refused(self):
        debs = os.path.join(self.work, "tampered-debs")
        shutil.rmtree(debs, ignore_errors=True)
        shutil.copytree(self.debs, debs)
        victim = sorted(n for n in os.listdir(debs) if n.endswith(".deb"))[0]
        with open(os.path.join(debs, victim), "ab") as f:
            f.write(b"x")
        r = run(["bash", os.path.join(SOURCE_DIR, "scripts", "gpu", "unpack-debs.sh"), debs,
                 os.path.join(self.work, "tampered-root")])
        self.assertEqual(r.returncode, 1)
        self.assertIn("does not match its MANIFEST", r.stderr)

    def test_bad_usage_exits_2(self):
        script = os.path.join(SOURCE_DIR, "scripts", "gpu-session.sh")
        for argv in ([], ["--full"], [os.path.join(self.work, "o"), "--fast"], [os.path.join(self.work, "o"), "x"]):
            r = run(["bash", script, *argv])
            self.assertEqual(r.returncode, 2, argv)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    BUILD_DIR, SOURCE_DIR = os.path.realpath(sys.argv[1]), os.path.realpath(sys.argv[2])
    unittest.main(argv=[sys.argv[0], "-v"])
