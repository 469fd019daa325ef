#!/usr/bin/python3
"""Checks of the Helm chart that need no helm binary.

- The chart ships the repository's CRD and dashboards unchanged (its files are
  links to them; a copy would have to be byte-identical).
- Every .Values path a template uses exists in values.yaml and every key on
  the way is documented by a comment line above it.
- Templates are well formed: balanced {{ }}, block actions matched by {{ end }},
  and once the actions are blanked out each manifest is YAML with apiVersion,
  kind and metadata.name.
- The RBAC rules are exactly the least-privilege set the operator needs.
- The Deployment always runs leader election and the hardened security context.
- Versions and image names agree across Chart.yaml, values.yaml, the project
  and the operator's default worker image.
"""

import glob
import json
import os
import re
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CHART = os.path.join(REPO, "charts", "patrickstar")
TEMPLATES = os.path.join(CHART, "templates")

ACTION = re.compile(r"{{.*?}}", re.S)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def template_files():
    return sorted(glob.glob(os.path.join(TEMPLATES, "*")))


def blank_actions(text):
    """The template with its actions gone: a line holding only actions is
    dropped, any other action becomes the scalar X."""
    sentinel = "\x00"
    replaced = ACTION.sub(sentinel, text)
    lines = []
    for line in replaced.split("\n"):
        if sentinel in line and line.replace(sentinel, "").strip() == "":
            continue
        lines.append(line.replace(sentinel, "X"))
    return "\n".join(lines)


def manifests(name):
    """The YAML documents of templates/<name> with the actions blanked out."""
    docs = yaml.safe_load_all(blank_actions(read(os.path.join(TEMPLATES, name))))
    return [d for d in docs if d]


def values_key_lines(text):
    """{dotted path: documented?} for every mapping key in values.yaml; a key
    is documented when the line above it is a comment."""
    keys = {}
    stack = []  # (indent, key)
    previous = ""
    for line in text.split("\n"):
        m = re.match(r"^( *)([A-Za-z_][A-Za-z0-9_.-]*):(\s|$)", line)
        if m:
            indent = len(m.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, m.group(2)))
            keys[".".join(k for _, k in stack)] = previous.lstrip().startswith("#")
        if line.strip():
            previous = line
    return keys


