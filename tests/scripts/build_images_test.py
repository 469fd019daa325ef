#!/usr/bin/python3
"""scripts/build-images.sh's failures: each ends with one line on stderr
naming what failed and exit 2, with nothing left running. A missing docker
client; a daemon that cannot start (a real dockerd given a flag it refuses);
a debootstrap that cannot reach its mirror. The docker client is a stand-in
where the case needs one, so no image is built and no daemon is touched.

Usage: build_images_test.py SOURCE_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = ""


def tool_dir(tmp, leave_out, fake_docker=None):
    """A PATH folder: every program of the system's folders but `leave_out`,
    and a stand-in docker client when given (a shell script's body)."""
    d = os.path.join(tmp, "bin")
    os.makedirs(d)
    for folder in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            dst = os.path.join(d, name)
            if name in leave_out or os.path.lexists(dst):
                continue
            os.symlink(os.path.join(folder, name), dst)
    if fake_docker is not None:
        path = os.path.join(d, "docker")
        with open(path, "w") as f:
            f.write("#!/bin/bash\n" + fake_docker)
        os.chmod(path, 0o755)
    return d


class BuildImagesFailures(unittest.TestCase):
    def run_script(self, path, extra_env=None, args=()):
        env = {"PATH": path, "HOME": os.environ.get("HOME", "/root")}
        env.update(extra_env or {})
        return subprocess.run(["bash", os.path.join(SOURCE_DIR, "scripts/build-images.sh")] + list(args),
                              capture_output=True, text=True, env=env, timeout=300)

    def expect_one_line(self, r, start):
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith(start), r.stderr)

    def test_no_docker_client(self):
        with tempfile.TemporaryDirectory() as tmp:
            r = self.run_script(tool_dir(tmp, {"docker", "dockerd"}))
            self.expect_one_line(r, "build-images: the docker client is not installed (apt-get install docker.io)")

    def test_a_daemon_that_cannot_start(self):
        if os.geteuid() != 0 or shutil.which("dockerd") is None:
            self.skipTest("needs root and dockerd")
        with tempfile.TemporaryDirectory() as tmp:
            # The client never reaches a daemon, so the script starts one.
            path = tool_dir(tmp, {"docker"}, fake_docker='[ "$1" = info ] && exit 1\nexit 0\n')
            r = self.run_script(path, {"PSTAR_DOCKERD_ARGS": "--no-such-flag-at-all"})
            self.expect_one_line(r, "build-images: dockerd exited at start: ")
            self.assertIn("no-such-flag-at-all", r.stderr)

    def test_a_debootstrap_that_cannot_reach_its_mirror(self):
        if os.geteuid() != 0 or shutil.which("debootstrap") is None:
            self.skipTest("needs root and debootstrap")
        with tempfile.TemporaryDirectory() as tmp:
            # A daemon that answers and lacks every image.
            fake = 'case "$1" in info) exit 0 ;; image) exit 1 ;; *) exit 0 ;; esac\n'
            r = self.run_script(tool_dir(tmp, {"docker"}, fake_docker=fake),
                                {"PSTAR_DEBIAN_MIRROR": "http://127.0.0.1:9/debian"}, ["--only", "worker-cpu"])
            self.expect_one_line(r, "build-images: debootstrap of bookworm from http://127.0.0.1:9/debian failed: ")

    def test_an_unknown_option(self):
        r = self.run_script(os.environ["PATH"], args=["--bogus"])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)


if __name__ == "__main__":
    SOURCE_DIR = sys.argv.pop(1)
    unittest.main()
