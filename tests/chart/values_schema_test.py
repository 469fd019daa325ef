#!/usr/bin/python3
"""charts/patrickstar/values.schema.json: Helm checks values against it on
install, upgrade, lint and template, so a misspelt or mistyped --set is
refused before anything reaches the cluster. Checked here with Debian's
python3-jsonschema: the schema is valid draft 7, values.yaml passes it, it
covers every value (and nothing else), and bad values are refused naming
the value.
"""
import copy
import json
import os
import unittest

import jsonschema
import yaml

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(REPO, "charts", "patrickstar")


def load():
    with open(os.path.join(CHART, "values.schema.json")) as f:
        schema = json.load(f)
    with open(os.path.join(CHART, "values.yaml")) as f:
        values = yaml.safe_load(f)
    return schema, values


def with_value(values, dotted, value):
    """values with one key set, as `helm --set dotted=value` would."""
    out = copy.deepcopy(values)
    node = out
    keys = dotted.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return out


def schema_paths(schema, prefix=""):
    """Dotted paths of every declared property (not inside free-form objects)."""
    out = set()
    for key, sub in (schema.get("properties") or {}).items():
        path = prefix + key
        out.add(path)
        if sub.get("additionalProperties") is False:
            out |= schema_paths(sub, path + ".")
    return out


def value_paths(values, schema, prefix=""):
    out = set()
    for key, value in values.items():
        path = prefix + key
        out.add(path)
        sub = (schema.get("properties") or {}).get(key, {})
        if isinstance(value, dict) and sub.get("additionalProperties") is False:
            out |= value_paths(value, sub, path + ".")
    return out


class ValuesSchemaTest(unittest.TestCase):
    def setUp(self):
        self.schema, self.values = load()
        self.validator = jsonschema.Draft7Validator(self.schema)

    def errors(self, values):
        return [(".".join(str(p) for p in e.absolute_path), e.message) for e in self.validator.iter_errors(values)]

    def test_the_schema_is_valid_and_the_defaults_pass(self):
        jsonschema.Draft7Validator.check_schema(self.schema)
        self.assertEqual(self.errors(self.values), [])

    def test_it_covers_every_value_and_nothing_else(self):
        declared = schema_paths(self.schema)
        present = value_paths(self.values, self.schema)
        self.assertEqual(present - declared, set(), "values without a schema entry")
        self.assertEqual(declared - present, set(), "schema entries without a value in values.yaml")

    def test_every_object_refuses_unknown_keys(self):
        def walk(schema, path):
            if schema.get("type") == "object" and "properties" in schema:
                self.assertIs(schema.get("additionalProperties"), False, path or "(top)")
                for key, sub in schema["properties"].items():
                    walk(sub, path + "." + key if path else key)
        walk(self.schema, "")

    def test_bad_values_are_refused_naming_the_value(self):
        cases = [
            ("operator.wokers", 4, "operator", "Additional properties are not allowed ('wokers'"),
            ("opertor", {}, "", "Additional properties are not allowed ('opertor'"),
            ("operator.workers", "4", "operator.workers", "is not of type 'integer'"),
            ("operator.workers", 0, "operator.workers", "less than the minimum"),
            ("operator.workers", 1000, "operator.workers", "greater than the maximum"),
            ("operator.metricsPort", 70000, "operator.metricsPort", "greater than the maximum"),
            ("operator.qps", 1.5, "operator.qps", "is not of type 'integer'"),
            ("operator.image.pullPolicy", "Sometimes", "operator.image.pullPolicy", "is not one of"),
            ("operator.image.digest", "sha256:xyz", "operator.image.digest", "does not match"),
            ("operator.watchNamespace", "Team_A", "operator.watchNamespace", "does not match"),
            ("operator.resources.limits.memory", "lots", "operator.resources.limits.memory", "is not valid"),
            ("operator.podLabels", {"team": 3}, "operator.podLabels.team", "is not of type 'string'"),
            ("operator.imagePullSecrets", [{"nme": "x"}], "operator.imagePullSecrets.0", "'name' is a required"),
            ("networkPolicy.enabled", "yes", "networkPolicy.enabled", "is not of type 'boolean'"),
            ("networkPolicy.monitoringNamespace", "", "networkPolicy.monitoringNamespace", "does not match"),
            ("metrics.service.type", "Ingress", "metrics.service.type", "is not one of"),
            ("metrics.podMonitor.interval", "15 seconds", "metrics.podMonitor.interval", "does not match"),
            ("worker.image.repository", "", "worker.image.repository", "is too short"),
            ("worker.command", "", "worker.command", "is too short"),
            ("crds.install", "true", "crds.install", "is not of type 'boolean'"),
            ("operator.gangScheduler", "slurm", "operator.gangScheduler", "is not one of"),
            ("dashboards.labels", {"grafana_dashboard": 1}, "dashboards.labels.grafana_dashboard",
             "is not of type 'string'"),
        ]
        for dotted, value, where, message in cases:
            with self.subTest(value=dotted):
                errors = self.errors(with_value(self.values, dotted, value))
                self.assertTrue(any(path == where and message in text for path, text in errors),
                                "%s=%r: expected %r at %r, got %r" % (dotted, value, message, where, errors))

    def test_good_overrides_pass(self):
        for dotted, value in [("operator.workers", 16), ("operator.image.digest", "sha256:" + "a" * 64),
                              ("operator.watchNamespace", "research"), ("metrics.serviceMonitor.interval", "1m30s"),
                              ("operator.resources.limits.cpu", 2), ("operator.resources.requests.memory", "1.5Gi"),
                              ("networkPolicy.enabled", False), ("operator.gangScheduler", "kueue"),
                              ("operator.tolerations",
                                                                 [{"key": "gpu", "operator": "Exists"}])]:
            with self.subTest(value=dotted):
                self.assertEqual(self.errors(with_value(self.values, dotted, value)), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
