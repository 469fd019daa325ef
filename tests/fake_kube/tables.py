"""meta.k8s.io/v1 Table rendering (what `kubectl get` asks for)."""

import calendar
import re
import time


def wants_table(accept):
    return "as=Table" in (accept or "")


def human_duration(seconds):
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return "%ds" % s
    m = s // 60
    if m < 10:
        return "%dm%ds" % (m, s % 60) if s % 60 else "%dm" % m
    if m < 180:
        return "%dm" % m
    h = m // 60
    if h < 8:
        return "%dh%dm" % (h, m % 60) if m % 60 else "%dh" % h
    if h < 48:
        return "%dh" % h
    d = h // 24
    if d < 8:
        return "%dd%dh" % (d, h % 24) if h % 24 else "%dd" % d
    if d < 730:
        return "%dd" % d
    return "%dy%dd" % (d // 365, d % 365) if d < 2920 else "%dy" % (d // 365)


def age(ts):
    if not ts:
        return "<unknown>"
    try:
        t = calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return "<unknown>"
    return human_duration(time.time() - t)


_SEG_RE = re.compile(r"\.?([^.\[\]]+)|\[(\d+)\]|\[\?\(@\.([\w.]+)\s*==\s*['\"]([^'\"]*)['\"]\)\]")


def jsonpath(obj, path):
    """Evaluates simple JSONPaths: .a.b, [0], [?(@.type=="Ready")]."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    if path.startswith("$"):
        path = path[1:]
    cur = obj
    pos = 0
    while pos < len(path):
        m = _SEG_RE.match(path, pos)
        if not m or m.end() == pos:
            return None
        pos = m.end()
        if m.group(1) is not None:
            cur = cur.get(m.group(1)) if isinstance(cur, dict) else None
        elif m.group(2) is not None:
            i = int(m.group(2))
            cur = cur[i] if isinstance(cur, list) and i < len(cur) else None
        else:
            field, want = m.group(3), m.group(4)
            found = None
            for item in cur if isinstance(cur, list) else []:
                v = item
                for seg in field.split("."):
                    v = v.get(seg) if isinstance(v, dict) else None
                if v is not None and str(v) == want:
                    found = item
                    break
            cur = found
        if cur is None:
            return None
    return cur


def _col(name, ctype="string", fmt="", desc="", priority=0):
    return {"name": name, "type": ctype, "format": fmt, "description": desc, "priority": priority}


NAME_COL = _col("Name", fmt="name", desc="Name must be unique within a namespace.")
AGE_COL = _col("Age", desc="CreationTimestamp is a timestamp representing the server time when this object "
               "was created.")


def _pod_cells(pod):
    status = pod.get("status") or {}
    cs = status.get("containerStatuses") or []
    n = len((pod.get("spec") or {}).get("containers") or []) or 1
    ready = sum(1 for c in cs if c.get("ready"))
    reason = status.get("reason") or status.get("phase") or "Pending"
    for c in cs:
        st = c.get("state") or {}
        if "terminated" in st:
            reason = st["terminated"].get("reason") or ("Signal:%s" % st["terminated"].get("signal"))
        elif "waiting" in st and st["waiting"].get("reason"):
            reason = st["waiting"]["reason"]
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        reason = "Terminating"
    restarts = sum(int(c.get("restartCount", 0)) for c in cs)
    return ["%d/%d" % (ready, n), reason, restarts, age(pod["metadata"].get("creationTimestamp")),
            status.get("podIP") or "<none>", (pod.get("spec") or {}).get("nodeName") or "<none>",
            "<none>", "<none>"]


def _columns_and_cells(rtype):
    """(column definitions, fn(obj) -> cells after the name)."""
    if rtype.custom:
        cols = rtype.printer_columns or []
        defs = [_col(c["name"], c.get("type", "string"), c.get("format", ""), c.get("description", ""),
                     c.get("priority", 0)) for c in cols]

        def cells(obj):
            out = []
            for c in cols:
                v = jsonpath(obj, c.get("jsonPath", ""))
                if c.get("type") == "date" and isinstance(v, str):
                    v = age(v)
                elif isinstance(v, (dict, list)):
                    v = str(v)
                out.append(v)
            return out
        return defs, cells
    skey = rtype.skey
    if skey == "/pods":
        return [_col("Ready", desc="The aggregate readiness state of this pod for accepting traffic."),
                _col("Status", desc="The aggregate status of the containers in this pod."),
                _col("Restarts", "string", desc="The number of times the containers in this pod have been "
                     "restarted."),
                AGE_COL, _col("IP", priority=1), _col("Node", priority=1), _col("Nominated Node", priority=1),
                _col("Readiness Gates", priority=1)], _pod_cells
    if skey == "/nodes":
        def node_cells(n):
            conds = {c.get("type"): c.get("status") for c in (n.get("status") or {}).get("conditions") or []}
            return ["Ready" if conds.get("Ready") == "True" else "NotReady", "<none>",
                    age(n["metadata"].get("creationTimestamp")),
                    ((n.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")]
        return [_col("Status"), _col("Roles"), AGE_COL, _col("Version")], node_cells
    if skey == "/namespaces":
        return [_col("Status"), AGE_COL], lambda o: [(o.get("status") or {}).get("phase", "Active"),
                                                     age(o["metadata"].get("creationTimestamp"))]
    if skey == "/services":
        def svc_cells(s):
            spec = s.get("spec") or {}
            ports = ",".join("%s/%s" % (p.get("port"), p.get("protocol", "TCP")) for p in spec.get("ports") or [])
            return [spec.get("type", "ClusterIP"), spec.get("clusterIP", "<none>"), "<none>", ports or "<none>",
                    age(s["metadata"].get("creationTimestamp"))]
        return [_col("Type"), _col("Cluster-IP"), _col("External-IP"), _col("Port(s)"), AGE_COL], svc_cells
    if skey == "apiextensions.k8s.io/customresourcedefinitions":
        return [_col("Created At", "date")], lambda o: [o["metadata"].get("creationTimestamp")]
    return [AGE_COL], lambda o: [age(o["metadata"].get("creationTimestamp"))]


def _row_object(obj, include):
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata")}


def table(rtype, objs, list_meta, include="Metadata"):
    defs, cells = _columns_and_cells(rtype)
    rows = []
    for o in objs:
        row = {"cells": [o["metadata"]["name"]] + cells(o)}
        ro = _row_object(o, include)
        if ro is not None:
            row["object"] = ro
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
            "columnDefinitions": [NAME_COL] + defs, "rows": rows}
