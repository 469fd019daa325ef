#!/usr/bin/python3
"""Every panel query of the dashboards in dashboards/ returns data from a real
Prometheus that scrapes a running two-rank CPU training job and a running
pstar-operator (against the loopback fake API server).

    prometheus_dashboards_test.py --build BUILD_DIR [unittest options]

BUILD_DIR holds bin/pstar and bin/pstar-operator (also read from
$PSTAR_BUILD_DIR). Exits 77 (skipped) when /usr/bin/prometheus is missing."""

import argparse
import ctypes
import glob
import http.client
import http.server
import json
import os
import re
import shutil
import signal
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PROMETHEUS = "/usr/bin/prometheus"
FAKE_APISERVER = os.path.join(REPO, "tests", "fake_kube", "fake_apiserver.py")
CRD = os.path.join(REPO, "crds", "patrickstarjob.yaml")
DASHBOARDS = sorted(glob.glob(os.path.join(REPO, "dashboards", "*.json")))
SKIP = 77

# The training job's identity, as the worker labels its series.
JOB_NAME = "dash-train"
JOB_NAMESPACE = "team-a"
RANKS = 2
# Grafana's interval variables, as a 1 s scrape interval gives them.
INTERVALS = {"__rate_interval": "5s", "__interval": "5s", "__range": "1m"}
# A small model on byte-level text with a validation split (this
# repository's README and docs/data.md), and a device tier smaller than model
# data plus activations (pstar plan: minimum 148 KiB, all resident 276 KiB),
# so chunks move every step.
SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_JOB = [
    "model.n_layer=2", "model.n_head=2", "model.n_embd=16", "model.vocab_size=256", "model.max_seq_len=12",
    "train.batch_size=4", "train.seq_len=8", "train.threads=1", "train.log_every=100000",
    "train.steps=1000000", "train.eval_every=20", "train.eval_batches=2",
    "data={source: text, path: %s, val_path: %s}" % (os.path.join(SOURCE_DIR, "README.md"),
                                                      os.path.join(SOURCE_DIR, "docs", "data.md")),
    "runtime.device_memory=200KiB",
]
# How long the job and the operator may take until every panel has data.
DEADLINE_S = 45

build_dir = os.environ.get("PSTAR_BUILD_DIR", "")