class ChartFilesTest(unittest.TestCase):
    def test_chart_yaml(self):
        chart = yaml.safe_load(read(os.path.join(CHART, "Chart.yaml")))
        self.assertEqual(chart["apiVersion"], "v2")
        self.assertEqual(chart["name"], "patrickstar")
        self.assertEqual(chart["version"], "0.1.0")
        self.assertEqual(chart["appVersion"], "0.1.0")
        # The app version is the project's.
        project = re.search(r"project\(patrickstar VERSION ([0-9.]+)", read(os.path.join(REPO, "CMakeLists.txt")))
        self.assertIsNotNone(project)
        self.assertEqual(chart["appVersion"], project.group(1))

    def test_crd_is_the_repository_crd(self):
        shipped = os.path.join(CHART, "files", "crds", "patrickstarjob.yaml")
        canonical = os.path.join(REPO, "crds", "patrickstarjob.yaml")
        self.assertTrue(os.path.exists(shipped), shipped + " is missing (or a dangling link)")
        self.assertEqual(read(shipped), read(canonical),
                         "the chart's CRD drifted from crds/patrickstarjob.yaml: run scripts/sync-chart-files.sh")
        # The template renders that file, and Helm's own crds/ directory (which
        # cannot be turned off) holds no second copy.
        self.assertIn('.Files.Get "files/crds/patrickstarjob.yaml"', read(os.path.join(TEMPLATES, "crd.yaml")))
        self.assertIn("if .Values.crds.install", read(os.path.join(TEMPLATES, "crd.yaml")))
        self.assertFalse(os.path.exists(os.path.join(CHART, "crds")))

    def test_dashboards_are_the_repository_dashboards(self):
        canonical = sorted(glob.glob(os.path.join(REPO, "dashboards", "*.json")))
        self.assertTrue(canonical, "dashboards/*.json is empty")
        shipped_dir = os.path.join(CHART, "files", "dashboards")
        shipped = sorted(os.listdir(shipped_dir))
        self.assertEqual(shipped, [os.path.basename(p) for p in canonical],
                         "charts/patrickstar/files/dashboards must hold exactly dashboards/*.json")
        for path in canonical:
            name = os.path.basename(path)
            target = os.path.join(shipped_dir, name)
            self.assertTrue(os.path.exists(target), target + " is a dangling link")
            self.assertEqual(read(target), read(path), name + " drifted: run scripts/sync-chart-files.sh")
        self.assertIn('.Files.Glob "files/dashboards/*.json"', read(os.path.join(TEMPLATES, "dashboards.yaml")))

    def test_alerts_are_the_repository_alerts(self):
        shipped = os.path.join(CHART, "files", "alerts", "patrickstar.rules.yaml")
        canonical = os.path.join(REPO, "alerts", "patrickstar.rules.yaml")
        self.assertEqual(read(shipped), read(canonical), "the chart's alerts drifted: run scripts/sync-chart-files.sh")
        template = read(os.path.join(TEMPLATES, "prometheusrule.yaml"))
        # Read as data (Files.Get), so the rules' own {{ $labels }} are not templated.
        self.assertIn('.Files.Get "files/alerts/patrickstar.rules.yaml" | fromYaml', template)
        self.assertIn("toYaml $rules.groups", template)
        groups = yaml.safe_load(read(canonical))["groups"]
        alerts = [r["alert"] for g in groups for r in g["rules"]]
        self.assertEqual(len(alerts), 7)

    def test_the_chart_is_self_contained(self):
        # No links: a chart copied out of the repository (or packaged) must
        # carry its files, not point back into the tree.
        for root, dirs, files in os.walk(CHART):
            for name in files + dirs:
                path = os.path.join(root, name)
                self.assertFalse(os.path.islink(path), path + " is a link: run scripts/sync-chart-files.sh")

    def test_a_copied_chart_renders_its_files(self):
        # The copy holds the CRD and the dashboards by itself.
        import shutil
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "patrickstar")
            shutil.copytree(CHART, copy, symlinks=True)
            self.assertTrue(os.path.isfile(os.path.join(copy, "files", "crds", "patrickstarjob.yaml")))
            crd = yaml.safe_load(read(os.path.join(copy, "files", "crds", "patrickstarjob.yaml")))
            self.assertEqual(crd["kind"], "CustomResourceDefinition")
            for path in glob.glob(os.path.join(copy, "files", "dashboards", "*.json")):
                self.assertIsInstance(json.loads(read(path)), dict)


