"""Resource types served by the fake API server: the built-in ones and those
registered at run time from CustomResourceDefinitions."""

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


class ResourceType:
    """One served (group, version, plural). Versions of one CRD share storage."""

    def __init__(self, group, version, plural, kind, namespaced, singular=None,
                 short_names=(), categories=(), status=False, printer_columns=None,
                 schema=None, custom=False, extra_subresources=()):
        self.group = group
        self.version = version
        self.plural = plural
        self.kind = kind
        self.list_kind = kind + "List"
        self.namespaced = namespaced
        self.singular = singular or kind.lower()
        self.short_names = list(short_names)
        self.categories = list(categories)
        self.status = status
        self.printer_columns = printer_columns
        self.schema = schema
        self.custom = custom
        self.extra_subresources = list(extra_subresources)

    @property
    def api_version(self):
        return self.version if not self.group else self.group + "/" + self.version

    @property
    def skey(self):
        """Storage key: every version of a resource shares one store."""
        return self.group + "/" + self.plural

    @property
    def gv_path(self):
        return "api/v1" if not self.group else "apis/%s/%s" % (self.group, self.version)


def builtin_types():
    core = [
        ResourceType("", "v1", "namespaces", "Namespace", False, short_names=["ns"], status=True),
        ResourceType("", "v1", "pods", "Pod", True, short_names=["po"], categories=["all"], status=True,
                     extra_subresources=[("log", "Pod", ["get"])]),
        ResourceType("", "v1", "services", "Service", True, short_names=["svc"], categories=["all"],
                     status=True),
        ResourceType("", "v1", "configmaps", "ConfigMap", True, short_names=["cm"]),
        ResourceType("", "v1", "secrets", "Secret", True),
        ResourceType("", "v1", "events", "Event", True, short_names=["ev"]),
        ResourceType("", "v1", "nodes", "Node", False, short_names=["no"], status=True),
        ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True),
        ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, short_names=["netpol"]),
        ResourceType("events.k8s.io", "v1", "events", "Event", True, short_names=["ev"]),
        ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                     "CustomResourceDefinition", False, short_names=["crd", "crds"],
                     categories=["api-extensions"], status=True),
    ]
    return core


def types_from_crd(crd):
    """The ResourceTypes a CRD object serves (one per served version)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group", "")
    out = []
    for ver in spec.get("versions") or []:
        if not ver.get("served", True):
            continue
        cols = ver.get("additionalPrinterColumns")
        if not cols:
            cols = [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
        schema = (ver.get("schema") or {}).get("openAPIV3Schema")
        out.append(ResourceType(
            group, ver["name"], names.get("plural", ""), names.get("kind", ""),
            spec.get("scope", "Namespaced") == "Namespaced",
            singular=names.get("singular") or names.get("kind", "").lower(),
            short_names=names.get("shortNames") or [],
            categories=names.get("categories") or [],
            status="status" in ((ver.get("subresources") or {})),
            printer_columns=cols, schema=schema, custom=True))
    return out


class Registry:
    """Lookup of served resource types. Guarded by the store's lock."""

    def __init__(self):
        self.by_path = {}     # (group, version, plural) -> ResourceType
        self.groups = {}      # group -> [version, ...] in preference order
        self.crd_types = {}   # CRD name -> [ResourceType]
        for t in builtin_types():
            self.add(t)

    def add(self, t):
        self.by_path[(t.group, t.version, t.plural)] = t
        versions = self.groups.setdefault(t.group, [])
        if t.version not in versions:
            versions.append(t.version)

    def lookup(self, group, version, plural):
        return self.by_path.get((group, version, plural))

    def types_in(self, group, version):
        return [t for (g, v, _), t in self.by_path.items() if g == group and v == version]

    def set_crd(self, crd_name, types):
        self.remove_crd(crd_name)
        self.crd_types[crd_name] = types
        for t in types:
            self.add(t)

    def remove_crd(self, crd_name):
        for t in self.crd_types.pop(crd_name, []):
            self.by_path.pop((t.group, t.version, t.plural), None)
            if not self.types_in(t.group, t.version):
                versions = self.groups.get(t.group, [])
                if t.version in versions:
                    versions.remove(t.version)
                if not versions:
                    self.groups.pop(t.group, None)

    def any_version(self, skey):
        for t in self.by_path.values():
            if t.skey == skey:
                return t
        return None
