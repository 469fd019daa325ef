"""The object store: one lock, one global resourceVersion counter, an event
history for watches, owner-reference garbage collection and finalizers.

Stored objects are never mutated once committed (every change builds a new
dict), so events and list results can be serialized outside the lock."""

import base64
import json
import random
import string
import threading
import time
import uuid

import schema as schema_mod
from errors import ApiError, already_exists, conflict, expired, invalid, not_found
from registry import types_from_crd

_NAME_RE_CHARS = set(string.ascii_lowercase + string.digits + "-.")


def now_rfc3339(offset=0):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + offset))


def clone(obj):
    return json.loads(json.dumps(obj))


def _spec_part(obj):
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class Event:
    __slots__ = ("rv", "type", "skey", "obj", "old", "json")

    def __init__(self, rv, etype, skey, obj, old):
        self.rv, self.type, self.skey, self.obj, self.old = rv, etype, skey, obj, old
        self.json = None

    def object_json(self):
        if self.json is None:
            self.json = json.dumps(self.obj, separators=(",", ":"))
        return self.json


class Store:
    def __init__(self, registry, history=10000):
        self.registry = registry
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.rv = 0
        self.history = max(10, history)
        self.objects = {}        # skey -> {(ns, name): obj}
        self.events = []         # Event, events[i].rv == first_event_rv + i
        self.first_event_rv = 1
        self.oldest_rv = 0       # watch/continue from N < oldest_rv -> 410
        self.uid_index = {}      # uid -> (skey, ns, name)
        self.dependents = {}     # owner uid -> set(dependent uid)
        self.watch_epoch = 0     # bumped to close every watch
        self.open_watches = 0
        self.closing = False
        self.listeners = []      # fn(event), called under the lock
        self.pod_busy = lambda pod: False   # kubelet: does the pod still run?
        self.service_ip = 0

    # ---- helpers --------------------------------------------------------

    def _bucket(self, skey):
        return self.objects.setdefault(skey, {})

    def _commit(self, etype, skey, key, new, old):
        self.rv += 1
        rv = self.rv
        meta = dict(new.get("metadata") or {})
        meta["resourceVersion"] = str(rv)
        new = dict(new)
        new["metadata"] = meta
        bucket = self._bucket(skey)
        if etype == "DELETED":
            bucket.pop(key, None)
            self.uid_index.pop(meta.get("uid"), None)
        else:
            bucket[key] = new
            self.uid_index[meta.get("uid")] = (skey, key[0], key[1])
        self._reindex_owners(meta.get("uid"), old, None if etype == "DELETED" else new)
        ev = Event(rv, etype, skey, new, old)
        self.events.append(ev)
        if len(self.events) > self.history + max(1, self.history // 4):
            drop = len(self.events) - self.history
            del self.events[:drop]
            self.first_event_rv = self.events[0].rv
            self.oldest_rv = max(self.oldest_rv, self.first_event_rv - 1)
        for fn in self.listeners:
            fn(ev)
        self.cond.notify_all()
        return new

    def _reindex_owners(self, uid, old, new):
        def owners(o):
            if not o:
                return set()
            return {r.get("uid") for r in (o.get("metadata") or {}).get("ownerReferences") or [] if r.get("uid")}
        before, after = owners(old), owners(new)
        for u in before - after:
            deps = self.dependents.get(u)
            if deps:
                deps.discard(uid)
                if not deps:
                    del self.dependents[u]
        for u in after - before:
            self.dependents.setdefault(u, set()).add(uid)

    def _key(self, rtype, ns, name):
        return (ns if rtype.namespaced else "", name)

    def get_raw(self, skey, ns, name):
        return self.objects.get(skey, {}).get((ns, name))

    def get(self, rtype, ns, name):
        with self.lock:
            obj = self.get_raw(rtype.skey, *self._key(rtype, ns, name))
        if obj is None:
            raise not_found(rtype, name)
        return obj

    def current_rv(self):
        with self.lock:
            return self.rv

    def expired_since(self, rv):
        """True when events after rv are no longer all available."""
        return rv < self.oldest_rv

    def compact(self):
        with self.lock:
            self.oldest_rv = self.rv
            del self.events[:]
            self.first_event_rv = self.rv + 1

    def drop_watches(self):
        with self.lock:
            self.watch_epoch += 1
            self.cond.notify_all()

    def shutdown(self):
        with self.lock:
            self.closing = True
            self.watch_epoch += 1
            self.cond.notify_all()

    # ---- list -----------------------------------------------------------

    def list(self, rtype, sel, limit=0, cont=None):
        with self.lock:
            start = None
            list_rv = self.rv
            if cont:
                try:
                    tok = json.loads(base64.urlsafe_b64decode(cont.encode()).decode())
                    list_rv, start = int(tok["rv"]), tuple(tok["start"])
                except Exception:
                    raise ApiError(400, "BadRequest", "invalid continue token")
                if self.expired_since(list_rv):
                    raise expired("The provided continue parameter is too old to display a consistent list "
                                  "result. You can start a new list without the continue parameter.")
            bucket = self.objects.get(rtype.skey, {})
            keys = sorted(bucket)
            items = []
            next_key = None
            remaining = 0
            for k in keys:
                if start is not None and k <= start:
                    continue
                obj = bucket[k]
                if not sel.matches(obj):
                    continue
                if limit and len(items) >= limit:
                    if next_key is None:
                        next_key = items[-1]["metadata"]
                    remaining += 1
                    continue
                items.append(obj)
        token = None
        if next_key is not None:
            token = base64.urlsafe_b64encode(json.dumps(
                {"rv": list_rv, "start": [next_key.get("namespace", "") if rtype.namespaced else "",
                                          next_key["name"]]}).encode()).decode()
        return items, list_rv, token, remaining

    def snapshot(self, rtype, sel):
        """Matching objects and the RV they are current at (for watches)."""
        with self.lock:
            return [o for o in self.objects.get(rtype.skey, {}).values() if sel.matches(o)], self.rv

    # ---- create ---------------------------------------------------------

    def create(self, rtype, ns, obj, field_validation=None, dry_run=False):
        """Returns (object, warnings)."""
        with self.lock:
            obj = dict(obj)
            meta = dict(obj.get("metadata") or {})
            if rtype.namespaced:
                if meta.get("namespace") and ns and meta["namespace"] != ns:
                    raise ApiError(400, "BadRequest", "the namespace of the provided object does not match "
                                   "the namespace sent on the request")
                ns = ns or meta.get("namespace") or "default"
                if self.get_raw("/namespaces", "", ns) is None:
                    raise ApiError(404, "NotFound", 'namespaces "%s" not found' % ns,
                                   {"name": ns, "kind": "namespaces"})
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            name = meta.get("name")
            if not name and meta.get("generateName"):
                name = meta["generateName"] + "".join(random.choice("bcdfghjklmnpqrstvwxz2456789")
                                                      for _ in range(5))
                meta["name"] = name
            if not name:
                raise invalid(rtype, "", [("FieldValueRequired", "metadata.name",
                                           "name or generateName is required")])
            self._check_name(rtype, name)
            key = self._key(rtype, ns, name)
            if self.get_raw(rtype.skey, *key) is not None:
                raise already_exists(rtype, name)
            for f in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
                meta.pop(f, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339()
            meta["generation"] = 1
            obj["metadata"] = meta
            obj["apiVersion"] = rtype.api_version
            obj["kind"] = rtype.kind
            if rtype.status and rtype.custom:
                obj.pop("status", None)
            warnings = []
            obj = self._prepare(rtype, obj, None, field_validation, warnings)
            if dry_run:
                return obj, warnings
            new = self._commit("ADDED", rtype.skey, key, obj, None)
            self._after_write(rtype, new, None)
            refs = meta.get("ownerReferences") or []
            if refs and all(r.get("uid") not in self.uid_index for r in refs):
                # Real garbage collection deletes objects whose owners are all gone.
                self._delete(rtype, new, "Background", None)
            return new, warnings

    def _check_name(self, rtype, name):
        ok = 0 < len(name) <= 253 and set(name) <= _NAME_RE_CHARS and name[0].isalnum() and name[-1].isalnum()
        if not ok:
            raise invalid(rtype, name, [("FieldValueInvalid", "metadata.name",
                                         'Invalid value: "%s": a lowercase RFC 1123 subdomain must consist of '
                                         "lower case alphanumeric characters, '-' or '.', and must start and "
                                         "end with an alphanumeric character" % name)])

    def _prepare(self, rtype, obj, old, field_validation, warnings):
        """Type-specific defaulting and validation (create and update)."""
        if rtype.custom and rtype.schema:
            new, res = schema_mod.apply_root(rtype.schema, obj)
            name = obj["metadata"].get("name", "")
            if res.unknown:
                if field_validation == "Strict":
                    raise ApiError(400, "BadRequest", "strict decoding error: " +
                                   ", ".join('unknown field "%s"' % u for u in res.unknown))
                if field_validation != "Ignore":
                    warnings.extend('unknown field "%s"' % u for u in res.unknown)
            if res.errors:
                raise invalid(rtype, name, res.errors)
            obj = new
        skey = rtype.skey
        if old is None:
            if skey == "/pods":
                spec = dict(obj.get("spec") or {})
                spec.setdefault("restartPolicy", "Always")
                spec.setdefault("terminationGracePeriodSeconds", 30)
                spec.setdefault("dnsPolicy", "ClusterFirst")
                spec.setdefault("schedulerName", "default-scheduler")
                obj["spec"] = spec
                obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            elif skey == "/services":
                spec = dict(obj.get("spec") or {})
                spec.setdefault("type", "ClusterIP")
                if "clusterIP" not in spec:
                    self.service_ip += 1
                    spec["clusterIP"] = "10.96.%d.%d" % (self.service_ip // 250, 1 + self.service_ip % 250)
                    spec["clusterIPs"] = [spec["clusterIP"]]
                obj["spec"] = spec
                obj.setdefault("status", {"loadBalancer": {}})
            elif skey == "/namespaces":
                meta = obj["metadata"]
                meta["labels"] = dict(meta.get("labels") or {}, **{"kubernetes.io/metadata.name": meta["name"]})
                obj["status"] = {"phase": "Active"}
            elif skey == "apiextensions.k8s.io/customresourcedefinitions":
                self._check_crd(obj)
        if skey == "apiextensions.k8s.io/customresourcedefinitions":
            spec = obj.get("spec") or {}
            names = dict(spec.get("names") or {})
            names.setdefault("singular", names.get("kind", "").lower())
            names.setdefault("listKind", names.get("kind", "") + "List")
            obj["status"] = {
                "acceptedNames": names,
                "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                     "message": "no conflicts found", "lastTransitionTime": now_rfc3339()},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                     "message": "the initial names have been accepted", "lastTransitionTime": now_rfc3339()}]}
        return obj

    def _check_crd(self, obj):
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        want = "%s.%s" % (names.get("plural"), spec.get("group"))
        rt = self.registry.lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        if obj["metadata"]["name"] != want:
            raise invalid(rt, obj["metadata"]["name"], [("FieldValueInvalid", "metadata.name",
                          'Invalid value: "%s": must be spec.names.plural+"."+spec.group' % obj["metadata"]["name"])])
        if not names.get("kind") or not spec.get("versions"):
            raise invalid(rt, obj["metadata"]["name"], [("FieldValueRequired", "spec.names.kind", "Required value")])

    def _after_write(self, rtype, new, old):
        if rtype.skey == "apiextensions.k8s.io/customresourcedefinitions":
            self.registry.set_crd(new["metadata"]["name"], types_from_crd(new))

    # ---- update / patch -------------------------------------------------

    def update(self, rtype, ns, name, obj, subresource=None, field_validation=None, dry_run=False):
        with self.lock:
            key = self._key(rtype, ns, name)
            cur = self.get_raw(rtype.skey, *key)
            if cur is None:
                raise not_found(rtype, name)
            meta_in = (obj or {}).get("metadata") or {}
            if meta_in.get("name") and meta_in["name"] != name:
                raise ApiError(400, "BadRequest", "the name of the object (%s) does not match the name on the "
                               "URL (%s)" % (meta_in["name"], name))
            rv = meta_in.get("resourceVersion")
            if rv and rv != cur["metadata"]["resourceVersion"]:
                raise conflict(rtype, name)
            return self._write(rtype, key, cur, obj, subresource, field_validation, dry_run)

    def patch(self, rtype, ns, name, apply_fn, subresource=None, field_validation=None,
              create_missing=False, dry_run=False):
        """apply_fn(current object) -> patched object."""
        with self.lock:
            key = self._key(rtype, ns, name)
            cur = self.get_raw(rtype.skey, *key)
            if cur is None:
                if create_missing and not subresource:
                    obj = apply_fn({})
                    obj.setdefault("metadata", {})["name"] = name
                    return self.create(rtype, ns, obj, field_validation, dry_run)
                raise not_found(rtype, name)
            patched = apply_fn(clone(cur))
            if not isinstance(patched, dict):
                raise ApiError(422, "Invalid", "patch result is not an object")
            meta_in = patched.get("metadata") or {}
            if meta_in.get("resourceVersion") and meta_in["resourceVersion"] != cur["metadata"]["resourceVersion"]:
                raise conflict(rtype, name)
            return self._write(rtype, key, cur, patched, subresource, field_validation, dry_run)

    def _write(self, rtype, key, cur, obj, subresource, field_validation, dry_run):
        warnings = []
        obj = dict(obj)
        if subresource == "status":
            new = dict(cur)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
        else:
            new = obj
            if rtype.status:
                if "status" in cur:
                    new["status"] = cur["status"]
                else:
                    new.pop("status", None)
        meta = dict(new.get("metadata") or {})
        if subresource == "status":
            meta = dict(cur["metadata"])
        for f in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
                  "namespace", "name"):
            if f in cur["metadata"]:
                meta[f] = cur["metadata"][f]
            else:
                meta.pop(f, None)
        meta["resourceVersion"] = cur["metadata"]["resourceVersion"]
        new["metadata"] = meta
        new["apiVersion"] = rtype.api_version if not rtype.custom else cur.get("apiVersion", rtype.api_version)
        new["kind"] = rtype.kind
        new = self._prepare(rtype, new, cur, field_validation, warnings)
        if _spec_part(new) != _spec_part(cur):
            new["metadata"]["generation"] = int(cur["metadata"].get("generation", 1)) + 1
        meta = new["metadata"]
        if new == cur:
            return cur, warnings
        if dry_run:
            return new, warnings
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not self.pod_busy(new):
            return self._remove(rtype.skey, key, new), warnings
        result = self._commit("MODIFIED", rtype.skey, key, new, cur)
        self._after_write(rtype, result, cur)
        if meta.get("deletionTimestamp"):
            self._check_foreground(meta.get("uid"))
        return result, warnings

    def mutate(self, skey, ns, name, fn, uid=None):
        """Internal status writes (kubelet): fn(copy) -> new object or None."""
        with self.lock:
            cur = self.get_raw(skey, ns, name)
            if cur is None or (uid and cur["metadata"].get("uid") != uid):
                return None
            new = fn(clone(cur))
            if new is None or new == cur:
                return cur
            return self._commit("MODIFIED", skey, (ns, name), new, cur)

    # ---- delete ---------------------------------------------------------

    def delete(self, rtype, ns, name, options=None):
        options = options or {}
        with self.lock:
            key = self._key(rtype, ns, name)
            cur = self.get_raw(rtype.skey, *key)
            if cur is None:
                raise not_found(rtype, name)
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != cur["metadata"].get("uid"):
                raise conflict(rtype, name, "Precondition failed: UID in precondition: %s, UID in object meta: %s"
                               % (pre["uid"], cur["metadata"].get("uid")))
            if pre.get("resourceVersion") and pre["resourceVersion"] != cur["metadata"]["resourceVersion"]:
                raise conflict(rtype, name, "Precondition failed: ResourceVersion in precondition: %s, "
                               "ResourceVersion in object meta: %s" % (pre["resourceVersion"],
                                                                      cur["metadata"]["resourceVersion"]))
            policy = options.get("propagationPolicy")
            if not policy and options.get("orphanDependents") is True:
                policy = "Orphan"
            grace = options.get("gracePeriodSeconds")
            return self._delete(rtype, cur, policy or "Background", grace)

    def _delete(self, rtype, cur, policy, grace):
        meta = cur["metadata"]
        key = (meta.get("namespace", "") if rtype.namespaced else "", meta["name"])
        uid = meta.get("uid")
        is_pod = rtype.skey == "/pods"
        if meta.get("deletionTimestamp"):
            if is_pod and grace == 0 and not meta.get("finalizers"):
                return self._remove(rtype.skey, key, cur)
            return cur
        if policy == "Orphan":
            for dep_uid in list(self.dependents.get(uid, ())):
                loc = self.uid_index.get(dep_uid)
                dep = loc and self.get_raw(*loc)
                if dep:
                    d = clone(dep)
                    d["metadata"]["ownerReferences"] = [r for r in d["metadata"].get("ownerReferences") or []
                                                        if r.get("uid") != uid]
                    if not d["metadata"]["ownerReferences"]:
                        del d["metadata"]["ownerReferences"]
                    self._commit("MODIFIED", loc[0], (loc[1], loc[2]), d, dep)
        finalizers = list(meta.get("finalizers") or [])
        foreground = policy == "Foreground" and bool(self.dependents.get(uid))
        if foreground and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if is_pod and grace is None:
            grace = (cur.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        graceful = is_pod and grace != 0 and self.pod_busy(cur)
        if rtype.skey == "/namespaces":
            self._empty_namespace(meta["name"])
        if rtype.skey == "apiextensions.k8s.io/customresourcedefinitions":
            self._drop_crd(cur)
        if not finalizers and not graceful:
            return self._remove(rtype.skey, key, cur)
        new = clone(cur)
        new["metadata"]["deletionTimestamp"] = now_rfc3339((grace or 0) if graceful else 0)
        new["metadata"]["deletionGracePeriodSeconds"] = int(grace or 0) if graceful else 0
        if finalizers:
            new["metadata"]["finalizers"] = finalizers
        result = self._commit("MODIFIED", rtype.skey, key, new, cur)
        if foreground:
            self._delete_dependents(uid)
            self._check_foreground(uid)
        return result

    def _delete_dependents(self, uid):
        for dep_uid in list(self.dependents.get(uid, ())):
            loc = self.uid_index.get(dep_uid)
            dep = loc and self.get_raw(*loc)
            if dep:
                self._delete(self._rtype_of(loc[0]), dep, "Background", None)

    def _rtype_of(self, skey):
        rt = self.registry.any_version(skey)
        if rt is None:
            raise ApiError(500, "InternalError", "no type for " + skey)
        return rt

    def _remove(self, skey, key, cur):
        deleted = self._commit("DELETED", skey, key, cur, cur)
        uid = cur["metadata"].get("uid")
        self._collect(uid)
        for r in cur["metadata"].get("ownerReferences") or []:
            self._check_foreground(r.get("uid"))
        return deleted

    def _collect(self, uid):
        """Garbage collection: dependents whose every owner is gone go too."""
        for dep_uid in list(self.dependents.pop(uid, ())):
            loc = self.uid_index.get(dep_uid)
            dep = loc and self.get_raw(*loc)
            if not dep:
                continue
            refs = dep["metadata"].get("ownerReferences") or []
            if all(r.get("uid") not in self.uid_index for r in refs):
                self._delete(self._rtype_of(loc[0]), dep, "Background", None)
            else:
                self.dependents.setdefault(uid, set()).add(dep_uid)

    def _check_foreground(self, uid):
        loc = self.uid_index.get(uid)
        owner = loc and self.get_raw(*loc)
        if not owner:
            return
        meta = owner["metadata"]
        fins = meta.get("finalizers") or []
        if not meta.get("deletionTimestamp") or "foregroundDeletion" not in fins:
            return
        if any(d in self.uid_index for d in self.dependents.get(uid, ())):
            return
        new = clone(owner)
        new["metadata"]["finalizers"] = [f for f in fins if f != "foregroundDeletion"]
        if not new["metadata"]["finalizers"]:
            del new["metadata"]["finalizers"]
            self._remove(loc[0], (loc[1], loc[2]), new)
        else:
            self._commit("MODIFIED", loc[0], (loc[1], loc[2]), new, owner)

    def _empty_namespace(self, ns):
        for skey, bucket in list(self.objects.items()):
            for key in [k for k in bucket if k[0] == ns]:
                obj = bucket.get(key)
                if obj is not None:
                    self._delete(self._rtype_of(skey), obj, "Background", None)

    def _drop_crd(self, crd):
        spec = crd.get("spec") or {}
        skey = "%s/%s" % (spec.get("group"), (spec.get("names") or {}).get("plural"))
        for key, obj in list(self.objects.get(skey, {}).items()):
            self._remove(skey, key, obj)
        self.registry.remove_crd(crd["metadata"]["name"])

    def finish_pod(self, ns, name, uid):
        """Kubelet: the pod's process is gone; complete a graceful delete."""
        with self.lock:
            cur = self.get_raw("/pods", ns, name)
            if cur is None or cur["metadata"].get("uid") != uid:
                return
            meta = cur["metadata"]
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                self._remove("/pods", (ns, name), cur)

    # ---- watch support --------------------------------------------------

    def events_from(self, next_rv):
        """Events with rv >= next_rv (lock held by the caller)."""
        i = max(0, next_rv - self.first_event_rv)
        return self.events[i:]
