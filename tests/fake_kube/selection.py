"""Label and field selectors, parsed once and cached."""

import functools
import re

from errors import ApiError


def _split_top(text):
    """Splits on commas outside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


_SET_RE = re.compile(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$")


@functools.lru_cache(maxsize=512)
def parse_label_selector(text):
    """Returns a tuple of (op, key, values) requirements."""
    reqs = []
    for part in _split_top(text or ""):
        m = _SET_RE.match(part)
        if m:
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append((m.group(2), m.group(1), values))
        elif part.startswith("!"):
            reqs.append(("!exists", part[1:].strip(), None))
        elif "!=" in part:
            k, v = part.split("!=", 1)
            reqs.append(("!=", k.strip(), v.strip()))
        elif "==" in part:
            k, v = part.split("==", 1)
            reqs.append(("=", k.strip(), v.strip()))
        elif "=" in part:
            k, v = part.split("=", 1)
            reqs.append(("=", k.strip(), v.strip()))
        elif re.match(r"^[A-Za-z0-9_./-]+$", part):
            reqs.append(("exists", part, None))
        else:
            raise ApiError(400, "BadRequest", "unable to parse requirement: %r" % part)
    return tuple(reqs)


def labels_match(reqs, labels):
    labels = labels or {}
    for op, key, val in reqs:
        present = key in labels
        have = labels.get(key)
        if op == "=" and have != val:
            return False
        if op == "!=" and have == val:
            return False
        if op == "in" and have not in val:
            return False
        if op == "notin" and present and have in val:
            return False
        if op == "exists" and not present:
            return False
        if op == "!exists" and present:
            return False
    return True


@functools.lru_cache(maxsize=512)
def parse_field_selector(text):
    reqs = []
    for part in _split_top(text or ""):
        if "!=" in part:
            k, v = part.split("!=", 1)
            reqs.append(("!=", k.strip(), v.strip()))
        elif "==" in part:
            k, v = part.split("==", 1)
            reqs.append(("=", k.strip(), v.strip()))
        elif "=" in part:
            k, v = part.split("=", 1)
            reqs.append(("=", k.strip(), v.strip()))
        else:
            raise ApiError(400, "BadRequest", "invalid field selector: %r" % part)
    return tuple(reqs)


def field_value(obj, path):
    cur = obj
    for seg in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(seg)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def fields_match(reqs, obj):
    for op, key, val in reqs:
        have = field_value(obj, key)
        if op == "=" and have != val:
            return False
        if op == "!=" and have == val:
            return False
    return True


class Selection:
    """Namespace + label selector + field selector applied to objects."""

    def __init__(self, namespace=None, label_selector="", field_selector=""):
        self.namespace = namespace
        self.labels = parse_label_selector(label_selector or "")
        self.fields = parse_field_selector(field_selector or "")

    def matches(self, obj):
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace and meta.get("namespace") != self.namespace:
            return False
        if self.labels and not labels_match(self.labels, meta.get("labels")):
            return False
        if self.fields and not fields_match(self.fields, obj):
            return False
        return True