class ValuesTest(unittest.TestCase):
    def setUp(self):
        self.text = read(os.path.join(CHART, "values.yaml"))
        self.values = yaml.safe_load(self.text)
        self.keys = values_key_lines(self.text)

    def referenced_paths(self):
        paths = set()
        for path in template_files():
            for m in re.finditer(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", read(path)):
                paths.add(m.group(1)[1:])
        return paths

    def test_templates_use_values(self):
        self.assertGreater(len(self.referenced_paths()), 20)

    def test_every_referenced_value_exists_and_is_documented(self):
        for path in sorted(self.referenced_paths()):
            with self.subTest(path=path):
                node = self.values
                parts = path.split(".")
                for i, part in enumerate(parts):
                    self.assertIsInstance(node, dict, "values." + ".".join(parts[:i]) + " is not a mapping")
                    self.assertIn(part, node, "values." + path + " is not in values.yaml")
                    node = node[part]
                    prefix = ".".join(parts[: i + 1])
                    self.assertIn(prefix, self.keys)
                    self.assertTrue(self.keys[prefix], "values." + prefix + " has no comment line above it")

    def test_every_top_level_and_second_level_key_is_documented(self):
        for path, documented in self.keys.items():
            if path.count(".") <= 1:
                with self.subTest(path=path):
                    self.assertTrue(documented, "values." + path + " has no comment line above it")

    def test_defaults(self):
        v = self.values
        self.assertEqual(v["operator"]["replicas"], 1)
        self.assertEqual(v["operator"]["image"]["repository"], "ghcr.io/patrickstar-k8s/pstar-operator")
        self.assertEqual(v["worker"]["image"]["repository"], "ghcr.io/patrickstar-k8s/pstar-worker")
        self.assertEqual(v["operator"]["image"]["tag"], "")  # = appVersion
        self.assertEqual(v["worker"]["image"]["tag"], "")
        self.assertEqual(v["operator"]["metricsPort"], 8080)
        self.assertTrue(v["crds"]["install"])
        self.assertTrue(v["operator"]["nodeCheck"])
        self.assertEqual(v["dashboards"]["labels"], {"grafana_dashboard": "1"})
        pod = v["operator"]["podSecurityContext"]
        self.assertTrue(pod["runAsNonRoot"])
        self.assertEqual(pod["runAsUser"], 65532)
        self.assertEqual(pod["seccompProfile"], {"type": "RuntimeDefault"})
        c = v["operator"]["securityContext"]
        self.assertTrue(c["runAsNonRoot"])
        self.assertEqual(c["runAsUser"], 65532)
        self.assertTrue(c["readOnlyRootFilesystem"])
        self.assertFalse(c["allowPrivilegeEscalation"])
        self.assertEqual(c["capabilities"], {"drop": ["ALL"]})
        self.assertEqual(c["seccompProfile"], {"type": "RuntimeDefault"})
        self.assertIn("requests", v["operator"]["resources"])
        self.assertIn("limits", v["operator"]["resources"])

    def test_default_worker_image_matches_the_operator(self):
        header = read(os.path.join(REPO, "operator", "job", "desired_objects.h"))
        m = re.search(r'worker_image = "([^"]+):([^"]+)"', header)
        self.assertIsNotNone(m)
        chart = yaml.safe_load(read(os.path.join(CHART, "Chart.yaml")))
        self.assertEqual(m.group(1), self.values["worker"]["image"]["repository"])
        self.assertEqual(m.group(2), chart["appVersion"])


class TemplatesTest(unittest.TestCase):
    def test_actions_are_balanced(self):
        for path in template_files():
            with self.subTest(template=os.path.basename(path)):
                text = read(path)
                self.assertEqual(text.count("{{"), text.count("}}"))
                # No action left open before the next one starts.
                depth = 0
                for token in re.findall(r"{{|}}", text):
                    depth += 1 if token == "{{" else -1
                    self.assertIn(depth, (0, 1))
                self.assertEqual(depth, 0)

    def test_blocks_are_closed(self):
        for path in template_files():
            with self.subTest(template=os.path.basename(path)):
                depth = 0
                for action in ACTION.findall(read(path)):
                    body = action.strip("{}").strip("-").strip()
                    if body.startswith("/*"):
                        continue
                    word = body.split()[0] if body.split() else ""
                    if word in ("if", "range", "with", "define", "block"):
                        depth += 1
                    elif word == "end":
                        depth -= 1
                        self.assertGreaterEqual(depth, 0, action)
                self.assertEqual(depth, 0)

    def test_defines_are_namespaced_and_includes_resolve(self):
        defined = set()
        for path in template_files():
            defined |= set(re.findall(r'define "([^"]+)"', read(path)))
        self.assertTrue(all(d.startswith("patrickstar.") for d in defined), defined)
        for path in template_files():
            for name in re.findall(r'include "([^"]+)"', read(path)):
                self.assertIn(name, defined, os.path.basename(path))

    def test_manifests_are_yaml_objects(self):
        kinds = []
        for path in template_files():
            name = os.path.basename(path)
            if name.startswith("_") or name.endswith(".txt") or name == "crd.yaml":
                continue
            with self.subTest(template=name):
                docs = manifests(name)
                self.assertTrue(docs)
                for doc in docs:
                    self.assertIsInstance(doc, dict)
                    self.assertIn("apiVersion", doc)
                    self.assertIn("metadata", doc)
                    self.assertIn("name", doc["metadata"])
                    kinds.append(doc["kind"])
        for want in ("Deployment", "ServiceAccount", "Service", "RoleBinding", "ClusterRole",
                     "ClusterRoleBinding", "Role", "ServiceMonitor", "PodMonitor", "ConfigMap"):
            self.assertIn(want, kinds)

    def test_monitors_need_the_prometheus_operator_api_and_a_toggle(self):
        helpers = read(os.path.join(TEMPLATES, "_helpers.tpl"))
        self.assertIn('.Capabilities.APIVersions.Has "monitoring.coreos.com/v1"', helpers)
        for name, toggle in (("servicemonitor.yaml", ".Values.metrics.serviceMonitor.enabled"),
                             ("podmonitor.yaml", ".Values.metrics.podMonitor.enabled"),
                             ("prometheusrule.yaml", ".Values.metrics.prometheusRule.enabled")):
            first = read(os.path.join(TEMPLATES, name)).split("\n")[0]
            self.assertIn(toggle, first)
            self.assertIn('include "patrickstar.hasMonitoringApi"', first)

    def test_pod_monitor_selects_worker_metrics_ports(self):
        (pm,) = manifests("podmonitor.yaml")
        self.assertEqual(pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"], "pstar-worker")
        (endpoint,) = pm["spec"]["podMetricsEndpoints"]
        keep = [r for r in endpoint["relabelings"] if r.get("action") == "keep"]
        self.assertEqual(keep, [{"sourceLabels": ["__meta_kubernetes_pod_container_port_name"],
                                 "regex": "metrics-.*", "action": "keep"}])
        # job comes from the pod's job-name label (namespace from the pod, added
        # by prometheus-operator); the workers set neither, so nothing to honor.
        self.assertNotIn("honorLabels", endpoint)
        self.assertIn({"sourceLabels": ["__meta_kubernetes_pod_label_patrickstar_io_job_name"],
                       "targetLabel": "job", "action": "replace"}, endpoint["relabelings"])

    def test_service_monitor_keeps_the_operators_job_labels(self):
        (sm,) = manifests("servicemonitor.yaml")
        (endpoint,) = sm["spec"]["endpoints"]
        self.assertEqual(endpoint["port"], "metrics")
        # patrickstar_operator_job_* carry the job's namespace, not the operator's.
        self.assertTrue(endpoint["honorLabels"])

    def test_dashboard_config_maps(self):
        (cm,) = manifests("dashboards.yaml")
        self.assertEqual(cm["kind"], "ConfigMap")
        text = read(os.path.join(TEMPLATES, "dashboards.yaml"))
        self.assertTrue(text.startswith("{{- if .Values.dashboards.enabled }}"))
        self.assertIn("$root.Values.dashboards.labels", text)


class DeploymentTest(unittest.TestCase):
    def setUp(self):
        (self.deployment,) = manifests("deployment.yaml")
        self.pod = self.deployment["spec"]["template"]["spec"]
        (self.container,) = self.pod["containers"]
        self.text = read(os.path.join(TEMPLATES, "deployment.yaml"))

    def test_leader_election_is_unconditional(self):
        args = self.container["args"]
        self.assertIn("--leader-elect", args)
        self.assertIn("--identity=$(POD_NAME)", args)
        self.assertIn("--leader-election-namespace=$(POD_NAMESPACE)", args)
        # Not inside any {{ if }}: the line before the flag is no action.
        before = self.text.split("- --leader-elect\n")[0].rstrip().split("\n")[-1]
        self.assertNotIn("{{", before)

    def test_flags_come_from_values(self):
        for flag, value in (("--workers", "operator.workers"), ("--cluster-domain", "operator.clusterDomain"),
                            ("--qps", "operator.qps"), ("--burst", "operator.burst"),
                            ("--metrics-port", "operator.metricsPort"), ("--namespace", None),
                            ("--worker-image", None), ("--no-node-check", None)):
            with self.subTest(flag=flag):
                self.assertRegex(self.text, r"- " + re.escape(flag) + r"(=|\n)")
                if value:
                    self.assertRegex(self.text, re.escape(flag) + r"={{ \.Values\." + re.escape(value))
        self.assertIn('{{- if not .Values.operator.nodeCheck }}\n            - --no-node-check', self.text)
        self.assertIn('- --worker-image={{ include "patrickstar.workerImage" . }}', self.text)

    def test_every_flag_is_one_the_operator_knows(self):
        main = read(os.path.join(REPO, "operator", "main.cc"))
        known = set(re.findall(r'name == "(--[a-z-]+)"', main))
        self.assertIn("--leader-elect", known)
        for flag in re.findall(r"^\s*- (--[a-z-]+)", self.text, re.M):
            self.assertIn(flag, known)

    def test_env_from_downward_api(self):
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in self.container["env"]}
        self.assertEqual(env, {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"})

    def test_probes_on_the_metrics_port(self):
        (port,) = self.container["ports"]
        self.assertEqual(port["name"], "metrics")
        self.assertEqual(self.container["livenessProbe"]["httpGet"], {"path": "/healthz", "port": "metrics"})
        self.assertEqual(self.container["readinessProbe"]["httpGet"], {"path": "/readyz", "port": "metrics"})

    def test_security_context_and_resources_from_values(self):
        self.assertIn("toYaml .Values.operator.securityContext", self.text)
        self.assertIn("toYaml .Values.operator.podSecurityContext", self.text)
        self.assertIn("toYaml .Values.operator.resources", self.text)
        # The read-only root filesystem gets a writable /tmp.
        self.assertEqual(self.container["volumeMounts"], [{"name": "tmp", "mountPath": "/tmp"}])


class RbacTest(unittest.TestCase):
    """The rules, by role: exactly what the operator calls, nothing more."""

    EXPECTED = {
        "jobs": {
            ("patrickstar.io", "patrickstarjobs"): {"get", "list", "watch", "delete"},
            ("patrickstar.io", "patrickstarjobs/status"): {"get", "update", "patch"},
            ("patrickstar.io", "patrickstarjobs/finalizers"): {"update"},
            ("", "pods"): {"get", "list", "watch", "create", "delete"},
            ("", "services"): {"get", "list", "watch", "create", "delete"},
            ("", "configmaps"): {"get", "list", "watch", "create", "update", "delete"},
            ("", "secrets"): {"get", "list", "watch", "create", "delete"},
            ("networking.k8s.io", "networkpolicies"): {"get", "list", "watch", "create", "delete"},
            # Each only with its operator.gangScheduler (test_gang_rules_follow_the_scheduler).
            ("scheduling.volcano.sh", "podgroups"): {"get", "create"},
            ("scheduling.x-k8s.io", "podgroups"): {"get", "create"},
            ("", "events"): {"create", "patch"},
        },
        "nodes": {("", "nodes"): {"get", "list", "watch"}},
        "leader-election": {("coordination.k8s.io", "leases"): {"get", "create", "update"}},
    }

    def setUp(self):
        self.docs = manifests("rbac.yaml")
        self.text = read(os.path.join(TEMPLATES, "rbac.yaml"))

    @staticmethod
    def rules_of(doc):
        out = {}
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out.setdefault((group, resource), set()).update(rule["verbs"])
        return out

    def role(self, suffix):
        # The jobs role's kind is an action (Role or ClusterRole), blanked to X.
        for doc in self.docs:
            if "rules" in doc and doc["metadata"]["name"] == "X" + suffix:
                return doc
        self.fail("no role named *" + suffix)

    def test_rules(self):
        self.assertEqual(self.rules_of(self.role("")), self.EXPECTED["jobs"])
        self.assertEqual(self.rules_of(self.role("-nodes")), self.EXPECTED["nodes"])
        self.assertEqual(self.rules_of(self.role("-leader-election")), self.EXPECTED["leader-election"])
        self.assertNotIn("*", self.text)

    def test_lease_updates_are_limited_to_the_lease(self):
        role = self.role("-leader-election")
        self.assertEqual(role["kind"], "Role")
        for rule in role["rules"]:
            if set(rule["verbs"]) & {"get", "update"}:
                self.assertIn("resourceNames", rule)

    def test_gang_rules_follow_the_scheduler(self):
        self.assertIn('{{- if eq .Values.operator.gangScheduler "volcano" }}\n  - apiGroups: [scheduling.volcano.sh]',
                      self.text)
        self.assertIn('{{- else if eq .Values.operator.gangScheduler "scheduler-plugins" }}\n'
                      '  - apiGroups: [scheduling.x-k8s.io]', self.text)

    def test_scope_follows_watch_namespace(self):
        self.assertIn('ternary "Role" "ClusterRole" (ne $watchNs "")', self.text)
        self.assertIn('ternary "RoleBinding" "ClusterRoleBinding" (ne $watchNs "")', self.text)
        self.assertIn("{{- if .Values.operator.nodeCheck }}", self.text)

    def test_bindings_name_the_service_account(self):
        for doc in self.docs:
            if doc["kind"].endswith("Binding"):
                (subject,) = doc["subjects"]
                self.assertEqual(subject["kind"], "ServiceAccount")


class ImagesTest(unittest.TestCase):
    """The Dockerfiles build the images the chart and the examples name."""

    def test_dockerfiles(self):
        worker = read(os.path.join(REPO, "docker", "worker.Dockerfile"))
        operator = read(os.path.join(REPO, "docker", "operator.Dockerfile"))
        self.assertRegex(worker, r"(?m)^FROM nvidia/cuda:\S+-devel-\S+ AS build")
        self.assertRegex(worker, r"(?m)^FROM nvidia/cuda:\S+-runtime-\S+")
        self.assertRegex(worker, r'(?m)^ENTRYPOINT \["/usr/local/bin/pstar"\]')
        self.assertRegex(worker, r"(?m)^USER \d+")
        # CPU pods on NVIDIA-runtime nodes must not see the node's GPUs.
        self.assertRegex(worker, r"(?m)^ENV NVIDIA_VISIBLE_DEVICES=void$")
        self.assertRegex(operator, r"(?m)^FROM debian:12\.\d+ AS build")
        self.assertRegex(operator, r"(?m)^FROM debian:12\.\d+-slim")
        self.assertRegex(operator, r"(?m)^USER 65532:65532")
        self.assertRegex(operator, r'(?m)^ENTRYPOINT \["/usr/local/bin/pstar-operator"\]')
        cpu = read(os.path.join(REPO, "docker", "worker-cpu.Dockerfile"))
        self.assertRegex(cpu, r"(?m)^FROM debian:12\.\d+ AS build")
        self.assertRegex(cpu, r"(?m)^FROM debian:12\.\d+-slim$")
        self.assertIn("-DPSTAR_WITH_CUDA=OFF", cpu)
        self.assertNotIn("nvidia", cpu.split("FROM debian:12")[-1])
        self.assertRegex(cpu, r'(?m)^ENTRYPOINT \["/usr/local/bin/pstar"\]')
        self.assertRegex(cpu, r"(?m)^USER 10001:10001")
        for text in (worker, operator, cpu):
            self.assertIn("-DPSTAR_NATIVE_ARCH=OFF", text)  # images run on any CPU of the arch
            # Bases pinned to exact tags: a Debian point release, a CUDA patch release.
            for base in re.findall(r"(?m)^FROM (\S+)", text):
                self.assertRegex(base, r"^(debian:12\.\d+(-slim)?|nvidia/cuda:\$\{CUDA_VERSION\}-\S+)$", base)
        self.assertRegex(worker, r"(?m)^ARG CUDA_VERSION=\d+\.\d+\.\d+$")

    def test_docs_name_the_images(self):
        install = read(os.path.join(REPO, "docs", "install.md"))
        for image in ("ghcr.io/patrickstar-k8s/pstar-operator:0.1.0", "ghcr.io/patrickstar-k8s/pstar-worker:0.1.0",
                      "ghcr.io/patrickstar-k8s/pstar-worker-cpu:0.1.0"):
            self.assertIn(image, install)


if __name__ == "__main__":
    unittest.main(verbosity=2)
