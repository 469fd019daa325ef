#!/usr/bin/python3
"""Operator scale benchmark: time from creating N PatrickStarJobs to all of
their pods created, and the operator's CPU and memory while it holds them.

Runs the loopback fake API server (tests/fake_kube, no kubelet: pods stay
Pending, so only the operator's work is measured) and a real pstar-operator
process. Usage: bench/operator_scale.py [--build build] [--counts 1,100,1000]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wait_for_file(path, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return open(path).read().strip()
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


def job(name, ns):
    return {
        "apiVersion": "patrickstar.io/v1alpha1", "kind": "PatrickStarJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"numNodes": 2, "nprocPerNode": 1, "device": "cpu",
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


def count_pods(api, ns):
    status, body = api.call("GET", f"/api/v1/namespaces/{ns}/pods")
    return len(body.get("items", [])) if status == 200 else -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--counts", default="1,100,1000")
    ap.add_argument("--workers", default="4")
    args = ap.parse_args()
    operator_bin = os.path.join(args.build, "bin", "pstar-operator")
    if not os.path.exists(operator_bin):
        sys.exit(f"operator_scale: {operator_bin} is missing; build first (bash scripts/build.sh)")

    tmp = tempfile.mkdtemp(prefix="pstar-operator-bench-")
    port_file = os.path.join(tmp, "port")
    kubeconfig = os.path.join(tmp, "kubeconfig")
    server = subprocess.Popen(
        ["/usr/bin/python3", os.path.join(ROOT, "tests/fake_kube/fake_apiserver.py"), "--port", "0",
         "--port-file", port_file, "--kubeconfig-out", kubeconfig],
        stdout=open(os.path.join(tmp, "server.log"), "w"), stderr=subprocess.STDOUT)
    operator = None
    try:
        api = Api(int(wait_for_file(port_file, 30)))
        with open(os.path.join(ROOT, "crds/patrickstarjob.yaml")) as f:
            import yaml
            crd = yaml.safe_load(f)
        status, body = api.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        if status not in (200, 201):
            sys.exit(f"operator_scale: creating the CRD failed: {status} {body.get('message')}")
        operator = subprocess.Popen(
            [operator_bin, "--kubeconfig", kubeconfig, "--metrics-port", "0", "--workers", args.workers,
             "--qps", "100000", "--burst", "100000"],
            stdout=open(os.path.join(tmp, "operator.log"), "w"), stderr=subprocess.STDOUT)
        time.sleep(1.0)
        print(f"{'jobs':>6} {'pods':>6} {'create s':>9} {'all pods s':>11} {'jobs/s':>8} "
              f"{'op CPU s':>9} {'op RSS MiB':>11}")
        for n in [int(c) for c in args.counts.split(",")]:
            ns = f"bench-{n}"
            api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": ns}})
            cpu0, _ = proc_stats(operator.pid)
            start = time.monotonic()
            for i in range(n):
                status, body = api.call("POST", f"/apis/patrickstar.io/v1alpha1/namespaces/{ns}/patrickstarjobs",
                                        job(f"job-{i}", ns))
                if status not in (200, 201):
                    sys.exit(f"operator_scale: creating job-{i} failed: {status} {body.get('message')}")
            created = time.monotonic() - start
            want = 2 * n
            deadline = start + 600
            while count_pods(api, ns) < want:
                if time.monotonic() > deadline:
                    sys.exit(f"operator_scale: {want} pods not created within 600 s")
                if operator.poll() is not None:
                    sys.exit("operator_scale: the operator exited; see " + tmp)
                time.sleep(0.05)
            took = time.monotonic() - start
            cpu1, rss = proc_stats(operator.pid)
            print(f"{n:>6} {want:>6} {created:>9.2f} {took:>11.2f} {n / took:>8.1f} {cpu1 - cpu0:>9.2f} "
                  f"{rss / 2**20:>11.1f}", flush=True)
        # Holding every job: idle CPU over 10 s, and memory.
        cpu0, _ = proc_stats(operator.pid)
        time.sleep(10)
        cpu1, rss = proc_stats(operator.pid)
        total = sum(int(c) for c in args.counts.split(","))
        print(f"holding {total} jobs: operator CPU {100 * (cpu1 - cpu0) / 10:.1f}% of one core, "
              f"RSS {rss / 2**20:.1f} MiB")
    finally:
        for p in (operator, server):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()
