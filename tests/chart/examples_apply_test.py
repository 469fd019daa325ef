#!/usr/bin/python3
"""The example jobs against the CRD schema, as an API server sees them.

Starts the fake API server (tests/fake_kube), creates the CRD from
crds/patrickstarjob.yaml, then creates every examples/jobs/*.yaml (each must
be accepted, with the schema's defaults filled in) and every
tests/chart/invalid/*.yaml (each must be refused with the status and the
field named in its `# expect: STATUS FIELD` line).
"""

import glob
import http.client
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SERVER = os.path.join(REPO, "tests", "fake_kube", "fake_apiserver.py")
CRD = os.path.join(REPO, "crds", "patrickstarjob.yaml")
EXAMPLES = sorted(glob.glob(os.path.join(REPO, "examples", "jobs", "*.yaml")))
INVALID = sorted(glob.glob(os.path.join(HERE, "invalid", "*.yaml")))
JOBS = "/apis/patrickstar.io/v1alpha1/namespaces/{ns}/patrickstarjobs"


class FakeApiServer:
    """The fake API server as a child process on a free port."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="chart-examples-")
        port_file = os.path.join(self.dir, "port")
        self.log = open(os.path.join(self.dir, "server.log"), "wb")
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", SERVER, "--port", "0", "--port-file", port_file,
             "--kubeconfig-out", os.path.join(self.dir, "kubeconfig")],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                self.close()
                raise RuntimeError("the fake API server did not start")
            time.sleep(0.05)
        with open(port_file) as f:
            self.port = int(f.read())

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            data = json.dumps(body) if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            text = resp.read().decode()
            return resp.status, (json.loads(text) if text else {})
        finally:
            conn.close()

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def expectation(path):
    """The (status, field) of a file's `# expect: STATUS FIELD` line."""
    with open(path) as f:
        for line in f:
            m = re.match(r"#\s*expect:\s*(\d+)\s+(\S+)\s*$", line)
            if m:
                return int(m.group(1)), m.group(2)
    raise AssertionError(path + " has no '# expect: STATUS FIELD' line")


class ExamplesApplyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = FakeApiServer()
        status, body = cls.server.request(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", load(CRD))
        if status != 201:
            cls.server.close()
            raise AssertionError("creating the CRD: %d %s" % (status, body))

    @classmethod
    def tearDownClass(cls):
        cls.server.close()

    def create(self, job, strict=True):
        query = "?fieldValidation=Strict" if strict else ""
        return self.server.request("POST", JOBS.format(ns="default") + query, job)

    def test_there_are_examples_and_invalid_manifests(self):
        names = [os.path.basename(p) for p in EXAMPLES]
        for want in ("tiny-cpu.yaml", "gpt2-124m.yaml", "gpt2-1.5b.yaml", "gpt-10b.yaml"):
            self.assertIn(want, names)
        self.assertGreaterEqual(len(INVALID), 6)

    def test_every_example_is_accepted(self):
        for path in EXAMPLES:
            with self.subTest(example=os.path.basename(path)):
                job = load(path)
                status, body = self.create(job)
                self.assertEqual(status, 201, body)
                # Stored as given (nothing pruned), with the schema's defaults.
                spec = body["spec"]
                for key in job["spec"]:
                    self.assertIn(key, spec)
                self.assertEqual(spec["config"], job["spec"]["config"])
                self.assertIn("masterPort", spec)
                self.assertEqual(spec["device"], job["spec"]["device"])
                status, got = self.server.request(
                    "GET", JOBS.format(ns="default") + "/" + job["metadata"]["name"])
                self.assertEqual(status, 200, got)
                self.assertEqual(got["spec"], spec)

    def test_example_names_are_unique(self):
        names = [load(p)["metadata"]["name"] for p in EXAMPLES]
        self.assertEqual(len(names), len(set(names)), names)

    def test_every_invalid_manifest_is_refused_naming_the_field(self):
        for path in INVALID:
            with self.subTest(manifest=os.path.basename(path)):
                want_status, field = expectation(path)
                status, body = self.create(load(path))
                self.assertEqual(status, want_status, body)
                self.assertEqual(body.get("kind"), "Status", body)
                self.assertIn(field, body.get("message", ""), body)
                if want_status == 422:
                    self.assertEqual(body.get("reason"), "Invalid", body)
                    causes = body.get("details", {}).get("causes", [])
                    self.assertTrue(any(c.get("field", "").startswith(field) for c in causes), body)
                # Nothing was stored.
                name = load(path)["metadata"]["name"]
                status, _ = self.server.request("GET", JOBS.format(ns="default") + "/" + name)
                self.assertEqual(status, 404)

    def test_an_unknown_field_without_strict_validation_is_pruned(self):
        job = load(os.path.join(HERE, "invalid", "unknown-spec-field.yaml"))
        job["metadata"]["name"] = "pruned"
        status, body = self.create(job, strict=False)
        self.assertEqual(status, 201, body)
        self.assertNotIn("gpus", body["spec"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
