#!/usr/bin/python3
"""`helm lint` and `helm template` of charts/patrickstar, and the kinds each
set of values renders. Exits 77 (ctest: skipped) when no helm binary is
found, saying so."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CHART = os.path.join(REPO, "charts", "patrickstar")


def find_helm():
    if os.access("/usr/bin/helm", os.X_OK):
        return "/usr/bin/helm"
    return shutil.which("helm")


HELM = find_helm()


def helm(*args):
    env = dict(os.environ)
    # Keep helm's caches and config out of the user's home.
    scratch = tempfile.mkdtemp(prefix="chart-helm-")
    env.update(HELM_CACHE_HOME=scratch, HELM_CONFIG_HOME=scratch, HELM_DATA_HOME=scratch)
    try:
        return subprocess.run([HELM, *args], capture_output=True, text=True, env=env, timeout=120)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def render(*args):
    out = helm("template", "pstar", CHART, "--namespace", "pstar", *args)
    if out.returncode != 0:
        raise AssertionError("helm template failed:\n" + out.stderr)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def kinds(docs):
    return sorted(d["kind"] for d in docs)


class HelmTest(unittest.TestCase):
    def test_lint(self):
        out = helm("lint", CHART, "--strict")
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)

    def test_default_values(self):
        docs = render()
        self.assertEqual(kinds(docs), sorted([
            "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding",
            "CustomResourceDefinition", "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]))
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        self.assertEqual(container["image"], "ghcr.io/patrickstar-k8s/pstar-operator:0.1.0")
        self.assertIn("--leader-elect", container["args"])
        self.assertIn("--worker-image=ghcr.io/patrickstar-k8s/pstar-worker:0.1.0", container["args"])
        (crd,) = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        with open(os.path.join(REPO, "crds", "patrickstarjob.yaml")) as f:
            canonical = yaml.safe_load(f)
        self.assertEqual(crd["spec"], canonical["spec"])
        self.assertEqual(crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep")

    def test_one_namespace_without_node_check_or_crd(self):
        docs = render("--set", "operator.watchNamespace=ml", "--set", "operator.nodeCheck=false",
                      "--set", "crds.install=false")
        self.assertEqual(kinds(docs), sorted([
            "Deployment", "Role", "Role", "RoleBinding", "RoleBinding", "Service", "ServiceAccount"]))
        roles = {d["metadata"]["name"]: d["metadata"].get("namespace") for d in docs if d["kind"] == "Role"}
        self.assertEqual(sorted(roles.values()), ["ml", "pstar"])
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        self.assertIn("--namespace=ml", args)
        self.assertIn("--no-node-check", args)

    def test_monitoring_and_dashboards(self):
        on = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true",
              "--set", "dashboards.enabled=true"]
        without_api = kinds(render(*on))
        self.assertNotIn("ServiceMonitor", without_api)
        self.assertNotIn("PodMonitor", without_api)
        docs = render(*on, "--api-versions", "monitoring.coreos.com/v1")
        self.assertIn("ServiceMonitor", kinds(docs))
        self.assertIn("PodMonitor", kinds(docs))
        maps = [d for d in docs if d["kind"] == "ConfigMap"]
        dashboards = sorted(f for f in os.listdir(os.path.join(REPO, "dashboards")) if f.endswith(".json"))
        self.assertEqual(sorted(k for m in maps for k in m["data"]), dashboards)
        for m in maps:
            self.assertEqual(m["metadata"]["labels"]["grafana_dashboard"], "1")


if __name__ == "__main__":
    if HELM is None:
        print("SKIPPED: no helm binary (/usr/bin/helm or helm on PATH); helm lint and helm template not run")
        sys.exit(77)
    unittest.main(verbosity=2)
