#!/usr/bin/python3
"""Static checks of the Grafana dashboards in dashboards/: the JSON model,
the template variables, panel ids and layout, and that every query uses the
data source variable, the job's variables and series that docs/metrics.md or
docs/operator.md documents. Whether the queries parse and return data is
checked against a real Prometheus by prometheus_dashboards_test.py."""

import glob
import json
import os
import re
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DASHBOARDS = sorted(glob.glob(os.path.join(REPO, "dashboards", "*.json")))

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Variables Grafana itself defines.
BUILTINS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__all"}
# The selector every worker series must carry, so that the job's variables pick the data.
WORKER_FILTERS = ('cluster=~"$cluster"', 'namespace="$namespace"', 'job="$job"', 'rank=~"$rank"')
# The operator's per-job series name the PatrickStarJob in `name` (its `job`
# label, if any, is Prometheus' scrape job); the job's variables pick it.
PER_JOB_OPERATOR_SERIES = ("patrickstar_operator_job_phase", "patrickstar_operator_job_restarts")
PER_JOB_OPERATOR_FILTERS = ('cluster=~"$cluster"', 'namespace="$namespace"', 'name="$job"')
LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\)$")
VARIABLE_REF = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
METRIC = re.compile(r"\b(patrickstar_[a-zA-Z0-9_]+)")
# Series of the cluster's own exporters the dashboards read, by their real
# names, and how they must select the job's worker containers (the
# operator names pods <job>-node-<i>, the container "worker").
EXTERNAL_SERIES = re.compile(r"\b((?:container|kube_pod_container)_[a-z_]+|DCGM_FI_[A-Z_]+)\b")
POD_FILTERS = ('cluster=~"$cluster"', 'namespace="$namespace"', 'pod=~"$job-node-[0-9]+"', 'container="worker"')


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def all_panels(dashboard):
    """Every panel, those inside collapsed rows included."""
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def variable_query(variable):
    q = variable.get("query")
    return q.get("query", "") if isinstance(q, dict) else q


def documented_series():
    """Series names from the tables of docs/metrics.md and docs/operator.md."""
    names = set()
    for doc in ("metrics.md", "operator.md"):
        with open(os.path.join(REPO, "docs", doc), encoding="utf-8") as f:
            for line in f:
                m = re.match(r"^\|\s*`((?:patrickstar|pstar_operator)_\w+)`", line)
                if m:
                    names.add(m.group(1))
    return names


def base_series(name, documented):
    """The documented series a query name belongs to (histograms add suffixes)."""
    if name in documented:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in documented:
            return name[: -len(suffix)]
    return None


def selectors(expr, metric):
    """The label matchers of every occurrence of `metric` in expr ('' when it has none)."""
    out = []
    for m in re.finditer(re.escape(metric) + r"\b(\{[^}]*\})?", expr):
        out.append(m.group(1) or "")
    return out


