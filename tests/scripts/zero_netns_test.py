#!/usr/bin/python3
"""ZeRO ranks in network namespaces over shaped links (bench/zero_netns.sh),
tiny shape: 2 and 3 ranks, each `pstar launch --nnodes N --node-rank K` in a
namespace of its own, the links unshaped and then shaped to 100 Mbit/s with
tc's token bucket, the collectives waited for as they start and run under
compute (runtime.comm_overlap off and on), each rank's chunk event log
recorded. Every rank finishes, the run
trains the same numbers at any rate, overlap on and off agree, the payload is at least
ZeRO-3's count, the replayed step's and `pstar plan --payload`'s equal it exactly, the wire carries
it with a small protocol overhead, the shaped link makes the collectives
slower, every rank's event log pairs each collective's begin with its end and
rank 0's timeline adds up, and every namespace is gone afterwards. The call a
16-core GPU host gets (bench/run-gpu-benchmarks.sh zero-netns zero-netns-12)
runs dry. Speed targets stay in bench/.

Where namespaces cannot be made (not root, no netns) the test skips; with
PSTAR_EXPECT_NETNS=1 a skip fails.

Usage: zero_netns_test.py BUILD_DIR SOURCE_DIR
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

BUILD_DIR = ""
SOURCE_DIR = ""


def namespaces():
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return sorted(l.split()[0] for l in r.stdout.splitlines() if l.startswith("pz"))


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)


class ZeroNetnsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="zero-netns-")
        cls.before = namespaces()
        env = dict(os.environ, PSTAR_BUILD_DIR=BUILD_DIR, PYTHON3="/usr/bin/python3")
        cls.proc = subprocess.run(
            ["bash", os.path.join(SOURCE_DIR, "bench", "zero_netns.sh"), "--shape", "tiny", "--ranks", "2 3",
             "--rates", "100mbit", "--overlap", "off on", "--extra-chunks", "0", "--steps", "4", "--events", "--log-dir", cls.tmp.name],
            env=env, capture_output=True, text=True, timeout=900)
        cls.after = namespaces()
        cls.runs = [fields(l) for l in cls.proc.stdout.splitlines() if l.startswith("netns ")]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        if self.proc.returncode == 3:
            reason = self.proc.stdout.strip().splitlines()[-1]
            if os.environ.get("PSTAR_EXPECT_NETNS") == "1":
                self.fail("PSTAR_EXPECT_NETNS=1 but " + reason)
            self.skipTest(reason)

    def test_every_world_trains_at_every_rate_and_the_ranks_agree(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stdout[-3000:] + self.proc.stderr[-3000:])
        self.assertRegex(self.proc.stdout, r"link unshaped_bits_per_s=[1-9]")
        self.assertEqual([(r["ranks"], r["rate"], r["overlap"]) for r in self.runs],
                         [("2", "unshaped", "off"), ("2", "100mbit", "off"), ("2", "100mbit", "on"),
                          ("3", "unshaped", "off"), ("3", "100mbit", "off"), ("3", "100mbit", "on")])
        for r in self.runs:
            self.assertEqual(r["status"], "ok", r)
            self.assertEqual(r["ranks_ok"], "yes", r)
        for n in ("2", "3"):
            off = {r["final_loss"] for r in self.runs if r["ranks"] == n and r["overlap"] == "off"}
            self.assertEqual(len(off), 1, "the link's rate changes no number: %s" % off)
            on = [float(r["final_loss"]) for r in self.runs if r["ranks"] == n and r["overlap"] == "on"]
            self.assertAlmostEqual(on[0], float(off.pop()), delta=2e-3)

    def test_the_payload_is_the_plans_the_replay_sends_it_again_and_the_wire_carries_it(self):
        for r in self.runs:
            # Every param chunk is gathered for the forward at least (ZeRO-3
            # gathers it for the backward too, which the embeddings' backward
            # does not need), every gradient chunk reduce-scattered at least once.
            self.assertGreaterEqual(2 * int(r["gather_bytes"]), int(r["zero3_gather_bytes"]), r)
            self.assertGreaterEqual(int(r["scatter_bytes"]), int(r["zero3_scatter_bytes"]), r)
            self.assertGreater(int(r["zero3_gather_bytes"]), 0, r)
            # The communication alone is the step's own gathers and scatters,
            # and the plan counted them exactly beforehand.
            self.assertEqual(int(r["replay_payload_bytes"]), int(r["gather_bytes"]) + int(r["scatter_bytes"]), r)
            self.assertEqual(int(r["plan_payload_bytes"]), int(r["replay_payload_bytes"]), r)
            self.assertEqual(r["payload_matches_plan"], "yes", r)
            # TCP/IP and Gloo framing: a few percent over the payload.
            self.assertGreaterEqual(float(r["wire_over_payload"]), 1.0, r)
            self.assertLess(float(r["wire_over_payload"]), 1.15, r)
            for key in ("compute_alone_s", "comm_alone_s", "collective_s"):
                self.assertGreater(float(r[key]), 0.0, r)
            self.assertGreaterEqual(float(r["hidden"]), 0.0, r)
            self.assertLessEqual(float(r["hidden"]), 1.0, r)
            self.assertLessEqual(float(r["waited_s"]), float(r["step_s"]), r)

    def test_the_shaped_link_holds_the_collectives_to_its_rate(self):
        # Each rank sends wire_bytes a step through its own shaped link: at
        # 100 Mbit/s that cannot take less than wire_bytes * 8 / 1e8 seconds,
        # with the compute or without it, overlapped or not, less what the
        # token bucket lets through at once: its 64 KiB burst (5 ms at this
        # rate) refills in every pause between collectives, which the step's
        # compute makes many of (the replay has none to speak of).
        for r in self.runs:
            if r["rate"] != "100mbit":
                continue
            floor = int(r["wire_bytes"]) * 8 / 1e8
            self.assertGreater(float(r["collective_s"]), 0.5 * floor, r)
            self.assertGreater(float(r["comm_alone_s"]), 0.8 * floor, r)
            self.assertGreater(float(r["step_s"]), 0.8 * floor, r)


    def test_every_ranks_event_log_pairs_its_collectives_and_the_timeline_adds_up(self):
        logs = sorted(f for f in os.listdir(self.tmp.name) if f.startswith("events_"))
        # One log per rank of every run: 2 ranks x 3 runs, 3 ranks x 3 runs.
        self.assertEqual(len(logs), 15, logs)
        for name in logs:
            with open(os.path.join(self.tmp.name, name)) as f:
                events = [line.split(",")[2] for line in f.read().splitlines()[1:]]
            for op in ("gather", "reduce_scatter"):
                begins, ends = events.count(op + "_begin"), events.count(op + "_end")
                self.assertGreater(begins, 0, (name, op))
                self.assertEqual(begins, ends, (name, op))
        rows = [l.split() for l in self.proc.stdout.splitlines() if re.match(r"  timeline +[0-9]+ ", l)]
        self.assertGreaterEqual(len(rows), 6 * 3, self.proc.stdout[-2000:])
        for row in rows:
            step, busy, idle, head, gaps, tail = (float(x) for x in row[2:8])
            self.assertAlmostEqual(busy + idle, step, delta=5e-4, msg=row)
            self.assertAlmostEqual(head + gaps + tail, idle, delta=5e-4, msg=row)
            self.assertGreater(busy, 0.0, row)

    def test_the_timeline_refuses_what_it_cannot_read_in_one_line(self):
        one_rank = os.path.join(self.tmp.name, "one_rank.csv")
        with open(one_rank, "w") as f:
            f.write("seq,step,event,chunk,time_s\n0,0,step_begin,-1,0.0\n1,0,forward_use,0,0.1\n"
                    "2,1,step_begin,-1,0.2\n")
        garbled = os.path.join(self.tmp.name, "garbled.csv")
        with open(garbled, "w") as f:
            f.write("seq,step,event,chunk,time_s\n0,0,step_begin,x,y\n")
        for args in ([os.path.join(self.tmp.name, "missing.csv")], [one_rank], [garbled], [one_rank, "--gaps"]):
            r = subprocess.run(["/usr/bin/python3", os.path.join(SOURCE_DIR, "bench", "collective_timeline.py")] + args,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, (args, r.stderr))
            self.assertTrue(r.stderr.startswith("collective_timeline: "), r.stderr)

    def test_no_namespace_is_left_behind(self):
        self.assertEqual(self.after, self.before)

    def test_the_call_a_gpu_host_gets_runs_dry(self):
        # bench/run-gpu-benchmarks.sh zero-netns zero-netns-12 measures ranks
        # with cores of their own on a 16-core GPU host; dry, each part is the
        # tiny shape at 2 ranks and 1 Gbit/s, 3 steps.
        with tempfile.TemporaryDirectory(prefix="zero-netns-dry-") as tmp:
            out = os.path.join(tmp, "bench")
            r = subprocess.run(["bash", os.path.join(SOURCE_DIR, "bench", "run-gpu-benchmarks.sh"), out, "--dry-run",
                                "zero-netns", "zero-netns-12"],
                               env=dict(os.environ, PSTAR_BUILD_DIR=BUILD_DIR, PYTHON3="/usr/bin/python3"),
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            with open(os.path.join(out, "summary.txt")) as f:
                summary = f.read()
        for part in ("zero-netns", "zero-netns-12"):
            self.assertIn("--- %s (exit 0," % part, summary)
        runs = re.findall(r"^netns ranks=2 rate=1gbit overlap=on status=ok .*payload_matches_plan=yes", summary, re.M)
        self.assertEqual(len(runs), 2, summary)
        self.assertEqual(namespaces(), self.before)

    def test_bad_arguments_get_one_line_and_exit_2(self):
        for args in (["--ranks", "9"], ["--steps", "1"], ["--shape", "huge"], ["--rates", "fast"],
                     ["--overlap", "sometimes"], ["--extra-chunks", "many"], ["--prefetch-depth", "deep"],
                     ["--chunk", "big"], ["--chunk", "-1"]):
            r = subprocess.run(["bash", os.path.join(SOURCE_DIR, "bench", "zero_netns.sh"), "--shape", "tiny"] + args,
                               env=dict(os.environ, PSTAR_BUILD_DIR=BUILD_DIR), capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, (args, r.stderr))
            self.assertTrue(r.stderr.startswith("zero_netns: "), r.stderr)


if __name__ == "__main__":
    BUILD_DIR, SOURCE_DIR = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
