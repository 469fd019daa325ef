"""HTTP front end: routing of Kubernetes REST paths onto the store, plus the
/fake/ control endpoints (fault injection, stats, kubelet inspection)."""

import json
import os
import re
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import yaml

import discovery
import patch as patch_mod
import pod_security
import tables
from errors import ApiError
from selection import Selection
from watch import serve_watch


class Faults:
    """Injected failures: the next N requests matching method and path fail."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rules = []

    def add(self, rule):
        rule = dict(rule)
        rule["_re"] = re.compile(rule.get("path", ".*"))
        rule.setdefault("count", 1)
        rule.setdefault("method", "*")
        with self.lock:
            self.rules.append(rule)

    def clear(self):
        with self.lock:
            self.rules = []

    def match(self, method, path):
        with self.lock:
            for rule in self.rules:
                if rule["count"] == 0:
                    continue
                if rule["method"] not in ("*", method):
                    continue
                if not rule["_re"].search(path):
                    continue
                if rule["count"] > 0:
                    rule["count"] -= 1
                return rule
        return None


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = {}
        self.total = 0

    def count(self, key):
        with self.lock:
            self.requests[key] = self.requests.get(key, 0) + 1
            self.total += 1


class App:
    """Everything a request handler needs."""

    def __init__(self, store, registry, token=None, bookmark_interval=1.0, kubelet=None, verbose=False):
        self.store = store
        self.registry = registry
        self.token = token
        self.bookmark_interval = bookmark_interval
        self.kubelet = kubelet
        self.faults = Faults()
        self.stats = Stats()
        self.address = ""
        self.verbose = verbose


def _is_true(v):
    return v in ("true", "1", "True")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver"

    @property
    def app(self):
        return self.server.app

    def setup(self):
        # Headers and body go out in separate writes: without TCP_NODELAY,
        # Nagle's algorithm and delayed ACKs add ~40 ms to every response.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hasattr(self.request, "do_handshake"):  # TLS: handshake here, not in the accept loop
            self.request.settimeout(10)
            self.request.do_handshake()
            self.request.settimeout(None)
        super().setup()

    def log_message(self, fmt, *args):
        if self.app.verbose:
            super().log_message(fmt, *args)

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")

    def do_PATCH(self):
        self._handle("PATCH")

    def do_DELETE(self):
        self._handle("DELETE")

    # ---- plumbing -------------------------------------------------------

    def _read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0] or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, code, body, ctype="application/json", headers=None):
        if isinstance(body, (dict, list)):
            data = json.dumps(body, separators=(",", ":")).encode()
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = body
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_error(self, err):
        self._send(err.code, err.status(), headers=err.headers)

    def _start_chunked(self, ctype="application/json"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _client_gone(self):
        """A watch client sends nothing: readable means it closed (EOF or a TLS close)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def _end_chunked(self):
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True

    def _handle(self, method):
        try:
            url = urlsplit(self.path)
            params = dict(parse_qsl(url.query, keep_blank_values=True))
            self.body = self._read_body()
            if url.path.startswith("/fake/"):
                return self._fake(method, url.path)
            if self.app.token and self.headers.get("Authorization") != "Bearer " + self.app.token:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            rule = self.app.faults.match(method, self.path)
            if rule:
                headers = {}
                if rule["status"] == 429:
                    headers["Retry-After"] = str(rule.get("retryAfterSeconds", 1))
                err = ApiError(rule["status"], rule.get("reason", "InternalError"),
                               rule.get("message", "injected fault"), headers=headers)
                self.app.stats.count("FAULT " + method)
                raise err
            self._route(method, url.path, params)
        except ApiError as e:
            self._send_error(e)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a bug here must not kill the connection silently
            import traceback
            traceback.print_exc()
            self._send_error(ApiError(500, "InternalError", "internal error: %s" % e))

    # ---- control endpoints ----------------------------------------------

    def _fake(self, method, path):
        app = self.app
        body = json.loads(self.body or b"{}") if self.body else {}
        if path == "/fake/faults" and method == "POST":
            app.faults.add(body)
            return self._send(200, {"ok": True})
        if path == "/fake/faults" and method == "DELETE":
            app.faults.clear()
            return self._send(200, {"ok": True})
        if path == "/fake/drop-watches" and method == "POST":
            app.store.drop_watches()
            return self._send(200, {"ok": True})
        if path == "/fake/compact" and method == "POST":
            app.store.compact()
            return self._send(200, {"ok": True, "resourceVersion": str(app.store.current_rv())})
        if path == "/fake/stats" and method == "GET":
            with app.stats.lock:
                reqs = dict(app.stats.requests)
                total = app.stats.total
            with app.store.lock:
                objects = {k: len(v) for k, v in app.store.objects.items() if v}
                out = {"requests": reqs, "total_requests": total, "open_watches": app.store.open_watches,
                       "resource_version": app.store.rv, "objects": objects}
            return self._send(200, out)
        if path == "/fake/kubelet/pods" and method == "GET":
            return self._send(200, app.kubelet.describe() if app.kubelet else [])
        if path == "/fake/kubelet/signal" and method == "POST":
            if not app.kubelet:
                raise ApiError(400, "BadRequest", "kubelet not enabled")
            pid = app.kubelet.signal(body.get("namespace", "default"), body["name"], int(body.get("signal", 15)),
                                     body.get("target", "main"))
            if pid is None:
                raise ApiError(404, "NotFound", "no such process")
            return self._send(200, {"pid": pid})
        raise ApiError(404, "NotFound", "unknown control endpoint " + path)

    # ---- API ------------------------------------------------------------

    def _route(self, method, path, params):
        app = self.app
        reg = app.registry
        if path in ("/healthz", "/readyz", "/livez"):
            return self._send(200, "ok", "text/plain")
        if path == "/version":
            return self._send(200, discovery.VERSION)
        if path == "/api":
            return self._send(200, discovery.api_versions(app.address))
        if path == "/apis":
            with app.store.lock:
                return self._send(200, discovery.api_groups(reg))
        if path == "/openapi/v3":
            with app.store.lock:
                return self._send(200, discovery.openapi_index(reg))
        if path.startswith("/openapi/v3/"):
            with app.store.lock:
                doc = discovery.openapi_doc(reg, path[len("/openapi/v3/"):])
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return self._send(200, doc)
        segs = [s for s in path.split("/") if s]
        if len(segs) < 2 or segs[0] not in ("api", "apis"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if segs[0] == "api":
            group, version, rest = "", segs[1], segs[2:]
        else:
            group = segs[1]
            if len(segs) == 2:
                with app.store.lock:
                    doc = discovery.api_group(reg, group)
                if doc is None:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                return self._send(200, doc)
            version, rest = segs[2], segs[3:]
        if not rest:
            with app.store.lock:
                doc = discovery.resource_list(reg, group, version)
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return self._send(200, doc)
        if rest[0] == "watch":
            rest = rest[1:]
            params["watch"] = "true"
        ns = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            ns, rest = rest[1], rest[2:]
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        with app.store.lock:
            rtype = reg.lookup(group, version, plural)
        if rtype is None or len(rest) > 3 or (rtype.namespaced and name is not None and ns is None):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rtype.namespaced:
            ns = None
        if sub and not ((sub == "status" and rtype.status) or (sub == "log" and rtype.skey == "/pods")):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        resource = plural + ("/" + sub if sub else "")
        verb = method
        if method == "GET":
            verb = "WATCH" if _is_true(params.get("watch")) else ("LIST" if name is None else "GET")
        app.stats.count("%s %s" % (verb, resource))
        getattr(self, "_" + verb.lower())(rtype, ns, name, sub, params)

    def _encode(self, rtype, obj):
        if rtype.custom and obj.get("apiVersion") != rtype.api_version:
            obj = dict(obj, apiVersion=rtype.api_version)
        return obj

    def _send_obj(self, code, rtype, obj, warnings=None):
        headers = {}
        if warnings:
            headers["Warning"] = ", ".join('299 - %s' % json.dumps(w) for w in warnings)
        if tables.wants_table(self.headers.get("Accept")):
            meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
            return self._send(code, tables.table(rtype, [obj], meta, self._include()), headers=headers)
        self._send(code, self._encode(rtype, obj), headers=headers)

    def _include(self):
        q = dict(parse_qsl(urlsplit(self.path).query))
        return q.get("includeObject", "Metadata")

    def _parse_body(self):
        ctype = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        try:
            if "yaml" in ctype:
                return yaml.safe_load(self.body.decode() or "{}")
            return json.loads(self.body or b"null")
        except Exception as e:
            raise ApiError(400, "BadRequest", "could not parse the request body: %s" % e)

    def _get(self, rtype, ns, name, sub, params):
        if sub == "log":
            return self._log(ns, name, params)
        obj = self.app.store.get(rtype, ns, name)
        self._send_obj(200, rtype, obj)

    def _list(self, rtype, ns, name, sub, params):
        sel = Selection(ns, params.get("labelSelector", ""), params.get("fieldSelector", ""))
        try:
            limit = int(params.get("limit") or 0)
        except ValueError:
            limit = 0
        items, rv, cont, remaining = self.app.store.list(rtype, sel, limit, params.get("continue"))
        meta = {"resourceVersion": str(rv)}
        if cont:
            meta["continue"] = cont
            meta["remainingItemCount"] = remaining
        if tables.wants_table(self.headers.get("Accept")):
            return self._send(200, tables.table(rtype, items, meta, params.get("includeObject", "Metadata")))
        out = [self._encode(rtype, o) for o in items]
        self._send(200, {"kind": rtype.list_kind, "apiVersion": rtype.api_version, "metadata": meta, "items": out})

    def _watch(self, rtype, ns, name, sub, params):
        sel = Selection(ns, params.get("labelSelector", ""), params.get("fieldSelector", ""))
        if name:  # watch on a single object path (deprecated form)
            sel = Selection(ns, params.get("labelSelector", ""),
                            ",".join(x for x in [params.get("fieldSelector", ""), "metadata.name=" + name] if x))
        use_table = tables.wants_table(self.headers.get("Accept"))
        include = params.get("includeObject", "Metadata")

        def encode(obj, ev):
            if use_table:
                t = tables.table(rtype, [obj], {"resourceVersion": obj["metadata"].get("resourceVersion", "")},
                                 include)
                return json.dumps(t, separators=(",", ":"))
            if ev is not None and not (rtype.custom and obj.get("apiVersion") != rtype.api_version):
                return ev.object_json()
            return json.dumps(self._encode(rtype, obj), separators=(",", ":"))

        self._start_chunked()
        try:
            serve_watch(self._chunk, self.app.store, rtype, sel, params, self.app.bookmark_interval, encode,
                        self._client_gone)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
            return
        self._end_chunked()

    def _post(self, rtype, ns, name, sub, params):
        if name is not None or (rtype.namespaced and not ns):
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested "
                           "resource")
        obj = self._parse_body()
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the request body must be an object")
        if rtype.skey == "/pods":
            refused = pod_security.admit(self.app.store, ns, obj)
            if refused:
                raise ApiError(403, "Forbidden", refused)
        new, warnings = self.app.store.create(rtype, ns, obj, params.get("fieldValidation"),
                                              params.get("dryRun") == "All")
        self._send_obj(201, rtype, new, warnings)

    def _put(self, rtype, ns, name, sub, params):
        if name is None:
            raise ApiError(405, "MethodNotAllowed", "PUT needs a name")
        obj = self._parse_body()
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the request body must be an object")
        new, warnings = self.app.store.update(rtype, ns, name, obj, sub, params.get("fieldValidation"),
                                              params.get("dryRun") == "All")
        self._send_obj(200, rtype, new, warnings)

    def _patch(self, rtype, ns, name, sub, params):
        if name is None:
            raise ApiError(405, "MethodNotAllowed", "PATCH needs a name")
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        body = self._parse_body()
        create = False
        if ctype == "application/merge-patch+json":
            fn = lambda cur: patch_mod.merge_patch(cur, body)  # noqa: E731
        elif ctype == "application/strategic-merge-patch+json":
            fn = lambda cur: patch_mod.strategic_merge_patch(cur, body)  # noqa: E731
        elif ctype == "application/json-patch+json":
            fn = lambda cur: patch_mod.json_patch(cur, body)  # noqa: E731
        elif ctype == "application/apply-patch+yaml":
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "apply body must be an object")
            fn = lambda cur: patch_mod.merge_patch(cur, body)  # noqa: E731
            create = True
        else:
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                           "accepted media types include: application/json-patch+json, application/merge-patch+json,"
                           " application/apply-patch+yaml, application/strategic-merge-patch+json")
        new, warnings = self.app.store.patch(rtype, ns, name, fn, sub, params.get("fieldValidation"), create,
                                             params.get("dryRun") == "All")
        self._send_obj(200, rtype, new, warnings)

    def _delete_options(self, params):
        opts = {}
        if self.body:
            try:
                opts = json.loads(self.body) or {}
            except ValueError:
                raise ApiError(400, "BadRequest", "invalid DeleteOptions")
        if "propagationPolicy" in params:
            opts["propagationPolicy"] = params["propagationPolicy"]
        if "gracePeriodSeconds" in params:
            opts["gracePeriodSeconds"] = int(params["gracePeriodSeconds"])
        if "orphanDependents" in params:
            opts["orphanDependents"] = _is_true(params["orphanDependents"])
        return opts

    def _delete(self, rtype, ns, name, sub, params):
        opts = self._delete_options(params)
        store = self.app.store
        if name is None:
            sel = Selection(ns, params.get("labelSelector", ""), params.get("fieldSelector", ""))
            items, rv, _, _ = store.list(rtype, sel)
            done = []
            for o in items:
                try:
                    done.append(store.delete(rtype, o["metadata"].get("namespace"), o["metadata"]["name"], opts))
                except ApiError as e:
                    if e.code != 404:
                        raise
            return self._send(200, {"kind": rtype.list_kind, "apiVersion": rtype.api_version,
                                    "metadata": {"resourceVersion": str(store.current_rv())},
                                    "items": [self._encode(rtype, o) for o in done]})
        if params.get("dryRun") == "All":
            return self._send_obj(200, rtype, store.get(rtype, ns, name))
        obj = store.delete(rtype, ns, name, opts)
        self._send_obj(200, rtype, obj)

    def _log(self, ns, name, params):
        store = self.app.store
        pod = store.get_raw("/pods", ns, name)
        if pod is None:
            raise ApiError(404, "NotFound", 'pods "%s" not found' % name)
        kubelet = self.app.kubelet
        path = kubelet.log_path(pod) if kubelet else None
        if not path or not os.path.exists(path):
            raise ApiError(400, "BadRequest", 'container "%s" in pod "%s" is waiting to start: ContainerCreating'
                           % (params.get("container", "main"), name))
        with open(path, "rb") as f:
            data = f.read()
        if params.get("tailLines"):
            n = int(params["tailLines"])
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-n:]) if n > 0 else b""
        if params.get("limitBytes"):
            data = data[:int(params["limitBytes"])]
        if not _is_true(params.get("follow")):
            return self._send(200, data, "text/plain")
        self._start_chunked("text/plain")
        offset = os.path.getsize(path)
        if data:
            self._chunk(data)
        uid = pod["metadata"]["uid"]
        try:
            while True:
                alive = kubelet.running(uid)
                with open(path, "rb") as f:
                    f.seek(offset)
                    more = f.read()
                if more:
                    offset += len(more)
                    self._chunk(more)
                if not alive:
                    break
                time.sleep(0.2)
        except OSError:
            self.close_connection = True
            return
        self._end_chunked()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address, app, ssl_context=None):
        super().__init__(address, Handler)
        self.app = app
        if ssl_context is not None:
            self.socket = ssl_context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request, client_address):
        if self.app.verbose:
            super().handle_error(request, client_address)