class DashboardJsonTest(unittest.TestCase):
    def test_the_dashboards_exist(self):
        names = {os.path.basename(p) for p in DASHBOARDS}
        self.assertTrue({"pstar-job-overview.json", "pstar-chunks.json"} <= names, names)

    def test_model(self):
        uids = set()
        for path in DASHBOARDS:
            with self.subTest(dashboard=os.path.basename(path)):
                d = load(path)
                self.assertEqual(d["schemaVersion"], 39)
                self.assertTrue(d.get("title"))
                self.assertIn("patrickstar", d.get("tags", []))
                self.assertRegex(d.get("uid", ""), r"^[a-zA-Z0-9_-]{1,40}$")
                self.assertNotIn(d["uid"], uids, "uid used twice")
                uids.add(d["uid"])
                self.assertNotIn("id", d, "a dashboard id is assigned on import; leave it out")

    def test_variables(self):
        for path in DASHBOARDS:
            d = load(path)
            variables = d["templating"]["list"]
            names = [v["name"] for v in variables]
            with self.subTest(dashboard=os.path.basename(path)):
                self.assertEqual(names, ["datasource", "cluster", "namespace", "job", "rank"])
                ds = variables[0]
                self.assertEqual(ds["type"], "datasource")
                self.assertEqual(ds["query"], "prometheus")
                # One Prometheus without a cluster label, or a global view over
                # several: "All" (the default) is a regex that also matches
                # series without the label.
                cluster = variables[1]
                self.assertTrue(cluster.get("includeAll"))
                self.assertEqual(cluster.get("allValue"), ".*")
                self.assertEqual(cluster["current"].get("value"), "$__all")
                rank = variables[4]
                self.assertTrue(rank.get("includeAll") and rank.get("multi"), "rank offers All")
            defined = set()
            for v in variables:
                with self.subTest(dashboard=os.path.basename(path), variable=v["name"]):
                    if v["type"] != "datasource":
                        self.assertEqual(v["type"], "query")
                        self.assertEqual(v["datasource"], DATASOURCE)
                        q = variable_query(v)
                        m = LABEL_VALUES.match(q)
                        self.assertIsNotNone(m, "not a label_values(...) query: %r" % q)
                        self.assertEqual(m.group("label"), v["name"])
                        self.assertEqual(v.get("definition", q), q)
                        # A variable's query may only use variables defined before it,
                        # so Grafana can resolve them in order.
                        for ref in VARIABLE_REF.findall(q):
                            name = ref[0] or ref[1]
                            self.assertIn(name, defined, "%s refers to %s before it is defined" % (q, name))
                        self.assertGreaterEqual(v.get("refresh", 0), 1, "never refreshed")
                    defined.add(v["name"])

    def test_panels_ids_and_layout(self):
        for path in DASHBOARDS:
            d = load(path)
            panels = all_panels(d)
            self.assertGreater(len(panels), 5)
            ids = [p.get("id") for p in panels]
            with self.subTest(dashboard=os.path.basename(path)):
                self.assertTrue(all(isinstance(i, int) for i in ids), ids)
                self.assertEqual(len(ids), len(set(ids)), "panel ids repeat: %s" % ids)
            cells = {}
            for p in panels:
                with self.subTest(dashboard=os.path.basename(path), panel=p.get("title")):
                    g = p.get("gridPos")
                    self.assertIsNotNone(g, "no gridPos")
                    for k in ("h", "w", "x", "y"):
                        self.assertIsInstance(g.get(k), int, k)
                    self.assertGreater(g["w"], 0)
                    self.assertGreater(g["h"], 0)
                    self.assertLessEqual(g["x"] + g["w"], 24)
                    for x in range(g["x"], g["x"] + g["w"]):
                        for y in range(g["y"], g["y"] + g["h"]):
                            self.assertNotIn((x, y), cells, "overlaps panel %r" % cells.get((x, y)))
                            cells[(x, y)] = p.get("title")

    def test_panels_query_through_the_variables(self):
        documented = documented_series()
        with open(os.path.join(REPO, "docs", "monitoring.md"), encoding="utf-8") as f:
            monitoring_doc = f.read()
        self.assertIn("patrickstar_chunk_resident_bytes", documented)
        self.assertIn("patrickstar_operator_jobs", documented)
        for name in PER_JOB_OPERATOR_SERIES:
            self.assertIn(name, documented)
        for path in DASHBOARDS:
            d = load(path)
            defined = {v["name"] for v in d["templating"]["list"]} | BUILTINS
            for p in all_panels(d):
                if p["type"] == "row":
                    continue
                with self.subTest(dashboard=os.path.basename(path), panel=p.get("title")):
                    self.assertTrue(p.get("title"))
                    self.assertEqual(p.get("datasource"), DATASOURCE)
                    self.assertTrue(p["fieldConfig"]["defaults"].get("unit"), "no unit")
                    targets = p.get("targets", [])
                    self.assertTrue(targets, "no targets")
                    refs = [t["refId"] for t in targets]
                    self.assertEqual(len(refs), len(set(refs)), "refIds repeat")
                    for t in targets:
                        self.assertEqual(t.get("datasource"), DATASOURCE)
                        expr = t.get("expr", "")
                        self.assertTrue(expr.strip(), "empty expr")
                        self.assertEqual(expr.count("("), expr.count(")"), expr)
                        self.assertEqual(expr.count("{"), expr.count("}"), expr)
                        self.assertEqual(expr.count('"') % 2, 0, expr)
                        for ref in VARIABLE_REF.findall(expr):
                            self.assertIn(ref[0] or ref[1], defined, "undefined variable in %s" % expr)
                        metrics = METRIC.findall(expr)
                        external = EXTERNAL_SERIES.findall(expr)
                        if external:
                            # The cluster's exporters (cAdvisor, kube-state-metrics, DCGM):
                            # the job's worker containers, picked by pod name.
                            self.assertFalse(metrics, "one panel query, one source: %s" % expr)
                            for name in external:
                                self.assertIn(name, monitoring_doc, "%s is not in docs/monitoring.md" % name)
                                for sel in selectors(expr, name):
                                    for f in POD_FILTERS:
                                        self.assertIn(f, sel, "%s without %s in %s" % (name, f, expr))
                            continue
                        self.assertTrue(metrics, "no PatrickStar series in %s" % expr)
                        for name in metrics:
                            self.assertIsNotNone(base_series(name, documented),
                                                 "%s is not documented in docs/metrics.md or docs/operator.md"
                                                 % name)
                            # Worker series (the operator's, patrickstar_operator_*, are not per rank).
                            if name.startswith("patrickstar_") and not name.startswith("patrickstar_operator_"):
                                for sel in selectors(expr, name):
                                    for f in WORKER_FILTERS:
                                        self.assertIn(f, sel, "%s without %s in %s" % (name, f, expr))
                            if name in PER_JOB_OPERATOR_SERIES:
                                for sel in selectors(expr, name):
                                    for f in PER_JOB_OPERATOR_FILTERS:
                                        self.assertIn(f, sel, "%s without %s in %s" % (name, f, expr))

    def test_restarts_are_annotated(self):
        """Both dashboards mark gang restarts (the operator's count of them)
        and rank restarts (a worker process's start time changing), each
        through the dashboard's variables."""
        for path in DASHBOARDS:
            d = load(path)
            with self.subTest(dashboard=os.path.basename(path)):
                queries = {a["name"]: a for a in d["annotations"]["list"] if "expr" in a}
                self.assertEqual(set(queries), {"Gang restarts", "Rank restarts"})
                for a in queries.values():
                    self.assertEqual(a.get("datasource"), DATASOURCE)
                    self.assertTrue(a.get("enable"))
                gang = queries["Gang restarts"]["expr"]
                self.assertIn("patrickstar_operator_job_restarts{", gang)
                for f in PER_JOB_OPERATOR_FILTERS:
                    self.assertIn(f, gang)
                rank = queries["Rank restarts"]["expr"]
                self.assertIn("process_start_time_seconds{", rank)
                for f in WORKER_FILTERS:
                    self.assertIn(f, rank)

    def test_job_overview_shows_the_selected_jobs_phase_and_restarts(self):
        d = load(os.path.join(REPO, "dashboards", "pstar-job-overview.json"))
        used = set()
        for p in all_panels(d):
            for t in p.get("targets", []):
                for name in PER_JOB_OPERATOR_SERIES:
                    if name in t.get("expr", ""):
                        used.add(name)
                        if name == "patrickstar_operator_job_phase":
                            # Only the phase the job is in now, not every phase it had in the range.
                            self.assertTrue(t.get("instant"), p["title"])
        self.assertEqual(used, set(PER_JOB_OPERATOR_SERIES))


if __name__ == "__main__":
    unittest.main()
