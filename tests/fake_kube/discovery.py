"""Discovery documents (legacy format) and a minimal OpenAPI v3 surface.

The OpenAPI v3 documents only describe paths and their operations: each
PATCH names its group/version/kind and the fieldValidation query parameter,
which is what kubectl checks before it leaves validation to the server
(kubectl apply then sends fieldValidation=Strict). No type schemas are
published, so kubectl falls back to its compiled-in knowledge for built-in
types and to JSON merge patches for custom resources."""

import hashlib

from registry import VERBS

VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0", "gitCommit": "fake", "gitTreeState": "clean",
           "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.23", "compiler": "gc",
           "platform": "linux/amd64"}


def api_versions(address):
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]}


def _group_doc(registry, group):
    versions = registry.groups.get(group, [])
    vs = [{"groupVersion": "%s/%s" % (group, v), "version": v} for v in versions]
    return {"name": group, "versions": vs, "preferredVersion": vs[0] if vs else {}}


def api_groups(registry):
    groups = [_group_doc(registry, g) for g in sorted(registry.groups) if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry, group):
    if group not in registry.groups:
        return None
    doc = _group_doc(registry, group)
    doc.update({"kind": "APIGroup", "apiVersion": "v1"})
    return doc


def resource_list(registry, group, version):
    types = registry.types_in(group, version)
    if not types:
        return None
    resources = []
    for t in sorted(types, key=lambda t: t.plural):
        r = {"name": t.plural, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind,
             "verbs": VERBS}
        if t.short_names:
            r["shortNames"] = t.short_names
        if t.categories:
            r["categories"] = t.categories
        resources.append(r)
        if t.status:
            resources.append({"name": t.plural + "/status", "singularName": "", "namespaced": t.namespaced,
                              "kind": t.kind, "verbs": ["get", "patch", "update"]})
        for sub, kind, verbs in t.extra_subresources:
            resources.append({"name": t.plural + "/" + sub, "singularName": "", "namespaced": t.namespaced,
                              "kind": kind, "verbs": verbs})
    gv = version if not group else group + "/" + version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _gv_paths(registry):
    out = {"api/v1": ("", "v1")}
    for group, versions in registry.groups.items():
        if group:
            for v in versions:
                out["apis/%s/%s" % (group, v)] = (group, v)
    return out


def openapi_index(registry):
    paths = {}
    for path, (g, v) in sorted(_gv_paths(registry).items()):
        digest = hashlib.sha1(repr(sorted(t.plural for t in registry.types_in(g, v))).encode()).hexdigest()
        paths[path] = {"serverRelativeURL": "/openapi/v3/%s?hash=%s" % (path, digest.upper())}
    return {"paths": paths}


def _operation(t, verb, action):
    op = {"operationId": "%s%s" % (verb, t.kind), "x-kubernetes-action": action,
          "x-kubernetes-group-version-kind": {"group": t.group, "version": t.version, "kind": t.kind},
          "responses": {"200": {"description": "OK"}}}
    if verb in ("patch", "create", "replace"):
        op["parameters"] = [
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}}]
    if verb == "patch":
        op["requestBody"] = {"content": {ct: {"schema": {"type": "object"}} for ct in (
            "application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml")},
            "required": True}
    return op


def openapi_doc(registry, gv_path):
    gv = _gv_paths(registry).get(gv_path)
    if gv is None:
        return None
    paths = {}
    for t in registry.types_in(*gv):
        prefix = "/" + t.gv_path + ("/namespaces/{namespace}" if t.namespaced else "")
        paths["%s/%s" % (prefix, t.plural)] = {
            "get": _operation(t, "list", "list"), "post": _operation(t, "create", "post")}
        paths["%s/%s/{name}" % (prefix, t.plural)] = {
            "get": _operation(t, "read", "get"), "put": _operation(t, "replace", "put"),
            "patch": _operation(t, "patch", "patch"), "delete": _operation(t, "delete", "delete")}
        if t.status:
            paths["%s/%s/{name}/status" % (prefix, t.plural)] = {
                "get": _operation(t, "read", "get"), "put": _operation(t, "replace", "put"),
                "patch": _operation(t, "patch", "patch")}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": VERSION["gitVersion"]},
            "paths": paths, "components": {"schemas": {}}}
