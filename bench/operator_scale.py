#!/usr/bin/python3
"""Operator scale benchmark: from creating N PatrickStarJobs to all of their
pods created, per job (p50, p99) and in all, with the operator's write
requests, CPU and memory.

Runs the loopback fake API server (tests/fake_kube, no kubelet: pods stay
Pending, so only the operator's work is measured) and a real pstar-operator
process, once per client rate limit (the chart's default, --qps 50
--burst 100, and unlimited) and job shape (1 and 4 pods per job). Each pair
gets a fresh server and operator; the job counts run one after another in
their own namespaces, so the operator holds every job so far.

With the default limits the operator's writes are paced at the QPS, so the
floor for N jobs is (its writes) / QPS: the benchmark prints the measured
time over that floor (target: within 1.2) and the writes per job.

Usage: bench/operator_scale.py [--build build] [--counts 1,100,1000]
                               [--shapes 1,4] [--limits default,unlimited]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMITS = {"default": (50, 100), "unlimited": (100000, 100000)}  # the chart's operator.qps / operator.burst
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def wait_for_file(path, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path) as f:
                return f.read().strip()
        time.sleep(0.05)
    sys.exit(f"operator_scale: {path} did not appear within {timeout} s")


class Api:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")


def job(name, ns, pods):
    return {
        "apiVersion": "patrickstar.io/v1alpha1", "kind": "PatrickStarJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"numNodes": pods, "nprocPerNode": 1, "device": "cpu",
                 "config": {"model": {"preset": "tiny"}, "train": {"steps": 10}}},
    }


def proc_stats(pid):
    """(CPU seconds used, resident bytes) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return cpu, rss


def operator_writes(api):
    """Write requests so far that the operator made (the benchmark's own are namespaces and jobs)."""
    _, stats = api.call("GET", "/fake/stats")
    total = 0
    for key, n in stats.get("requests", {}).items():
        verb, _, resource = key.partition(" ")
        if verb in WRITES and not (verb == "POST" and resource in ("patrickstarjobs", "namespaces")):
            total += n
    return total


