"""Structural-schema handling of custom resources: defaulting, pruning of
unknown fields and validation against a CRD version's openAPIV3Schema.

Covers the common subset: type, nullable, required, properties,
additionalProperties, items, enum, minimum/maximum (+exclusive), multipleOf,
minLength/maxLength, pattern, minItems/maxItems, minProperties/maxProperties,
default, x-kubernetes-preserve-unknown-fields, x-kubernetes-int-or-string,
allOf/anyOf/oneOf/not (validation only). CEL rules are not evaluated."""

import copy
import json
import re

_TYPE_NAMES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _show(value):
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _type_ok(schema, value):
    t = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)
    if not t:
        return True
    if t == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or \
            (isinstance(value, float) and value.is_integer())
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPE_NAMES.get(t, object))


class Result:
    def __init__(self):
        self.errors = []    # (reason, field, message)
        self.unknown = []   # field paths that were pruned


def apply_schema(schema, value, path, res):
    """Returns value defaulted and pruned; appends problems to res."""
    if schema is None:
        return value
    for sub in schema.get("allOf") or []:
        _validate_only(sub, value, path, res)
    for key in ("anyOf", "oneOf"):
        subs = schema.get(key)
        if subs:
            ok = sum(1 for s in subs if not _errors_of(s, value, path))
            if ok == 0 or (key == "oneOf" and ok > 1):
                res.errors.append(("FieldValueInvalid", path, "Invalid value: %s: %s must validate %s" %
                                   (_show(value), path, "one and only one schema (oneOf)" if key == "oneOf"
                                    else "at least one schema (anyOf)")))
    if schema.get("not") is not None and not _errors_of(schema["not"], value, path):
        res.errors.append(("FieldValueInvalid", path, "Invalid value: %s: %s must not validate the schema (not)"
                           % (_show(value), path)))
    if not _type_ok(schema, value):
        res.errors.append(("FieldValueTypeInvalid", path, "Invalid value: %s: %s in body must be of type %s: %s" %
                           (_show(value), path, schema.get("type"), _show(value))))
        return value
    enum = schema.get("enum")
    if enum is not None and value not in enum:
        res.errors.append(("FieldValueNotSupported", path, "Unsupported value: %s: supported values: %s" %
                           (_show(value), ", ".join(_show(e) for e in enum))))
    if isinstance(value, dict):
        return _object(schema, value, path, res)
    if isinstance(value, list):
        return _array(schema, value, path, res)
    if isinstance(value, str):
        _string(schema, value, path, res)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _number(schema, value, path, res)
    return value


def _errors_of(schema, value, path):
    res = Result()
    apply_schema(schema, copy.deepcopy(value), path, res)
    return res.errors


def _validate_only(schema, value, path, res):
    sub = Result()
    apply_schema(schema, copy.deepcopy(value), path, sub)
    res.errors.extend(sub.errors)


def _join(path, key):
    return key if not path else path + "." + key


def _object(schema, value, path, res):
    props = schema.get("properties")
    additional = schema.get("additionalProperties")
    preserve = schema.get("x-kubernetes-preserve-unknown-fields")
    out = {}
    # Defaults first, then nulls of non-nullable fields are dropped.
    for key, sub in (props or {}).items():
        if key not in value and "default" in sub:
            value = dict(value)
            value[key] = copy.deepcopy(sub["default"])
    for key, v in value.items():
        sub = (props or {}).get(key)
        if sub is None and isinstance(additional, dict):
            sub = additional
        fpath = _join(path, key)
        if sub is None:
            if preserve or additional is True:
                out[key] = v
            else:
                res.unknown.append(fpath)
            continue
        if v is None and not sub.get("nullable"):
            if "default" in sub:
                v = copy.deepcopy(sub["default"])
            else:
                continue
        out[key] = apply_schema(sub, v, fpath, res) if v is not None else None
    for key in schema.get("required") or []:
        if key not in out:
            res.errors.append(("FieldValueRequired", _join(path, key), "Required value"))
    n = len(out)
    if "minProperties" in schema and n < schema["minProperties"]:
        res.errors.append(("FieldValueInvalid", path, "Invalid value: %d: %s in body should have at least %d properties"
                           % (n, path, schema["minProperties"])))
    if "maxProperties" in schema and n > schema["maxProperties"]:
        res.errors.append(("FieldValueTooMany", path, "Too many: %d: must have at most %d items"
                           % (n, schema["maxProperties"])))
    return out


def _array(schema, value, path, res):
    items = schema.get("items")
    out = [apply_schema(items, v, "%s[%d]" % (path, i), res) if items else v for i, v in enumerate(value)]
    if "minItems" in schema and len(out) < schema["minItems"]:
        res.errors.append(("FieldValueInvalid", path, "Invalid value: %d: %s in body should have at least %d items"
                           % (len(out), path, schema["minItems"])))
    if "maxItems" in schema and len(out) > schema["maxItems"]:
        res.errors.append(("FieldValueTooMany", path, "Too many: %d: must have at most %d items"
                           % (len(out), schema["maxItems"])))
    return out


def _string(schema, value, path, res):
    if "minLength" in schema and len(value) < schema["minLength"]:
        res.errors.append(("FieldValueInvalid", path, "Invalid value: %s: %s in body should be at least %d chars long"
                           % (_show(value), path, schema["minLength"])))
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        res.errors.append(("FieldValueTooLong", path, "Too long: may not be more than %d bytes" % schema["maxLength"]))
    pattern = schema.get("pattern")
    if pattern:
        try:
            ok = re.search(pattern, value) is not None
        except re.error:
            ok = True
        if not ok:
            res.errors.append(("FieldValueInvalid", path, "Invalid value: %s: %s in body should match '%s'"
                               % (_show(value), path, pattern)))


def _number(schema, value, path, res):
    if "minimum" in schema:
        lo = schema["minimum"]
        if value < lo or (schema.get("exclusiveMinimum") is True and value == lo):
            word = "greater than" if schema.get("exclusiveMinimum") is True else "greater than or equal to"
            res.errors.append(("FieldValueInvalid", path, "Invalid value: %s: %s in body should be %s %s"
                               % (_show(value), path, word, _show(lo))))
    if "maximum" in schema:
        hi = schema["maximum"]
        if value > hi or (schema.get("exclusiveMaximum") is True and value == hi):
            word = "less than" if schema.get("exclusiveMaximum") is True else "less than or equal to"
            res.errors.append(("FieldValueInvalid", path, "Invalid value: %s: %s in body should be %s %s"
                               % (_show(value), path, word, _show(hi))))
    m = schema.get("multipleOf")
    if m and (value / m) != int(value / m):
        res.errors.append(("FieldValueInvalid", path, "Invalid value: %s: %s in body should be a multiple of %s"
                           % (_show(value), path, _show(m))))


def apply_root(schema, obj):
    """Applies the schema to a whole custom resource (apiVersion, kind and
    metadata are left alone). Returns (new object, Result)."""
    res = Result()
    if not schema:
        return obj, res
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    root = dict(schema)
    props = dict(root.get("properties") or {})
    for k in ("apiVersion", "kind", "metadata"):
        props.pop(k, None)
    root["properties"] = props
    root.pop("required", None)
    required = [r for r in (schema.get("required") or []) if r not in ("apiVersion", "kind", "metadata")]
    if required:
        root["required"] = required
    new_body = apply_schema(root, body, "", res)
    out = {k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}
    out.update(new_body if isinstance(new_body, dict) else {})
    return out, res
