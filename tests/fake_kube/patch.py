"""PATCH bodies: JSON merge patch (RFC 7386), a strategic merge patch subset
and JSON patch (RFC 6902). All functions return new objects."""

import copy

from errors import ApiError


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _merge_key(items):
    """The key a strategic merge uses for a list of objects, if obvious."""
    for key in ("name", "containerPort", "port", "type", "uid"):
        if items and all(isinstance(i, dict) and key in i for i in items):
            return key
    return None


def strategic_merge_patch(target, patch):
    """Merge patch, with lists of named objects merged by key and the
    $patch / $setElementOrder / $retainKeys directives understood or dropped."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and value.get("$patch") == "delete":
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _merge_list(current, patch):
    key = _merge_key([p for p in patch if not (isinstance(p, dict) and p.get("$patch"))] or patch)
    if key is None or not all(isinstance(c, dict) and key in c for c in current):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    out = [dict(c) for c in current]
    index = {c[key]: i for i, c in enumerate(out)}
    for item in patch:
        if item.get("$patch") == "delete":
            if item[key] in index:
                out[index[item[key]]] = None
            continue
        if item[key] in index:
            out[index[item[key]]] = strategic_merge_patch(out[index[item[key]]], item)
        else:
            out.append(strategic_merge_patch({}, item))
    return [o for o in out if o is not None]


def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", "invalid JSON pointer: %r" % path)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc, parts):
    cur = doc
    for p in parts:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        else:
            raise ApiError(422, "Invalid", "jsonpatch: path not found: /" + "/".join(parts))
    return cur


def _add(doc, parts, value, replace=False):
    if not parts:
        return value
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise ApiError(422, "Invalid", "jsonpatch replace: missing key " + last)
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise ApiError(422, "Invalid", "jsonpatch: bad array index " + last)
    else:
        raise ApiError(422, "Invalid", "jsonpatch: parent is not a container")
    return doc


def _remove(doc, parts):
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise ApiError(422, "Invalid", "jsonpatch remove: path not found")


def json_patch(target, ops):
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        kind = op.get("op")
        parts = _pointer(op.get("path", ""))
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, parts)
        elif kind == "replace":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")), replace=True)
        elif kind == "move":
            value = _remove(doc, _pointer(op.get("from", "")))
            doc = _add(doc, parts, value)
        elif kind == "copy":
            value = copy.deepcopy(_walk(doc, _pointer(op.get("from", ""))))
            doc = _add(doc, parts, value)
        elif kind == "test":
            if _walk(doc, parts) != op.get("value"):
                raise ApiError(422, "Invalid", "jsonpatch test operation failed at " + op.get("path", ""))
        else:
            raise ApiError(400, "BadRequest", "unknown json patch op %r" % kind)
    return doc