class PodWatch(threading.Thread):
    """Follows pod creations in a namespace: when each job's pod set was complete."""

    def __init__(self, api, ns, pods_per_job):
        super().__init__(daemon=True)
        self.url = f"{api.base}/api/v1/namespaces/{ns}/pods?watch=1&timeoutSeconds=3600"
        self.pods_per_job = pods_per_job
        self.seen = {}      # job -> pods seen
        self.complete = {}  # job -> monotonic time its last pod appeared
        self.lock = threading.Lock()
        self.ready = threading.Event()

    def run(self):
        with urllib.request.urlopen(self.url, timeout=3600) as stream:
            self.ready.set()
            for line in stream:
                event = json.loads(line)
                if event.get("type") != "ADDED":
                    continue
                name = event["object"]["metadata"]["labels"].get("patrickstar.io/job-name")
                with self.lock:
                    self.seen[name] = self.seen.get(name, 0) + 1
                    if self.seen[name] == self.pods_per_job:
                        self.complete[name] = time.monotonic()

    def count(self):
        with self.lock:
            return len(self.complete)


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def run(build, limit, pods_per_job, counts, workers, tmp):
    qps, burst = LIMITS[limit]
    port_file = os.path.join(tmp, "port")
    kubeconfig = os.path.join(tmp, "kubeconfig")
    with open(os.path.join(tmp, "server.log"), "w") as log:
        server = subprocess.Popen(
            ["/usr/bin/python3", os.path.join(ROOT, "tests/fake_kube/fake_apiserver.py"), "--port", "0",
             "--port-file", port_file, "--kubeconfig-out", kubeconfig], stdout=log, stderr=subprocess.STDOUT)
    operator = None
    try:
        api = Api(int(wait_for_file(port_file, 30)))
        with open(os.path.join(ROOT, "crds/patrickstarjob.yaml")) as f:
            crd = yaml.safe_load(f)
        status, body = api.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        if status not in (200, 201):
            sys.exit(f"operator_scale: creating the CRD failed: {status} {body.get('message')}")
        with open(os.path.join(tmp, "operator.log"), "w") as log:
            operator = subprocess.Popen(
                [os.path.join(build, "bin", "pstar-operator"), "--kubeconfig", kubeconfig, "--metrics-port", "0",
                 "--workers", str(workers), "--qps", str(qps), "--burst", str(burst), "--no-node-check"],
                stdout=log, stderr=subprocess.STDOUT)
        time.sleep(1.0)
        for n in counts:
            ns = f"bench-{n}"
            api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": ns}})
            watch = PodWatch(api, ns, pods_per_job)
            watch.start()
            watch.ready.wait(10)
            writes0 = operator_writes(api)
            cpu0, _ = proc_stats(operator.pid)
            created = {}
            start = time.monotonic()
            for i in range(n):
                name = f"job-{i}"
                created[name] = time.monotonic()
                status, body = api.call("POST", f"/apis/patrickstar.io/v1alpha1/namespaces/{ns}/patrickstarjobs",
                                        job(name, ns, pods_per_job))
                if status not in (200, 201):
                    sys.exit(f"operator_scale: creating {name} failed: {status} {body.get('message')}")
            deadline = start + 1800
            while watch.count() < n:
                if time.monotonic() > deadline:
                    sys.exit(f"operator_scale: the pods of {n} jobs were not all created within 1800 s")
                if operator.poll() is not None:
                    sys.exit("operator_scale: the operator exited; see " + tmp)
                time.sleep(0.05)
            took = max(watch.complete.values()) - start
            # Writes that belong to these jobs include status writes after the pods (Created).
            time.sleep(2.0)
            writes = operator_writes(api) - writes0
            cpu1, rss = proc_stats(operator.pid)
            latency = [watch.complete[j] - created[j] for j in created]
            floor = writes / qps if limit == "default" else 0.0
            ratio = f"{took / floor:.2f}" if floor > 0 else "-"
            print(f"{limit:>9} {pods_per_job:>4} {n:>6} {took:>9.2f} {percentile(latency, 50):>8.2f} "
                  f"{percentile(latency, 99):>8.2f} {writes / n:>11.1f} {ratio:>12} {cpu1 - cpu0:>9.2f} "
                  f"{rss / 2**20:>8.1f}", flush=True)
    finally:
        for p in (operator, server):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--counts", default="1,100,1000")
    ap.add_argument("--shapes", default="1,4", help="pods per job")
    ap.add_argument("--limits", default="default,unlimited")
    ap.add_argument("--workers", default="4")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.build, "bin", "pstar-operator")):
        sys.exit(f"operator_scale: {args.build}/bin/pstar-operator is missing; build first (bash scripts/build.sh)")
    counts = [int(c) for c in args.counts.split(",")]
    print("apply -> all pods of each job; the operator holds the jobs of every earlier row of its block")
    print(f"{'limits':>9} {'pods':>4} {'jobs':>6} {'all s':>9} {'p50 s':>8} {'p99 s':>8} {'writes/job':>11} "
          f"{'time/floor':>12} {'op CPU s':>9} {'RSS MiB':>8}")
    for limit in args.limits.split(","):
        if limit not in LIMITS:
            sys.exit(f"operator_scale: --limits {limit}: not one of {', '.join(LIMITS)}")
        for shape in [int(s) for s in args.shapes.split(",")]:
            tmp = tempfile.mkdtemp(prefix="pstar-operator-bench-")
            run(args.build, limit, shape, counts, args.workers, tmp)
    print("time/floor: with the default limits, the time to all pods over (the operator's writes) / QPS "
          "(target <= 1.2); RSS: the operator's after the row (target < 100 MiB at 1000 jobs)")


if __name__ == "__main__":
    main()
