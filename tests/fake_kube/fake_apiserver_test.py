#!/usr/bin/python3
"""Tests of the fake API server: REST semantics, watches, garbage collection,
fault injection, schema validation, the kubelet, and the real kubectl."""

import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "fake_apiserver.py")
REPO = os.path.dirname(os.path.dirname(HERE))
KUBECTL = "/usr/bin/kubectl"

TEST_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "patrickstarjobs.patrickstar.io"},
    "spec": {
        "group": "patrickstar.io", "scope": "Namespaced",
        "names": {"plural": "patrickstarjobs", "singular": "patrickstarjob", "kind": "PatrickStarJob",
                  "listKind": "PatrickStarJobList", "shortNames": ["psj"]},
        "versions": [{
            "name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}},
            "additionalPrinterColumns": [
                {"name": "Nodes", "type": "integer", "jsonPath": ".spec.numNodes"},
                {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {"type": "object", "required": ["numNodes"], "properties": {
                        "numNodes": {"type": "integer", "minimum": 1, "maximum": 64},
                        "nprocPerNode": {"type": "integer", "minimum": 1, "default": 1},
                        "precision": {"type": "string", "enum": ["fp32", "fp16", "bf16"]},
                        "config": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}},
                    "status": {"type": "object", "properties": {
                        "phase": {"type": "string"},
                        "conditions": {"type": "array", "items": {
                            "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}}}}]}}


class Server:
    """The fake API server as a child process on a free port."""

    def __init__(self, *extra, token=None, tls=False):
        self.dir = tempfile.mkdtemp(prefix="fake-kube-test-")
        self.token = token
        args = ["/usr/bin/python3", SERVER, "--port", "0", "--port-file", os.path.join(self.dir, "port"),
                "--kubeconfig-out", os.path.join(self.dir, "kubeconfig"), "--bookmark-interval", "0.2"]
        if token:
            args += ["--token", token]
        self.ctx = None
        if tls:
            args += ["--tls-dir", os.path.join(self.dir, "tls")]
        args += list(extra)
        self.log = open(os.path.join(self.dir, "server.log"), "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        port_file = os.path.join(self.dir, "port")
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("server did not start: " + self.output())
            time.sleep(0.05)
        with open(port_file) as f:
            self.port = int(f.read())
        if tls:
            self.ctx = ssl.create_default_context(cafile=os.path.join(self.dir, "tls", "ca.crt"))
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")

    def conn(self, timeout=30):
        if self.ctx:
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=self.ctx)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def req(self, method, path, body=None, ctype="application/json", headers=None, auth=True):
        c = self.conn()
        h = dict(headers or {})
        if self.token and auth:
            h["Authorization"] = "Bearer " + self.token
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            h["Content-Type"] = ctype
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        c.close()
        try:
            out = json.loads(raw) if raw else None
        except ValueError:
            out = raw.decode()
        return r.status, out

    def ok(self, method, path, body=None, ctype="application/json", want=(200, 201)):
        code, out = self.req(method, path, body, ctype)
        if code not in want:
            raise AssertionError("%s %s -> %d %s" % (method, path, code, out))
        return out

    def watch(self, path, timeout=10):
        """Returns (connection, iterator over events)."""
        c = self.conn(timeout=timeout)
        h = {"Authorization": "Bearer " + self.token} if self.token else {}
        c.request("GET", path, headers=h)
        r = c.getresponse()

        def events():
            while True:
                line = r.readline()
                if not line:
                    return
                yield json.loads(line)
        return c, events()

    def output(self):
        with open(os.path.join(self.dir, "server.log"), errors="replace") as f:
            return f.read()

    def stop(self):
        """Stops the server; returns what it printed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        out = self.output()
        shutil.rmtree(self.dir, ignore_errors=True)
        return out


def wait_for(fn, timeout=10.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def alive(pid):
    """True while pid runs (a zombie counts as gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cm(name, labels=None, owners=None, data=None, finalizers=None):
    meta = {"name": name}
    if labels:
        meta["labels"] = labels
    if owners:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": o["metadata"]["name"],
                                    "uid": o["metadata"]["uid"]} for o in owners]
    if finalizers:
        meta["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data or {"k": "v"}}


CMS = "/api/v1/namespaces/default/configmaps"
PSJ = "/apis/patrickstar.io/v1alpha1/namespaces/default/patrickstarjobs"


class ServerTestCase(unittest.TestCase):
    """Stops the class's server and checks that it never hit an internal error."""

    @classmethod
    def tearDownClass(cls):
        out = cls.s.stop()
        if "Traceback" in out:
            raise AssertionError("the server failed internally:\n" + out)


class RestTest(ServerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Server("--event-history", "200", token="secret-token")
        cls.s.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", TEST_CRD)

    def test_auth_required(self):
        code, body = self.s.req("GET", CMS, auth=False)
        self.assertEqual(code, 401)
        self.assertEqual(body["kind"], "Status")
        self.assertEqual(self.s.req("GET", "/fake/stats", auth=False)[0], 200)

    def test_metadata_rv_uid_generation(self):
        a = self.s.ok("POST", CMS, cm("meta-a"))
        m = a["metadata"]
        self.assertTrue(m["uid"])
        self.assertEqual(m["generation"], 1)
        self.assertEqual(m["namespace"], "default")
        self.assertRegex(m["creationTimestamp"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        b = self.s.ok("POST", CMS, cm("meta-b"))
        self.assertGreater(int(b["metadata"]["resourceVersion"]), int(m["resourceVersion"]))
        a["data"] = {"k": "changed"}
        a2 = self.s.ok("PUT", CMS + "/meta-a", a)
        self.assertEqual(a2["metadata"]["generation"], 2)
        self.assertEqual(a2["metadata"]["uid"], m["uid"])
        a2["metadata"]["labels"] = {"x": "y"}
        a3 = self.s.ok("PUT", CMS + "/meta-a", a2)
        self.assertEqual(a3["metadata"]["generation"], 2, "metadata changes keep the generation")
        g = self.s.ok("POST", CMS, {"metadata": {"generateName": "gen-"}, "data": {}})
        self.assertTrue(g["metadata"]["name"].startswith("gen-") and len(g["metadata"]["name"]) > 4)
        lst = self.s.ok("GET", CMS)
        self.assertEqual(lst["kind"], "ConfigMapList")
        self.assertTrue(all(i["kind"] == "ConfigMap" and i["apiVersion"] == "v1" for i in lst["items"]))
        self.assertTrue(lst["metadata"]["resourceVersion"])

    def test_already_exists_conflict_and_missing_namespace(self):
        a = self.s.ok("POST", CMS, cm("dup"))
        code, body = self.s.req("POST", CMS, cm("dup"))
        self.assertEqual((code, body["reason"]), (409, "AlreadyExists"))
        stale = json.loads(json.dumps(a))
        a["data"] = {"k": "1"}
        self.s.ok("PUT", CMS + "/dup", a)
        stale["data"] = {"k": "2"}
        code, body = self.s.req("PUT", CMS + "/dup", stale)
        self.assertEqual((code, body["reason"], body["status"]), (409, "Conflict", "Failure"))
        del stale["metadata"]["resourceVersion"]
        self.assertEqual(self.s.ok("PUT", CMS + "/dup", stale)["data"], {"k": "2"})
        code, body = self.s.req("POST", "/api/v1/namespaces/nope/configmaps", cm("x"))
        self.assertEqual((code, body["reason"]), (404, "NotFound"))
        code, body = self.s.req("GET", CMS + "/missing")
        self.assertEqual((code, body["reason"], body["details"]["name"]), (404, "NotFound", "missing"))

    def test_status_subresource(self):
        job = {"apiVersion": "patrickstar.io/v1alpha1", "kind": "PatrickStarJob",
               "metadata": {"name": "st"}, "spec": {"numNodes": 2}, "status": {"phase": "Bogus"}}
        j = self.s.ok("POST", PSJ, job)
        self.assertNotIn("status", j, "status is dropped on create")
        self.assertEqual(j["spec"]["nprocPerNode"], 1, "schema default applied")
        j["status"] = {"phase": "Running"}
        j2 = self.s.ok("PUT", PSJ + "/st/status", j)
        self.assertEqual(j2["status"]["phase"], "Running")
        self.assertEqual(j2["metadata"]["generation"], 1)
        j2["status"] = {"phase": "Other"}
        j2["spec"]["numNodes"] = 3
        j3 = self.s.ok("PUT", PSJ + "/st", j2)
        self.assertEqual(j3["status"]["phase"], "Running", "main resource ignores status")
        self.assertEqual(j3["spec"]["numNodes"], 3)
        self.assertEqual(j3["metadata"]["generation"], 2)
        j4 = self.s.ok("PATCH", PSJ + "/st/status", {"spec": {"numNodes": 9}, "status": {"phase": "Done"}},
                       "application/merge-patch+json")
        self.assertEqual((j4["status"]["phase"], j4["spec"]["numNodes"]), ("Done", 3))
        j5 = self.s.ok("PATCH", PSJ + "/st", [{"op": "replace", "path": "/spec/numNodes", "value": 4}],
                       "application/json-patch+json")
        self.assertEqual(j5["spec"]["numNodes"], 4)
        stale = dict(j3)
        code, body = self.s.req("PUT", PSJ + "/st/status", stale)
        self.assertEqual((code, body["reason"]), (409, "Conflict"))

    def test_schema_validation(self):
        bad = {"apiVersion": "patrickstar.io/v1alpha1", "kind": "PatrickStarJob", "metadata": {"name": "bad"},
               "spec": {"numNodes": 0, "precision": "fp8"}}
        code, body = self.s.req("POST", PSJ, bad)
        self.assertEqual((code, body["reason"]), (422, "Invalid"))
        fields = sorted(c["field"] for c in body["details"]["causes"])
        self.assertEqual(fields, ["spec.numNodes", "spec.precision"])
        code, body = self.s.req("POST", PSJ, dict(bad, spec={"numNodes": "two"}))
        self.assertEqual(code, 422)
        self.assertIn("must be of type integer", body["message"])
        code, body = self.s.req("POST", PSJ, dict(bad, spec={}))
        self.assertEqual(code, 422)
        self.assertIn("spec.numNodes: Required value", body["message"])
        unknown = dict(bad, spec={"numNodes": 1, "typo": 1, "config": {"free": 1}})
        code, body = self.s.req("POST", PSJ + "?fieldValidation=Strict", unknown)
        self.assertEqual(code, 400)
        self.assertIn('unknown field "spec.typo"', body["message"])
        ok = self.s.ok("POST", PSJ, unknown)
        self.assertNotIn("typo", ok["spec"], "unknown fields are pruned")
        self.assertEqual(ok["spec"]["config"], {"free": 1}, "preserve-unknown-fields kept")

    def test_label_and_field_selectors(self):
        for name, labels in [("sel-a", {"app": "x", "tier": "web"}), ("sel-b", {"app": "x", "tier": "db"}),
                             ("sel-c", {"app": "y"})]:
            self.s.ok("POST", CMS, cm(name, labels))

        def names(q):
            return sorted(i["metadata"]["name"] for i in self.s.ok("GET", CMS + "?" + q)["items"]
                          if i["metadata"]["name"].startswith("sel-"))
        self.assertEqual(names("labelSelector=app%3Dx"), ["sel-a", "sel-b"])
        self.assertEqual(names("labelSelector=app%3D%3Dx,tier!%3Ddb"), ["sel-a"])
        self.assertEqual(names("labelSelector=tier+in+(web,db)"), ["sel-a", "sel-b"])
        self.assertEqual(names("labelSelector=tier+notin+(web),app"), ["sel-b", "sel-c"])
        self.assertEqual(names("labelSelector=!tier"), ["sel-c"])
        self.assertEqual(names("labelSelector=tier"), ["sel-a", "sel-b"])
        self.assertEqual(names("fieldSelector=metadata.name%3Dsel-c"), ["sel-c"])
        self.assertEqual(names("fieldSelector=metadata.name!%3Dsel-c&labelSelector=app"), ["sel-a", "sel-b"])

    def test_paging_with_continue(self):
        self.s.ok("POST", "/api/v1/namespaces", {"metadata": {"name": "paging"}})
        for i in range(7):
            self.s.ok("POST", "/api/v1/namespaces/paging/configmaps", cm("p%d" % i))
        seen, cont, pages = [], "", 0
        while True:
            page = self.s.ok("GET", "/api/v1/namespaces/paging/configmaps?limit=3" +
                             ("&continue=" + cont if cont else ""))
            pages += 1
            seen += [i["metadata"]["name"] for i in page["items"]]
            cont = page["metadata"].get("continue")
            if not cont:
                break
            self.assertEqual(page["metadata"]["remainingItemCount"], 7 - len(seen))
        self.assertEqual((pages, seen), (3, ["p%d" % i for i in range(7)]))

    def test_watch_from_rv_and_selectors(self):
        start = self.s.ok("GET", CMS + "?labelSelector=w%3D1")["metadata"]["resourceVersion"]
        self.s.ok("POST", CMS, cm("w1", {"w": "1"}))
        self.s.ok("POST", CMS, cm("w-other", {"w": "2"}))
        self.s.ok("PATCH", CMS + "/w1", {"metadata": {"labels": {"w": "3"}}}, "application/merge-patch+json")
        conn, events = self.s.watch(CMS + "?watch=1&labelSelector=w%3D1&resourceVersion=" + start)
        got = [next(events), next(events)]
        conn.close()
        self.assertEqual([(e["type"], e["object"]["metadata"]["name"]) for e in got],
                         [("ADDED", "w1"), ("DELETED", "w1")], "leaving the selection is DELETED")
        # Empty RV: synthetic ADDED for existing objects, then live events.
        conn, events = self.s.watch(CMS + "?watch=true&fieldSelector=metadata.name%3Dw-other")
        first = next(events)
        self.assertEqual((first["type"], first["object"]["metadata"]["name"]), ("ADDED", "w-other"))
        self.s.ok("DELETE", CMS + "/w-other")
        ev = next(events)
        conn.close()
        self.assertEqual((ev["type"], ev["object"]["metadata"]["name"]), ("DELETED", "w-other"))

    def test_bookmarks_and_timeout(self):
        rv = self.s.ok("GET", CMS)["metadata"]["resourceVersion"]
        t0 = time.time()
        conn, events = self.s.watch(CMS + "?watch=1&allowWatchBookmarks=true&timeoutSeconds=1&resourceVersion="
                                    + rv)
        got = list(events)
        conn.close()
        self.assertLess(time.time() - t0, 5)
        bookmarks = [e for e in got if e["type"] == "BOOKMARK"]
        self.assertGreaterEqual(len(bookmarks), 2)
        self.assertEqual(bookmarks[0]["object"]["kind"], "ConfigMap")
        self.assertGreaterEqual(int(bookmarks[-1]["object"]["metadata"]["resourceVersion"]), int(rv))

    def test_expired_after_compact_and_history(self):
        self.s.ok("POST", CMS, cm("compact-1"))
        self.s.ok("POST", CMS, cm("compact-2"))
        old = self.s.ok("GET", CMS)["metadata"]["resourceVersion"]
        page = self.s.ok("GET", CMS + "?limit=1")
        self.s.ok("POST", CMS, cm("compact-me"))
        self.s.ok("POST", "/fake/compact", {})
        conn, events = self.s.watch(CMS + "?watch=1&resourceVersion=" + old)
        ev = next(events)
        self.assertEqual((ev["type"], ev["object"]["code"], ev["object"]["reason"]), ("ERROR", 410, "Expired"))
        self.assertEqual(list(events), [], "the stream closes after the error")
        conn.close()
        code, body = self.s.req("GET", CMS + "?limit=1&continue=" + page["metadata"]["continue"])
        self.assertEqual((code, body["reason"]), (410, "Expired"))
        now = self.s.ok("GET", CMS)["metadata"]["resourceVersion"]
        conn, events = self.s.watch(CMS + "?watch=1&timeoutSeconds=1&resourceVersion=" + now)
        self.assertEqual([e for e in events if e["type"] == "ERROR"], [], "the current RV stays valid")
        conn.close()

    def test_drop_watches(self):
        conn, events = self.s.watch(CMS + "?watch=1&resourceVersion=0")
        it = iter(events)
        wait_for(lambda: self.s.ok("GET", "/fake/stats")["open_watches"] >= 1, what="watch open")
        result = []
        t = threading.Thread(target=lambda: result.extend(list(it)))
        t.start()
        self.s.ok("POST", "/fake/drop-watches", {})
        t.join(5)
        self.assertFalse(t.is_alive(), "the watch stream ended")
        conn.close()

    def test_gc_cascade_foreground_orphan_and_finalizers(self):
        a = self.s.ok("POST", CMS, cm("gc-a"))
        b = self.s.ok("POST", CMS, cm("gc-b", owners=[a]))
        self.s.ok("POST", CMS, cm("gc-c", owners=[b]))
        d = self.s.ok("POST", CMS, cm("gc-d"))
        self.s.ok("POST", CMS, cm("gc-e", owners=[a, d]))
        deleted = self.s.ok("DELETE", CMS + "/gc-a")
        self.assertEqual(deleted["metadata"]["name"], "gc-a")
        for n in ("gc-a", "gc-b", "gc-c"):
            self.assertEqual(self.s.req("GET", CMS + "/" + n)[0], 404, n)
        self.assertEqual(self.s.req("GET", CMS + "/gc-e")[0], 200, "one owner remains")
        # Orphan: the dependent loses its owner reference and stays.
        self.s.ok("DELETE", CMS + "/gc-d?propagationPolicy=Orphan")
        e = self.s.ok("GET", CMS + "/gc-e")
        self.assertNotIn(d["metadata"]["uid"], json.dumps(e["metadata"].get("ownerReferences", [])))
        # Finalizers hold the object until they are removed.
        f = self.s.ok("POST", CMS, cm("gc-f", finalizers=["example.com/hold"]))
        self.s.ok("POST", CMS, cm("gc-g", owners=[f]))
        held = self.s.ok("DELETE", CMS + "/gc-f", {"propagationPolicy": "Foreground"})
        self.assertTrue(held["metadata"]["deletionTimestamp"])
        self.assertEqual(self.s.req("GET", CMS + "/gc-g")[0], 404, "foreground deletes dependents first")
        self.assertEqual(self.s.ok("GET", CMS + "/gc-f")["metadata"]["finalizers"], ["example.com/hold"])
        self.s.ok("PATCH", CMS + "/gc-f", {"metadata": {"finalizers": None}}, "application/merge-patch+json")
        self.assertEqual(self.s.req("GET", CMS + "/gc-f")[0], 404)
        # Preconditions.
        x = self.s.ok("POST", CMS, cm("gc-x"))
        code, body = self.s.req("DELETE", CMS + "/gc-x", {"preconditions": {"uid": "wrong"}})
        self.assertEqual((code, body["reason"]), (409, "Conflict"))
        self.s.ok("DELETE", CMS + "/gc-x", {"preconditions": {"uid": x["metadata"]["uid"]}})

    def test_fault_injection_and_stats(self):
        self.s.ok("POST", "/fake/faults", {"method": "POST", "path": "configmaps$", "status": 500,
                                           "reason": "InternalError", "count": 2})
        codes = [self.s.req("POST", CMS, cm("fault-%d" % i))[0] for i in range(3)]
        self.assertEqual(codes, [500, 500, 201])
        self.s.ok("POST", "/fake/faults", {"method": "*", "path": "fault-0", "status": 429, "count": -1})
        self.assertEqual([self.s.req("GET", CMS + "/fault-0")[0] for _ in range(3)], [429, 429, 429])
        self.s.ok("DELETE", "/fake/faults")
        self.assertEqual(self.s.req("GET", CMS + "/fault-2")[0], 200)
        stats = self.s.ok("GET", "/fake/stats")
        self.assertGreaterEqual(stats["requests"]["POST configmaps"], 3)
        self.assertIn("open_watches", stats)

    def test_patch_kinds_and_apply(self):
        self.s.ok("POST", CMS, cm("pt", data={"a": "1", "b": "2"}))
        out = self.s.ok("PATCH", CMS + "/pt", {"data": {"a": None, "c": "3"}}, "application/merge-patch+json")
        self.assertEqual(out["data"], {"b": "2", "c": "3"})
        out = self.s.ok("PATCH", CMS + "/pt", {"data": {"d": "4"}}, "application/strategic-merge-patch+json")
        self.assertEqual(out["data"], {"b": "2", "c": "3", "d": "4"})
        out = self.s.ok("PATCH", CMS + "/pt", [{"op": "add", "path": "/data/e", "value": "5"},
                                               {"op": "remove", "path": "/data/b"}], "application/json-patch+json")
        self.assertEqual(out["data"], {"c": "3", "d": "4", "e": "5"})
        code, _ = self.s.req("PATCH", CMS + "/pt", [{"op": "test", "path": "/data/c", "value": "x"}],
                             "application/json-patch+json")
        self.assertEqual(code, 422)
        applied = self.s.ok("PATCH", CMS + "/ssa?fieldManager=test",
                            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\ndata:\n  k: v\n",
                            "application/apply-patch+yaml")
        self.assertEqual(applied["data"], {"k": "v"})


class KubeletTest(ServerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.bin = tempfile.mkdtemp(prefix="fake-kube-bin-")
        tool = os.path.join(cls.bin, "hello-tool")
        with open(tool, "w") as f:
            f.write("#!/bin/sh\necho tool-on-path \"$@\"\n")
        os.chmod(tool, 0o755)
        cls.s = Server("--kubelet", "--bin-dir", cls.bin, "--work-dir", os.path.join(cls.bin, "work"),
                       "--node", "node-a:8Gi:8", "--node", "node-b:8Gi:8:2")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.bin, ignore_errors=True)
        super().tearDownClass()

    PODS = "/api/v1/namespaces/default/pods"

    def pod(self, name, command, args=None, env=None, **spec):
        c = {"name": "main", "image": "none", "command": command}
        if args:
            c["args"] = args
        if env:
            c["env"] = env
        if "mounts" in spec:
            c["volumeMounts"] = spec.pop("mounts")
        if "resources" in spec:
            c["resources"] = spec.pop("resources")
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": dict({"restartPolicy": "Never", "containers": [c]}, **spec)}
        return self.s.ok("POST", self.PODS, body)

    def finished(self, name, timeout=10):
        def done():
            p = self.s.ok("GET", self.PODS + "/" + name)
            return p if p["status"].get("phase") in ("Succeeded", "Failed") else None
        return wait_for(done, timeout, "pod %s to finish" % name)

    def log(self, name):
        code, body = self.s.req("GET", self.PODS + "/" + name + "/log")
        self.assertEqual(code, 200)
        return body

    def test_failed_pod_exit_code_and_log(self):
        self.pod("fail", ["sh", "-c", "echo ip=$MY_IP; hello-tool x; exit 3"],
                 env=[{"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}])
        p = self.finished("fail")
        self.assertEqual(p["status"]["phase"], "Failed")
        term = p["status"]["containerStatuses"][0]["state"]["terminated"]
        self.assertEqual((term["exitCode"], term["reason"]), (3, "Error"))
        ip = p["status"]["podIP"]
        self.assertTrue(ip.startswith("127.0.") and ip != "127.0.0.1")
        self.assertIn(p["spec"]["nodeName"], ("node-a", "node-b"))
        self.assertEqual(self.log("fail"), "ip=%s\ntool-on-path x\n" % ip)

    def test_running_status_and_delete_kills(self):
        self.pod("sleeper", ["sh", "-c", "exec sleep 1000"])
        p = wait_for(lambda: (lambda o: o if o["status"].get("phase") == "Running" else None)(
            self.s.ok("GET", self.PODS + "/sleeper")), what="running")
        cs = p["status"]["containerStatuses"][0]
        self.assertTrue(cs["ready"])
        self.assertIn("startedAt", cs["state"]["running"])
        self.assertEqual({c["type"]: c["status"] for c in p["status"]["conditions"]}["Ready"], "True")
        pid = [k for k in self.s.ok("GET", "/fake/kubelet/pods") if k["name"] == "sleeper"][0]["pid"]
        os.kill(pid, 0)
        rv = p["metadata"]["resourceVersion"]
        conn, events = self.s.watch(self.PODS + "?watch=1&fieldSelector=metadata.name%3Dsleeper&resourceVersion="
                                    + rv)
        gone = self.s.ok("DELETE", self.PODS + "/sleeper")
        self.assertTrue(gone["metadata"].get("deletionTimestamp"))
        types = []
        for ev in events:
            types.append(ev["type"])
            if ev["type"] == "DELETED":
                break
        conn.close()
        self.assertEqual(types[-1], "DELETED")
        wait_for(lambda: not alive(pid), what="the process gone")

    def test_configmap_volume_and_var_expansion(self):
        self.s.ok("POST", "/api/v1/namespaces/default/configmaps",
                  {"metadata": {"name": "cfg"}, "data": {"job.yaml": "steps: 5\n", "other": "o\n"}})
        self.pod("vol", ["sh", "-c"],
                 args=["cat /etc/pstar/job.yaml; cat $(CFG)/renamed; echo '$(A)-$(B)-$$(A)-$(NOPE)'; "
                       "test -d /scratch/x || echo scratch=$SCRATCH"],
                 env=[{"name": "A", "value": "alpha"}, {"name": "B", "value": "$(A)beta"},
                      {"name": "CFG", "value": "/etc/other"}, {"name": "SCRATCH", "value": "/scratch"}],
                 mounts=[{"name": "config", "mountPath": "/etc/pstar"}, {"name": "other", "mountPath": "/etc/other"},
                         {"name": "shm", "mountPath": "/scratch"}],
                 volumes=[{"name": "config", "configMap": {"name": "cfg"}},
                          {"name": "other", "configMap": {"name": "cfg", "items": [{"key": "other",
                                                                                    "path": "renamed"}]}},
                          {"name": "shm", "emptyDir": {"medium": "Memory"}}])
        p = self.finished("vol")
        self.assertEqual(p["status"]["phase"], "Succeeded")
        lines = self.log("vol").splitlines()
        self.assertEqual(lines[:3], ["steps: 5", "o", "alpha-alphabeta-$(A)-$(NOPE)"])
        self.assertTrue(lines[3].startswith("scratch=/") and "/volumes/shm" in lines[3], lines[3])

    def test_dns_name_substitution(self):
        self.pod("job-node-0", ["sleep", "30"], hostname="job-node-0", subdomain="job")
        self.pod("job-node-1", ["sh", "-c", "echo $MASTER_ADDR; echo $(MASTER_ADDR):29500"], hostname="job-node-1",
                 subdomain="job",
                 env=[{"name": "MASTER_ADDR", "value": "job-node-0.job.default.svc.cluster.local"}])
        p1 = self.finished("job-node-1")
        p0 = self.s.ok("GET", self.PODS + "/job-node-0")
        ip = p0["status"]["podIP"]
        self.assertNotEqual(ip, p1["status"]["podIP"])
        self.assertEqual(self.log("job-node-1"), "%s\n%s:29500\n" % (ip, ip))
        self.s.ok("DELETE", self.PODS + "/job-node-0?gracePeriodSeconds=0")

    def test_scheduling_resources_and_signal(self):
        self.pod("huge", ["true"], resources={"requests": {"memory": "100Gi"}})
        p = wait_for(lambda: (lambda o: o if o["status"].get("conditions") else None)(
            self.s.ok("GET", self.PODS + "/huge")), what="scheduling decision")
        cond = [c for c in p["status"]["conditions"] if c["type"] == "PodScheduled"][0]
        self.assertEqual((cond["status"], cond["reason"]), ("False", "Unschedulable"))
        self.assertIn("Insufficient memory", cond["message"])
        self.assertFalse(p["spec"].get("nodeName"))
        self.pod("gpu", ["sh", "-c", "sleep 30 & wait"], resources={"limits": {"nvidia.com/gpu": "2"}},
                 nodeSelector={"kubernetes.io/hostname": "node-b"})
        wait_for(lambda: self.s.ok("GET", self.PODS + "/gpu")["status"].get("phase") == "Running", what="gpu")
        self.assertEqual(self.s.ok("GET", self.PODS + "/gpu")["spec"]["nodeName"], "node-b")
        info = wait_for(lambda: [k for k in self.s.ok("GET", "/fake/kubelet/pods")
                                 if k["name"] == "gpu" and k["children"]], what="child process")[0]
        self.s.ok("POST", "/fake/kubelet/signal", {"namespace": "default", "name": "gpu", "signal": 9,
                                                   "target": "main"})
        p = self.finished("gpu")
        term = p["status"]["containerStatuses"][0]["state"]["terminated"]
        self.assertEqual((term["exitCode"], term.get("signal")), (137, 9))
        wait_for(lambda: not alive(info["children"][0]), what="the child killed with the group")


class GangSchedulerTest(ServerTestCase):
    """The gang schedulers the server plays: served APIs, and pods placed only as whole groups."""

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="fake-kube-gang-")
        cls.s = Server("--kubelet", "--work-dir", cls.work, "--gang-scheduler", "volcano",
                       "--gang-scheduler", "kueue")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)
        super().tearDownClass()

    PODS = "/api/v1/namespaces/default/pods"

    def pod(self, name, metadata=None, **spec):
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": dict({"name": name}, **(metadata or {})),
                "spec": dict({"restartPolicy": "Never",
                              "containers": [{"name": "main", "image": "none", "command": ["true"]}]}, **spec)}
        return self.s.ok("POST", self.PODS, body)

    def scheduled(self, name):
        p = self.s.ok("GET", self.PODS + "/" + name)
        cond = [c for c in (p.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"]
        return p, (cond[0] if cond else None)

    def test_discovery_serves_only_the_chosen_schedulers(self):
        self.assertEqual(self.s.req("GET", "/apis/scheduling.volcano.sh/v1beta1")[0], 200)
        self.assertEqual(self.s.req("GET", "/apis/kueue.x-k8s.io/v1beta1")[0], 200)
        self.assertEqual(self.s.req("GET", "/apis/scheduling.x-k8s.io/v1alpha1")[0], 404)

    def test_volcano_places_a_group_only_at_min_member(self):
        volcano = {"annotations": {"scheduling.k8s.io/group-name": "g"}}
        self.pod("v0", volcano, schedulerName="volcano")
        _, cond = wait_for(lambda: (lambda r: r if r[1] else None)(self.scheduled("v0")), what="a decision")
        self.assertEqual((cond["status"], cond["reason"]), ("False", "Unschedulable"))
        self.assertIn("pod group g does not exist", cond["message"])
        self.s.ok("POST", "/apis/scheduling.volcano.sh/v1beta1/namespaces/default/podgroups",
                  {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": "g"},
                   "spec": {"minMember": 2}})
        wait_for(lambda: "has 1 of its minMember 2" in (self.scheduled("v0")[1] or {}).get("message", ""),
                 what="waiting for the second member")
        self.assertFalse(self.scheduled("v0")[0]["spec"].get("nodeName"))
        self.pod("v1", volcano, schedulerName="volcano")
        for name in ("v0", "v1"):
            wait_for(lambda: self.scheduled(name)[0]["spec"].get("nodeName"), what=name + " placed")
        # A scheduler the server does not play never places its pods.
        self.pod("sp", {"labels": {"scheduling.x-k8s.io/pod-group": "g"}}, schedulerName="scheduler-plugins-scheduler")
        _, cond = wait_for(lambda: (lambda r: r if r[1] else None)(self.scheduled("sp")), what="a decision")
        self.assertIn("no scheduler named scheduler-plugins-scheduler", cond["message"])

    def test_kueue_admits_a_complete_group_with_its_queue(self):
        def member(name):
            return self.pod(name, {"labels": {"kueue.x-k8s.io/queue-name": "lq",
                                              "kueue.x-k8s.io/pod-group-name": "kg"},
                                   "annotations": {"kueue.x-k8s.io/pod-group-total-count": "2"}},
                            schedulingGates=[{"name": "kueue.x-k8s.io/admission"}])
        member("k0")
        _, cond = wait_for(lambda: (lambda r: r if r[1] else None)(self.scheduled("k0")), what="a decision")
        self.assertEqual(cond["reason"], "SchedulingGated")
        member("k1")  # the group is whole, but its LocalQueue does not exist
        time.sleep(1.0)
        for name in ("k0", "k1"):
            self.assertTrue(self.scheduled(name)[0]["spec"].get("schedulingGates"), name)
        self.s.ok("POST", "/apis/kueue.x-k8s.io/v1beta1/namespaces/default/localqueues",
                  {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": "lq"},
                   "spec": {"clusterQueue": "cq"}})
        for name in ("k0", "k1"):
            wait_for(lambda: self.scheduled(name)[0]["spec"].get("nodeName"), what=name + " admitted and placed")
            self.assertNotIn("schedulingGates", self.scheduled(name)[0]["spec"])
        wl = self.s.ok("GET", "/apis/kueue.x-k8s.io/v1beta1/namespaces/default/workloads/kg")
        self.assertEqual(wl["spec"]["podSets"][0]["count"], 2)
        self.assertEqual(wl["status"]["conditions"][0]["type"], "Admitted")


class PodSecurityTest(ServerTestCase):
    """Namespaces labelled pod-security.kubernetes.io/enforce refuse pods that violate the level."""

    @classmethod
    def setUpClass(cls):
        cls.s = Server()

    def namespace(self, name, level):
        self.s.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": name, "labels": {
                                                     "pod-security.kubernetes.io/enforce": level}}})

    @staticmethod
    def pod(name, sc=None, pod_sc=None, **spec):
        c = {"name": "main", "image": "none", "command": ["true"]}
        if sc is not None:
            c["securityContext"] = sc
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": dict({"restartPolicy": "Never", "containers": [c]}, **spec)}
        if pod_sc is not None:
            body["spec"]["securityContext"] = pod_sc
        return body

    RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                  "seccompProfile": {"type": "RuntimeDefault"}}

    def test_restricted_refuses_each_violation_and_admits_a_compliant_pod(self):
        self.namespace("locked", "restricted")
        path = "/api/v1/namespaces/locked/pods"
        code, body = self.s.req("POST", path, self.pod("bare"))
        self.assertEqual(code, 403)
        self.assertEqual(body["reason"], "Forbidden")
        for control in ("allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true",
                        "seccompProfile"):
            self.assertIn(control, body["message"])
        self.assertTrue(body["message"].startswith('pods "bare" is forbidden: violates PodSecurity "restricted:latest"'))
        self.assertEqual(self.s.req("POST", path, self.pod("ok", self.RESTRICTED))[0], 201)
        # Pod-level settings count for every container.
        pod_level = dict(self.RESTRICTED)
        run_as = {"runAsNonRoot": pod_level.pop("runAsNonRoot"), "seccompProfile": pod_level.pop("seccompProfile")}
        self.assertEqual(self.s.req("POST", path, self.pod("pod-level", pod_level, run_as))[0], 201)
        code, body = self.s.req("POST", path, self.pod("root", dict(self.RESTRICTED, runAsNonRoot=False)))
        self.assertEqual(code, 403)
        self.assertIn("runAsNonRoot != true", body["message"])
        code, body = self.s.req("POST", path, self.pod("host", self.RESTRICTED, hostNetwork=True,
                                                       volumes=[{"name": "h", "hostPath": {"path": "/"}}]))
        self.assertEqual(code, 403)
        self.assertIn("host namespaces (hostNetwork=true)", body["message"])
        self.assertIn('hostPath volumes (volume "h")', body["message"])

    def test_baseline_and_unlabelled_namespaces(self):
        self.namespace("base", "baseline")
        self.assertEqual(self.s.req("POST", "/api/v1/namespaces/base/pods", self.pod("plain"))[0], 201)
        code, body = self.s.req("POST", "/api/v1/namespaces/base/pods", self.pod("priv", {"privileged": True}))
        self.assertEqual(code, 403)
        self.assertIn('violates PodSecurity "baseline:latest": privileged', body["message"])
        self.assertEqual(self.s.req("POST", "/api/v1/namespaces/default/pods", self.pod("anything",
                                                                                       {"privileged": True}))[0], 201)


class ShutdownTest(unittest.TestCase):
    def test_sigterm_kills_pod_processes(self):
        s = Server("--kubelet")
        try:
            s.ok("POST", "/api/v1/namespaces/pstar/pods", {"metadata": {"name": "forever"}, "spec": {
                "containers": [{"name": "main", "image": "none", "command": ["sh", "-c", "sleep 1000 & wait"]}]}})
            info = wait_for(lambda: [k for k in s.ok("GET", "/fake/kubelet/pods") if k["children"]],
                            what="the pod running")[0]
            self.assertEqual(info["namespace"], "pstar")
        finally:
            out = s.stop()
        self.assertEqual(s.proc.returncode, 0, out)
        wait_for(lambda: not alive(info["pid"]) and not alive(info["children"][0]), what="pod processes killed")


@unittest.skipUnless(os.path.exists(KUBECTL), "kubectl is not installed at " + KUBECTL)
class KubectlTest(ServerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="fake-kube-work-")
        cls.s = Server("--kubelet", "--work-dir", cls.work, token="kc-token", tls=True)
        cls.files = cls.s.dir

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            shutil.rmtree(cls.work, ignore_errors=True)

    def kubectl(self, *args, ok=True):
        env = dict(os.environ, KUBECONFIG=self.s.kubeconfig, HOME=self.files)
        r = subprocess.run([KUBECTL, "--cache-dir", os.path.join(self.files, "cache")] + list(args), env=env,
                           capture_output=True, text=True, timeout=60)
        if ok and r.returncode != 0:
            raise AssertionError("kubectl %s failed: %s%s" % (" ".join(args), r.stdout, r.stderr))
        return r

    def write(self, name, text):
        path = os.path.join(self.files, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_kubectl_workflow(self):
        crd = os.path.join(REPO, "crds", "patrickstarjob.yaml")
        if not (os.path.exists(crd) and os.path.getsize(crd) > 0):
            crd = self.write("crd.json", json.dumps(TEST_CRD))
        self.assertIn("created", self.kubectl("apply", "-f", crd).stdout)
        job = ("apiVersion: patrickstar.io/v1alpha1\nkind: PatrickStarJob\nmetadata:\n  name: demo\n"
               "spec:\n  numNodes: %d\n  config:\n    steps: 1\n")
        path = self.write("job.yaml", job % 0)
        r = self.kubectl("apply", "-f", path, ok=False)
        self.assertNotEqual(r.returncode, 0, "numNodes 0 is below the schema's minimum")
        self.assertIn("spec.numNodes", r.stderr)
        self.write("job.yaml", job % 2)
        self.assertIn("patrickstarjob.patrickstar.io/demo created", self.kubectl("apply", "-f", path).stdout)
        out = self.kubectl("get", "psj").stdout.splitlines()
        self.assertEqual(out[0].split()[0], "NAME")
        self.assertGreater(len(out[0].split()), 2, "printer columns shown")
        self.assertEqual(out[1].split()[0], "demo")
        obj = json.loads(self.kubectl("get", "psj", "demo", "-o", "json").stdout)
        self.assertEqual(obj["spec"]["numNodes"], 2)
        self.write("job.yaml", job % 3)
        self.assertIn("configured", self.kubectl("apply", "-f", path).stdout)
        obj = json.loads(self.kubectl("get", "psj", "demo", "-o", "json").stdout)
        self.assertEqual((obj["spec"]["numNodes"], obj["metadata"]["generation"]), (3, 2))
        stats = self.s.ok("GET", "/fake/stats")["requests"]
        self.assertGreaterEqual(stats.get("PATCH patrickstarjobs", 0), 1)
        self.assertIn('deleted', self.kubectl("delete", "psj", "demo").stdout)
        self.assertIn("No resources found", self.kubectl("get", "psj").stderr)

    def test_kubectl_pods_and_logs(self):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "kc-pod"},
               "spec": {"restartPolicy": "Never", "containers": [
                   {"name": "main", "image": "none", "command": ["sh", "-c", "echo hello from $(POD)"],
                    "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}]}}
        self.kubectl("apply", "-f", self.write("pod.json", json.dumps(pod)))
        wait_for(lambda: "Completed" in self.kubectl("get", "pods").stdout, what="pod completed")
        out = self.kubectl("get", "pods").stdout.splitlines()
        self.assertEqual(out[0].split(), ["NAME", "READY", "STATUS", "RESTARTS", "AGE"])
        self.assertEqual(out[1].split()[:4], ["kc-pod", "0/1", "Completed", "0"])
        self.assertEqual(self.kubectl("logs", "kc-pod").stdout, "hello from kc-pod\n")
        bad = self.kubectl("get", "pods", "--token", "wrong", ok=False)
        self.assertNotEqual(bad.returncode, 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