def ephemeral_range():
    """The kernel's ephemeral port range, where outgoing connections take ports."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


# Ports this process has handed out. A port handed out is free until its
# process binds it, which can be after the next call: without this record the
# Prometheus port, taken while rank 1 was still starting, was once rank 1's
# metrics port.
_handed_out = set()


def free_port(consecutive=1):
    """A loopback port p such that p .. p+consecutive-1 are free now and were
    never handed out before, below the kernel's ephemeral range: a port taken
    from that range can be handed to some process's outgoing connection before
    the job binds it (rank 1's metrics port, p+1, was). The C++ tests take
    theirs from 20000-32000 (tests/test_util.cc); these come from just above,
    to keep apart."""
    low, _ = ephemeral_range()
    first, last = (32000, low - 1) if low - 1 - 32000 >= 200 else (10000, 19999)
    rng = random.Random()
    for _ in range(1000):
        port = rng.randint(first, last - consecutive + 1)
        if any(p in _handed_out for p in range(port, port + consecutive)):
            continue
        ok = True
        for p in range(port, port + consecutive):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            _handed_out.update(range(port, port + consecutive))
            return port
    raise RuntimeError("no free port")


def start_cluster_exporter_fixture(namespace, pod):
    """A /metrics endpoint serving what cAdvisor (through the kubelet),
    kube-state-metrics and NVIDIA's DCGM exporter (with its pod mapping)
    serve for one worker pod: the real series names and labels, plausible
    values, a CPU counter that grows. Returns the running server."""
    started = time.time()
    pod_labels = 'namespace="%s",pod="%s",container="worker"' % (namespace, pod)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            cpu = 1.5 * (time.time() - started)
            lines = [
                "# TYPE container_memory_working_set_bytes gauge",
                'container_memory_working_set_bytes{%s,id="/kubepods/x",image="pstar"} 1.2e+08' % pod_labels,
                "# TYPE container_cpu_usage_seconds_total counter",
                'container_cpu_usage_seconds_total{%s,cpu="total",id="/kubepods/x"} %f' % (pod_labels, cpu),
                "# TYPE kube_pod_container_resource_limits gauge",
                'kube_pod_container_resource_limits{%s,node="n1",resource="memory",unit="byte"} 5e+08' % pod_labels,
                'kube_pod_container_resource_limits{%s,node="n1",resource="cpu",unit="core"} 2' % pod_labels,
                "# TYPE kube_pod_container_status_restarts_total counter",
                'kube_pod_container_status_restarts_total{%s,uid="u1"} 1' % pod_labels,
                "# TYPE kube_pod_container_status_last_terminated_reason gauge",
                'kube_pod_container_status_last_terminated_reason{%s,reason="OOMKilled",uid="u1"} 1' % pod_labels,
                "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
                'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",device="nvidia0",modelName="H100",Hostname="n1",%s} 87'
                % pod_labels,
                "# TYPE DCGM_FI_PROF_PCIE_TX_BYTES gauge",
                'DCGM_FI_PROF_PCIE_TX_BYTES{gpu="0",UUID="GPU-0",device="nvidia0",modelName="H100",Hostname="n1",%s} '
                "2.1e+09" % pod_labels,
                "# TYPE DCGM_FI_PROF_PCIE_RX_BYTES gauge",
                'DCGM_FI_PROF_PCIE_RX_BYTES{gpu="0",UUID="GPU-0",device="nvidia0",modelName="H100",Hostname="n1",%s} '
                "9.5e+09" % pod_labels,
            ]
            body = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def http_request(port, method, path, body=None, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def wait_for(check, timeout, interval=0.2):
    end = time.monotonic() + timeout
    while True:
        try:
            if check():
                return True
        except OSError:
            pass
        if time.monotonic() >= end:
            return False
        time.sleep(interval)


PR_SET_PDEATHSIG = 1


def die_with_parent():
    """In the child: get SIGKILL when the test process dies (e.g. killed at
    the ctest timeout), so no server outlives it."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Process:
    """A child process in its own process group, its output in a file; it
    dies with the test."""

    def __init__(self, name, argv, workdir, env=None):
        self.name = name
        self.log_path = os.path.join(workdir, name + ".log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir,
                                     env=env, start_new_session=True, preexec_fn=die_with_parent)

    def running(self):
        return self.proc.poll() is None

    def output(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-3000:]

    def stop(self):
        if self.running():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


class Prometheus:
    """The Prometheus HTTP API."""

    def __init__(self, port):
        self.port = port

    def get(self, path, **params):
        query = urllib.parse.urlencode(params, doseq=True)
        status, body = http_request(self.port, "GET", path + ("?" + query if query else ""))
        reply = json.loads(body)
        if status != 200 or reply.get("status") != "success":
            raise AssertionError("%s %s: HTTP %d: %s" % (path, params, status, body[:500]))
        return reply["data"]

    def query(self, expr):
        return self.get("/api/v1/query", query=expr)["result"]


def variable_query(variable):
    q = variable.get("query")
    return q.get("query", "") if isinstance(q, dict) else q


def substitute(text, values, multi):
    """Replaces $name and ${name} as Grafana does for Prometheus: a multi-value
    variable becomes a regex alternation."""

    def one(m):
        name = m.group(1) or m.group(2)
        if name in INTERVALS:
            return INTERVALS[name]
        if name not in values:
            raise AssertionError("unresolved variable $%s in %s" % (name, text))
        vals = values[name]
        if name in multi and len(vals) > 1:
            return "(" + "|".join(re.escape(v) for v in vals) + ")"
        return vals[0]

    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", one, text)


class PrometheusDashboardsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="pstar-dashboards-")
        cls.processes = []
        try:
            cls.start_everything()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for p in reversed(cls.processes):
            p.stop()
        if getattr(cls, "fixture", None) is not None:
            cls.fixture.shutdown()
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def spawn(cls, name, argv, env=None):
        p = Process(name, argv, cls.dir, env)
        cls.processes.append(p)
        return p

    @classmethod
    def start_everything(cls):
        pstar = os.path.join(build_dir, "bin", "pstar")
        operator = os.path.join(build_dir, "bin", "pstar-operator")
        for b in (pstar, operator):
            if not os.access(b, os.X_OK):
                raise AssertionError("%s is not built (pass --build or set PSTAR_BUILD_DIR)" % b)

        # The fake API server, the CRD, and one small job for the operator to run.
        port_file = os.path.join(cls.dir, "apiserver.port")
        kubeconfig = os.path.join(cls.dir, "kubeconfig")
        api = cls.spawn("apiserver", ["/usr/bin/python3", FAKE_APISERVER, "--port", "0", "--port-file", port_file,
                                      "--kubeconfig-out", kubeconfig])
        if not wait_for(lambda: os.path.exists(port_file), 20):
            raise AssertionError("the fake API server did not start:\n" + api.output())
        with open(port_file) as f:
            api_port = int(f.read())
        with open(CRD) as f:
            crd = yaml.safe_load(f)
        status, body = http_request(api_port, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                    crd)
        if status != 201:
            raise AssertionError("creating the CRD: HTTP %d %s" % (status, body[:500]))
        # The operator's job has the training job's name and namespace, as in a
        # cluster (the operator sets PSTAR_JOB_NAME and PSTAR_NAMESPACE), so the
        # per-job operator panels find it through $namespace and $job. Without
        # a kubelet its pods never run; the ranks below are started directly.
        status, body = http_request(api_port, "POST", "/api/v1/namespaces",
                                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOB_NAMESPACE}})
        if status != 201:
            raise AssertionError("creating the namespace: HTTP %d %s" % (status, body[:500]))
        job = {
            "apiVersion": "patrickstar.io/v1alpha1", "kind": "PatrickStarJob",
            "metadata": {"name": JOB_NAME, "namespace": JOB_NAMESPACE},
            "spec": {"numNodes": 1, "nprocPerNode": 1, "device": "cpu", "metricsPort": 0,
                     "config": {"model": {"n_layer": 2, "n_head": 2, "n_embd": 16, "vocab_size": 40,
                                          "max_seq_len": 12},
                                "data": {"source": "generated", "generated_tokens": 20000},
                                "train": {"batch_size": 4, "seq_len": 8, "steps": 10, "threads": 1}}}}
        status, body = http_request(api_port, "POST",
                                    "/apis/patrickstar.io/v1alpha1/namespaces/%s/patrickstarjobs" % JOB_NAMESPACE,
                                    job)
        if status != 201:
            raise AssertionError("creating the job: HTTP %d %s" % (status, body[:500]))

        # The operator (no nodes without the fake kubelet: skip the fit check).
        cls.operator_port = free_port()
        cls.operator = cls.spawn("operator", [operator, "--kubeconfig", kubeconfig, "--metrics-address", "127.0.0.1",
                                              "--metrics-port", str(cls.operator_port), "--no-node-check"])

        # The training job: two ranks, metrics on base and base + 1.
        cls.metrics_port = free_port(RANKS)
        env = dict(os.environ, PSTAR_JOB_NAME=JOB_NAME, PSTAR_NAMESPACE=JOB_NAMESPACE, OMP_NUM_THREADS="1")
        argv = [pstar, "launch", "--nproc-per-node", str(RANKS), "--master-port", str(free_port()),
                "--rdzv-id", "dashboards-test", "--", "train", "--set", "metrics.port=%d" % cls.metrics_port,
                "--set", "metrics.bind_address=127.0.0.1"]
        for s in TINY_JOB:
            argv += ["--set", s]
        # Its optimizer moments on a disk tier, for the disk panels.
        nvme = os.path.join(cls.dir, "nvme")
        os.makedirs(nvme)
        argv += ["--set", "runtime.nvme_path=" + nvme]
        cls.train = cls.spawn("train", argv, env)

        # The cluster's exporters, as a fixture: cAdvisor, kube-state-metrics
        # and DCGM series with their real names and labels for the job's pod,
        # so the dashboards' pod panels are evaluated too.
        cls.fixture = start_cluster_exporter_fixture(JOB_NAMESPACE, JOB_NAME + "-node-0")

        # Prometheus, scraping every second.
        cls.prom_port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                # job and namespace are target labels, as docs/monitoring.md
                # shows for a static setup (the PodMonitor sets them in a cluster).
                {"job_name": "pstar-workers", "static_configs": [
                    {"targets": ["127.0.0.1:%d" % (cls.metrics_port + r) for r in range(RANKS)],
                     "labels": {"job": JOB_NAME, "namespace": JOB_NAMESPACE}}]},
                {"job_name": "pstar-operator", "static_configs": [
                    {"targets": ["127.0.0.1:%d" % cls.operator_port]}]},
                # As a kubelet's cAdvisor endpoint or kube-state-metrics are
                # scraped: their namespace and pod labels are kept.
                {"job_name": "cluster-exporters", "honor_labels": True, "static_configs": [
                    {"targets": ["127.0.0.1:%d" % cls.fixture.server_port]}]},
            ],
        }
        config_path = os.path.join(cls.dir, "prometheus.yml")
        with open(config_path, "w") as f:
            yaml.safe_dump(config, f)
        prom = cls.spawn("prometheus", [PROMETHEUS, "--config.file=" + config_path,
                                        "--storage.tsdb.path=" + os.path.join(cls.dir, "tsdb"),
                                        "--web.listen-address=127.0.0.1:%d" % cls.prom_port,
                                        "--log.level=warn"])
        cls.prometheus = Prometheus(cls.prom_port)
        if not wait_for(lambda: http_request(cls.prom_port, "GET", "/-/ready", timeout=2)[0] == 200, 30):
            raise AssertionError("Prometheus did not become ready:\n" + prom.output())
        cls.started = time.monotonic()

    def check_alive(self):
        for p in self.processes:
            self.assertTrue(p.running(), "%s exited (code %s):\n%s" % (p.name, p.proc.returncode, p.output()))

    def resolve_variables(self, dashboard):
        """Each query variable's values, from its label_values() query through
        /api/v1/series, in order (later queries use earlier values)."""
        values, multi = {}, set()
        for v in dashboard["templating"]["list"]:
            if v["type"] == "datasource":
                continue
            m = re.match(r"^label_values\((?:(.+),\s*)?(\w+)\)$", variable_query(v))
            self.assertIsNotNone(m, v["name"])
            selector = substitute(m.group(1), values, multi)
            series = self.prometheus.get("/api/v1/series", **{"match[]": selector, "start": time.time() - 300})
            found = sorted({s[m.group(2)] for s in series if m.group(2) in s})
            if not found and v.get("includeAll") and "allValue" in v:
                # A label the setup does not have (cluster on one Prometheus):
                # Grafana offers "All", whose regex also matches series without it.
                values[v["name"]] = [v["allValue"]]
                continue
            if not found:
                return None, "variable $%s: %s has no series with label %s" % (v["name"], selector, m.group(2))
            values[v["name"]] = found
            if v.get("multi") or v.get("includeAll"):
                multi.add(v["name"])
        return (values, multi), None

    def failing_panels(self, dashboard, resolved):
        """Panels (title: query) whose queries return no series."""
        values, multi = resolved
        failures = []
        for p in dashboard["panels"] + [q for p in dashboard["panels"] for q in p.get("panels", [])]:
            for t in p.get("targets", []):
                expr = substitute(t["expr"], values, multi)
                where = "%s / panel %d %r / %s" % (dashboard["uid"], p["id"], p["title"], t["refId"])
                try:
                    result = self.prometheus.query(expr)
                except AssertionError as e:  # a query Prometheus rejects never gets better
                    self.fail("%s: %s" % (where, e))
                if not result:
                    failures.append("%s: %s" % (where, expr))
        # Annotation queries fire only on events (a restart), so what is
        # checked is that their series, with the dashboard's filters, exist.
        for a in dashboard.get("annotations", {}).get("list", []):
            if "expr" not in a:
                continue
            selector = re.search(r"[a-z_]+\{[^}]*\}", a["expr"])
            self.assertIsNotNone(selector, a["name"])
            expr = substitute(selector.group(0), values, multi)
            where = "%s / annotation %r" % (dashboard["uid"], a["name"])
            try:
                result = self.prometheus.query(expr)
            except AssertionError as e:
                self.fail("%s: %s" % (where, e))
            if not result:
                failures.append("%s: %s" % (where, expr))
        return failures

    def evaluate_all(self):
        """Polls until every panel of every dashboard has data, or the deadline."""
        failures = ["nothing evaluated"]
        resolved = {}
        while time.monotonic() - self.started < DEADLINE_S:
            self.check_alive()
            failures = []
            for path in DASHBOARDS:
                with open(path, encoding="utf-8") as f:
                    d = json.load(f)
                r, why = self.resolve_variables(d)
                if why:
                    failures.append("%s: %s" % (d["uid"], why))
                    continue
                # Every rank's series, not the first scraped: a rank scraped
                # later would be missing from the variable's values.
                ranks = r[0].get("rank")
                if ranks is not None and ranks != [str(k) for k in range(RANKS)]:
                    failures.append("%s: variable $rank has %s so far" % (d["uid"], ranks))
                    continue
                resolved[d["uid"]] = r
                failures += self.failing_panels(d, r)
            if not failures:
                return resolved
            time.sleep(1)
        self.fail("after %d s, queries without data:\n  %s" % (DEADLINE_S, "\n  ".join(failures)))

    def test_every_panel_has_data(self):
        self.assertGreaterEqual(len(DASHBOARDS), 2)
        resolved = self.evaluate_all()
        for uid, (values, _) in resolved.items():
            with self.subTest(dashboard=uid):
                self.assertIn(JOB_NAMESPACE, values["namespace"])
                self.assertEqual(values["job"], [JOB_NAME])
                self.assertEqual(values["rank"], [str(r) for r in range(RANKS)])

        # The panels measure the job: it trains, moves chunks both ways and
        # runs collectives; the operator saw its job.
        sel = 'namespace="%s", job="%s"' % (JOB_NAMESPACE, JOB_NAME)
        positive = {
            "tokens/s": "sum(rate(patrickstar_tokens_total{%s}[5s]))" % sel,
            "h2d bytes/s": 'sum(rate(patrickstar_chunk_moved_bytes_total{%s, direction="h2d"}[5s]))' % sel,
            "d2h bytes/s": 'sum(rate(patrickstar_chunk_moved_bytes_total{%s, direction="d2h"}[5s]))' % sel,
            "all_gather bytes/s": 'sum(rate(patrickstar_collective_bytes_total{%s, op="all_gather"}[5s]))' % sel,
            "device resident bytes": 'sum(patrickstar_chunk_resident_bytes{%s, tier="device"})' % sel,
            "operator jobs": "sum(patrickstar_operator_jobs)",
            "operator reconciles": "sum(patrickstar_operator_reconciles_total)",
        }
        for what, expr in positive.items():
            with self.subTest(value=what):
                result = self.prometheus.query(expr)
                self.assertTrue(result, expr)
                self.assertGreater(float(result[0]["value"][1]), 0, expr)
        # The operator's per-job series: one phase (the current one) and the
        # restarts of the job the variables selected; none for other names.
        op_sel = 'namespace="%s", name="%s"' % (JOB_NAMESPACE, JOB_NAME)
        phases = self.prometheus.query("patrickstar_operator_job_phase{%s}" % op_sel)
        self.assertEqual(len(phases), 1, phases)
        self.assertEqual(float(phases[0]["value"][1]), 1)
        self.assertIn(phases[0]["metric"]["phase"], ("Pending", "Created", "Running"))
        restarts = self.prometheus.query("patrickstar_operator_job_restarts{%s}" % op_sel)
        self.assertEqual(len(restarts), 1, restarts)
        self.assertEqual(float(restarts[0]["value"][1]), 0)
        self.assertEqual(self.prometheus.query('patrickstar_operator_job_phase{name!="%s"}' % JOB_NAME), [])
        # Chunks stay within the device tier's budget.
        over = self.prometheus.query(
            'sum by (rank) (patrickstar_chunk_resident_bytes{%s, tier="device"}) > '
            "max by (rank) (patrickstar_chunk_budget_bytes{%s})" % (sel, sel))
        self.assertEqual(over, [])


def main():
    global build_dir
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--build", default=build_dir)
    args, rest = parser.parse_known_args()
    build_dir = args.build
    if not os.access(PROMETHEUS, os.X_OK):
        print("SKIP: %s is missing (Debian package prometheus)" % PROMETHEUS)
        sys.exit(SKIP)
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
