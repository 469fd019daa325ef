"""metav1.Status errors, raised by the store and turned into responses."""


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None, headers=None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self):
        return status_body(self.code, self.reason, self.message, self.details)


def status_body(code, reason, message, details=None, success=False):
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Success" if success else "Failure", "message": message,
            "reason": reason, "code": code}
    if details is not None:
        body["details"] = details
    return body


def not_found(rtype, name):
    what = rtype.plural if not rtype.group else "%s.%s" % (rtype.plural, rtype.group)
    return ApiError(404, "NotFound", '%s "%s" not found' % (what, name),
                    {"name": name, "group": rtype.group, "kind": rtype.plural})


def already_exists(rtype, name):
    what = rtype.plural if not rtype.group else "%s.%s" % (rtype.plural, rtype.group)
    return ApiError(409, "AlreadyExists", '%s "%s" already exists' % (what, name),
                    {"name": name, "group": rtype.group, "kind": rtype.plural})


def conflict(rtype, name, why="the object has been modified; please apply your changes "
                              "to the latest version and try again"):
    what = rtype.plural if not rtype.group else "%s.%s" % (rtype.plural, rtype.group)
    return ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": %s' % (what, name, why),
                    {"name": name, "group": rtype.group, "kind": rtype.plural})


def invalid(rtype, name, causes):
    """causes: [(reason, field, message)] -> 422 Invalid."""
    kind_desc = rtype.kind if not rtype.group else "%s.%s" % (rtype.kind, rtype.group)
    msgs = ["%s: %s" % (f, m) if f else m for (_, f, m) in causes]
    text = msgs[0] if len(msgs) == 1 else "[" + ", ".join(msgs) + "]"
    return ApiError(422, "Invalid", '%s "%s" is invalid: %s' % (kind_desc, name, text),
                    {"name": name, "group": rtype.group, "kind": rtype.kind,
                     "causes": [{"reason": r, "message": m, "field": f} for (r, f, m) in causes]})


def expired(message):
    return ApiError(410, "Expired", message)
