"""A "kubelet" and scheduler: binds Pending pods to the fake Nodes and runs
each pod's first container as a local process (see README.md for the
mapping rules: environment, volumes, mount paths, cluster DNS names)."""

import base64
import os
import re
import signal
import subprocess
import threading
import time

import containers
from gang import GangSchedulers
from store import now_rfc3339

_DNS_RE = re.compile(r"(?<![-a-z0-9.])([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)\.([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)\."
                     r"([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)\.svc(?:\.cluster\.local)?(?![-a-z0-9])")
_SUFFIX = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60,
           "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "m": 1e-3, "n": 1e-9, "u": 1e-6}
DNS_WAIT_S = 30.0


def quantity(q):
    """Kubernetes quantity -> float ("64Gi", "500M", "100m", "2")."""
    if q is None:
        return 0.0
    if isinstance(q, (int, float)):
        return float(q)
    m = re.match(r"^\s*([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$", str(q))
    if not m:
        return 0.0
    return float(m.group(1)) * _SUFFIX.get(m.group(2), 1)


def _format_quantity(n):
    for suffix, size in (("Gi", 2 ** 30), ("Mi", 2 ** 20), ("Ki", 2 ** 10)):
        if n >= size and n % size == 0:
            return "%d%s" % (n // size, suffix)
    return str(int(n))


def expand_vars(text, env):
    """$(VAR) expansion as the kubelet does it: $$ escapes, unknown stays."""
    out = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "$" and i + 1 < n:
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end >= 0:
                    name = text[i + 2:end]
                    out.append(env[name] if name in env else text[i:end + 1])
                    i = end + 1
                    continue
        out.append(ch)
        i += 1
    return "".join(out)


def replace_mounts(text, mounts):
    """Replaces every mountPath prefix by the local directory behind it."""
    for mount_path, local in mounts:
        if mount_path == local:
            continue
        pat = r"(?<![\w.\-/])" + re.escape(mount_path) + r"(?=/|$|[^\w.\-])"
        text = re.sub(pat, lambda _m, local=local: local, text)
    return text


def _pod_requests(pod):
    mem = gpu = 0.0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        mem += quantity(req.get("memory", lim.get("memory")))
        gpu += quantity(req.get("nvidia.com/gpu", lim.get("nvidia.com/gpu")))
    return mem, gpu


class PodProc:
    def __init__(self, pod, directory):
        meta = pod["metadata"]
        self.uid, self.ns, self.name = meta["uid"], meta.get("namespace", "default"), meta["name"]
        self.dir = directory
        self.popen = None
        self.pid = None
        self.exit_code = None
        self.ip = (pod.get("status") or {}).get("podIP")
        self.done = threading.Event()
        self.killing = False
        self.container = None    # containers.DockerContainer in container mode
        self.evicted = None      # the eviction message, when the kubelet evicted the pod


def make_node(name, memory, cpu, gpu=None):
    cap = {"memory": memory, "cpu": str(cpu), "pods": "1000", "ephemeral-storage": "1000Gi"}
    if gpu:
        cap["nvidia.com/gpu"] = str(gpu)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                              "kubernetes.io/arch": "amd64"}},
        "spec": {},
        "status": {"capacity": cap, "allocatable": dict(cap),
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "kubelet is posting ready status",
                                   "lastHeartbeatTime": now_rfc3339(), "lastTransitionTime": now_rfc3339()}],
                   "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                 {"type": "Hostname", "address": name}],
                   "nodeInfo": {"kubeletVersion": "v1.32.0", "kubeProxyVersion": "v1.32.0",
                                "operatingSystem": "linux", "architecture": "amd64",
                                "containerRuntimeVersion": "fake://1", "kernelVersion": os.uname().release,
                                "osImage": "fake", "bootID": name, "machineID": name, "systemUUID": name}}}


class Kubelet:
    def __init__(self, store, bin_dir, work_dir, gang_schedulers=(), container_runtime=None, node_mounts=()):
        self.store = store
        # None: pods run as local processes; "docker": as containers from their
        # images (containers.py), with the node's own mounts (host, path,
        # read_only) in every one.
        self.container_runtime = container_runtime
        self.node_mounts = list(node_mounts)
        self.container_label = "%d-%s" % (os.getpid(), os.path.basename(os.path.abspath(work_dir)))
        self.gang = GangSchedulers(store, gang_schedulers)
        self.bin_dir = os.path.abspath(bin_dir) if bin_dir else None
        self.work_dir = os.path.abspath(work_dir)
        self.lock = threading.Lock()
        self.procs = {}          # uid -> PodProc
        self.first_try = {}      # uid -> monotonic time of the first start attempt
        self.next_ip = 0
        self.wake = threading.Event()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        store.listeners.append(self._on_event)
        store.pod_busy = self._pod_busy

    def start(self):
        os.makedirs(self.work_dir, exist_ok=True)
        self.thread.start()

    # ---- hooks called under the store lock -------------------------------

    def _on_event(self, ev):
        if ev.skey in ("/pods", "/nodes", "/configmaps", "/secrets", "scheduling.volcano.sh/podgroups",
                       "scheduling.x-k8s.io/podgroups", "kueue.x-k8s.io/localqueues"):
            self.wake.set()

    def _pod_busy(self, pod):
        with self.lock:
            p = self.procs.get(pod["metadata"].get("uid"))
        return p is not None and not p.done.is_set()

    # ---- queries for the HTTP layer ---------------------------------------

    def log_path(self, pod):
        with self.lock:
            p = self.procs.get(pod["metadata"].get("uid"))
        return os.path.join(p.dir, "log") if p else None

    def running(self, uid):
        with self.lock:
            p = self.procs.get(uid)
        return p is not None and not p.done.is_set()

    @staticmethod
    def children(pid):
        out = []
        try:
            for tid in os.listdir("/proc/%d/task" % pid):
                with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                    out.extend(int(x) for x in f.read().split())
        except OSError:
            pass
        return sorted(set(out))

    def describe(self):
        with self.lock:
            procs = list(self.procs.values())
        out = []
        for p in procs:
            pod = self.store.get_raw("/pods", p.ns, p.name)
            same = pod is not None and pod["metadata"].get("uid") == p.uid
            out.append({"namespace": p.ns, "name": p.name, "uid": p.uid, "pid": p.pid,
                        "children": self.children(p.pid) if p.pid and not p.done.is_set() else [],
                        "running": p.popen is not None and not p.done.is_set(),
                        "phase": (pod.get("status") or {}).get("phase") if same else "Deleted",
                        "exit_code": p.exit_code, "ip": p.ip, "dir": p.dir,
                        "container": p.container.stats.to_json() if p.container else None,
                        "evicted": p.evicted})
        return out

    def signal(self, ns, name, sig, target="main"):
        with self.lock:
            procs = [p for p in self.procs.values() if p.ns == ns and p.name == name and not p.done.is_set()]
        if not procs or procs[-1].pid is None:
            return None
        p = procs[-1]
        if p.container is not None:
            p.container.signal(sig)
            return p.pid
        try:
            if target == "child":
                kids = self.children(p.pid)
                if not kids:
                    return None
                os.kill(kids[0], sig)
                return kids[0]
            if target == "group":
                os.killpg(p.pid, sig)
            else:
                os.kill(p.pid, sig)
        except ProcessLookupError:
            return None
        return p.pid

    def stop(self):
        self.stopping = True
        self.wake.set()
        with self.lock:
            procs = [p for p in self.procs.values() if p.pid and not p.done.is_set()]
        for p in procs:
            self._signal_pod(p, signal.SIGTERM)
        deadline = time.monotonic() + 2.0
        for p in procs:
            p.done.wait(max(0.0, deadline - time.monotonic()))
        for p in procs:
            self._signal_pod(p, signal.SIGKILL)
        if self.container_runtime:
            containers.remove_all(self.container_label)

    def _signal_pod(self, proc, sig):
        """The pod's container (container mode) or its process group."""
        if proc.container is not None:
            proc.container.signal(sig)
        elif proc.pid:
            self._killpg(proc.pid, sig)

    @staticmethod
    def _killpg(pid, sig):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    # ---- the loop -----------------------------------------------------------

    def _loop(self):
        while not self.stopping:
            self.wake.wait(0.5)
            time.sleep(0.05)  # batch bursts of changes into one pass
            self.wake.clear()
            if self.stopping:
                break
            try:
                self._sync()
            except Exception:
                import traceback
                traceback.print_exc()

    def _sync(self):
        store = self.store
        with store.lock:
            pods = list(store.objects.get("/pods", {}).values())
            nodes = {n["metadata"]["name"]: n for n in store.objects.get("/nodes", {}).values()}
        present = set()
        usage = None
        self._dns_index = None
        self.gang.admit_kueue_groups(pods)
        for pod in pods:
            meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
            uid = meta["uid"]
            present.add(uid)
            with self.lock:
                proc = self.procs.get(uid)
            if meta.get("deletionTimestamp"):
                if proc and proc.popen and not proc.done.is_set():
                    if not proc.killing:
                        proc.killing = True
                        grace = meta.get("deletionGracePeriodSeconds", 30)
                        threading.Thread(target=self._kill, args=(proc, grace), daemon=True).start()
                else:
                    store.finish_pod(proc.ns if proc else meta.get("namespace"), meta["name"], uid)
                continue
            if status.get("phase") in ("Succeeded", "Failed") or proc:
                continue
            node = spec.get("nodeName")
            if not node and spec.get("schedulingGates"):
                self._mark_unschedulable(pod, "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates")
                continue
            if not node:
                may, why = self.gang.may_place(pod, pods)
                if not may:
                    self._mark_unschedulable(pod, "Unschedulable", why)
                    continue
                if usage is None:
                    usage = self._usage(pods)
                self._schedule(pod, nodes, usage)
                continue
            if node not in nodes:
                continue
            if not status.get("podIP"):
                self._bind(pod, node)
                continue
            self._try_start(pod, pods)
        with self.lock:
            gone = [p for uid, p in self.procs.items() if uid not in present and p.pid and not p.done.is_set()]
            for uid in [u for u, p in self.procs.items() if u not in present and p.done.is_set()]:
                del self.procs[uid]  # pod and process both gone
        for uid in [u for u in self.first_try if u not in present]:
            del self.first_try[uid]
        for p in gone:  # force-deleted pods: no grace
            self._signal_pod(p, signal.SIGKILL)

    def _usage(self, pods):
        usage = {}
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            if node and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                mem, gpu = _pod_requests(p)
                u = usage.setdefault(node, [0.0, 0.0])
                u[0] += mem
                u[1] += gpu
        return usage

    def _schedule(self, pod, nodes, usage):
        mem, gpu = _pod_requests(pod)
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        reasons = {}
        chosen = None
        for name in sorted(nodes):
            node = nodes[name]
            labels = node["metadata"].get("labels") or {}
            if any(labels.get(k) != v for k, v in selector.items()):
                reasons["node(s) didn't match Pod's node affinity/selector"] = \
                    reasons.get("node(s) didn't match Pod's node affinity/selector", 0) + 1
                continue
            alloc = (node.get("status") or {}).get("allocatable") or {}
            used = usage.get(name, [0.0, 0.0])
            bad = False
            if mem and used[0] + mem > quantity(alloc.get("memory")):
                reasons["Insufficient memory"] = reasons.get("Insufficient memory", 0) + 1
                bad = True
            if gpu and used[1] + gpu > quantity(alloc.get("nvidia.com/gpu")):
                reasons["Insufficient nvidia.com/gpu"] = reasons.get("Insufficient nvidia.com/gpu", 0) + 1
                bad = True
            if not bad:
                chosen = name
                break
        if chosen:
            u = usage.setdefault(chosen, [0.0, 0.0])
            u[0] += mem
            u[1] += gpu
            self._bind(pod, chosen)
            return
        msg = "0/%d nodes are available: %s." % (len(nodes), ", ".join(
            "%d %s" % (n, r) for r, n in sorted(reasons.items())) or "no nodes registered")
        self._mark_unschedulable(pod, "Unschedulable", msg)

    def _mark_unschedulable(self, pod, reason, msg):
        """Pending with PodScheduled False (reason, msg), written only when it changes."""
        meta = pod["metadata"]

        def unschedulable(p):
            conds = (p.get("status") or {}).get("conditions") or []
            for c in conds:
                if c.get("type") == "PodScheduled" and c.get("reason") == reason \
                        and c.get("message") == msg:
                    return None
            st = p.setdefault("status", {})
            st["phase"] = "Pending"
            st["conditions"] = [c for c in conds if c.get("type") != "PodScheduled"] + [
                {"type": "PodScheduled", "status": "False", "reason": reason, "message": msg,
                 "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}]
            return p
        self.store.mutate("/pods", meta.get("namespace"), meta["name"], unschedulable, meta["uid"])

    def _alloc_ip(self):
        with self.lock:
            n = self.next_ip
            self.next_ip += 1
        return "127.0.%d.%d" % (1 + n // 254, 1 + n % 254)

    def _bind(self, pod, node):
        ip = self._alloc_ip()
        meta = pod["metadata"]

        def bind(p):
            if (p.get("status") or {}).get("podIP"):
                return None
            p.setdefault("spec", {})["nodeName"] = node
            st = p.setdefault("status", {})
            st.update({"phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1",
                       "hostIPs": [{"ip": "127.0.0.1"}]})
            st["conditions"] = [c for c in st.get("conditions") or [] if c.get("type") != "PodScheduled"] + [
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                 "lastTransitionTime": now_rfc3339()}]
            return p
        self.store.mutate("/pods", meta.get("namespace"), meta["name"], bind, meta["uid"])

    # ---- starting a pod ---------------------------------------------------

    def _resolve_dns(self, texts, pods, waited):
        """Maps DNS names in texts to pod IPs. None = wait (a pod has no IP yet)."""
        if self._dns_index is None:  # built once per pass
            self._dns_index = {}
            for p in pods:
                meta, spec = p["metadata"], p.get("spec") or {}
                if meta.get("deletionTimestamp") or not spec.get("subdomain"):
                    continue
                host = spec.get("hostname") or meta["name"]
                self._dns_index[(host, spec["subdomain"], meta.get("namespace"))] = \
                    (p.get("status") or {}).get("podIP")
        by_name = self._dns_index
        mapping = {}
        for t in texts:
            for m in _DNS_RE.finditer(t):
                key = (m.group(1), m.group(2), m.group(3))
                if key in by_name:
                    if by_name[key]:
                        mapping[m.group(0)] = by_name[key]
                    elif not waited:
                        return None
                elif not waited:
                    return None
        return mapping

    def _try_start(self, pod, pods):
        meta = pod["metadata"]
        uid = meta["uid"]
        now = time.monotonic()
        first = self.first_try.setdefault(uid, now)
        waited = now - first > DNS_WAIT_S
        spec = pod.get("spec") or {}
        containers = spec.get("containers") or []
        if not containers:
            return
        c = containers[0]
        ns = meta.get("namespace", "default")
        with self.store.lock:
            configmaps = dict(self.store.objects.get("/configmaps", {}))
            secrets = dict(self.store.objects.get("/secrets", {}))
        directory = os.path.join(self.work_dir, "pods", "%s_%s_%s" % (ns, meta["name"], uid[:8]))
        # Volumes.
        local_vols = {}
        files = {}
        memory_vols = {}   # emptyDir medium Memory: name -> sizeLimit bytes (0: none)
        sized_vols = {}    # emptyDir on disk with a sizeLimit: name -> bytes
        for v in spec.get("volumes") or []:
            vdir = os.path.join(directory, "volumes", v["name"])
            empty = v.get("emptyDir")
            if isinstance(empty, dict):
                limit = int(quantity(empty.get("sizeLimit"))) if empty.get("sizeLimit") else 0
                if empty.get("medium") == "Memory":
                    memory_vols[v["name"]] = limit
                elif limit:
                    sized_vols[v["name"]] = limit
            src = v.get("configMap") or v.get("secret")
            if src is not None:
                is_cm = "configMap" in v
                ref = src.get("name") if is_cm else src.get("secretName")
                obj = (configmaps if is_cm else secrets).get((ns, ref))
                if obj is None:
                    if src.get("optional"):
                        local_vols[v["name"]] = vdir
                        continue
                    return  # real kubelet: ContainerCreating until it exists
                data = dict(obj.get("data") or {})
                if is_cm:
                    raw = {k: v2.encode() for k, v2 in data.items()}
                    raw.update({k: base64.b64decode(v2) for k, v2 in (obj.get("binaryData") or {}).items()})
                else:
                    raw = {k: base64.b64decode(v2) for k, v2 in data.items()}
                    raw.update({k: v2.encode() for k, v2 in (obj.get("stringData") or {}).items()})
                items = src.get("items")
                for key, content in raw.items():
                    if items:
                        paths = [i.get("path", key) for i in items if i.get("key") == key]
                    else:
                        paths = [key]
                    for pth in paths:
                        files[os.path.join(vdir, pth)] = content
                local_vols[v["name"]] = vdir
            elif "hostPath" in v:
                local_vols[v["name"]] = v["hostPath"].get("path")
            else:  # emptyDir (any medium) and anything else: a fresh directory
                local_vols[v["name"]] = vdir
        mounts = []
        mount_info = []  # (volume, mountPath, local, readOnly)
        for vm in c.get("volumeMounts") or []:
            local = local_vols.get(vm.get("name"))
            if local is None:
                continue
            if vm.get("subPath"):
                local = os.path.join(local, vm["subPath"])
            mounts.append((vm["mountPath"].rstrip("/") or "/", local))
            mount_info.append((vm.get("name"), vm["mountPath"].rstrip("/") or "/", local, bool(vm.get("readOnly"))))
        mounts.sort(key=lambda m: -len(m[0]))
        # Environment.
        env_map = {}
        status = pod.get("status") or {}

        def field_ref(path):
            m = re.match(r"^metadata\.(labels|annotations)\['(.*)'\]$", path)
            if m:
                return (meta.get(m.group(1)) or {}).get(m.group(2), "")
            table = {"metadata.name": meta["name"], "metadata.namespace": ns, "metadata.uid": uid,
                     "status.podIP": status.get("podIP", ""), "status.hostIP": status.get("hostIP", ""),
                     "spec.nodeName": spec.get("nodeName", ""),
                     "spec.serviceAccountName": spec.get("serviceAccountName", "default")}
            return table.get(path, "")

        for ef in c.get("envFrom") or []:
            ref = ef.get("configMapRef")
            if ref:
                obj = configmaps.get((ns, ref.get("name")))
                for k, v in ((obj or {}).get("data") or {}).items():
                    env_map[ef.get("prefix", "") + k] = v
        for e in c.get("env") or []:
            if "valueFrom" in e:
                vf = e["valueFrom"]
                val = ""
                if "fieldRef" in vf:
                    val = field_ref(vf["fieldRef"].get("fieldPath", ""))
                elif "configMapKeyRef" in vf:
                    r = vf["configMapKeyRef"]
                    obj = configmaps.get((ns, r.get("name")))
                    if obj is None and not r.get("optional"):
                        return
                    val = ((obj or {}).get("data") or {}).get(r.get("key"), "")
                elif "secretKeyRef" in vf:
                    r = vf["secretKeyRef"]
                    obj = secrets.get((ns, r.get("name")))
                    if obj is None and not r.get("optional"):
                        return
                    raw = ((obj or {}).get("data") or {}).get(r.get("key"))
                    val = base64.b64decode(raw).decode(errors="replace") if raw else ""
                elif "resourceFieldRef" in vf:
                    r = vf["resourceFieldRef"]
                    kind, _, res = r.get("resource", "").partition(".")
                    q = ((c.get("resources") or {}).get(kind) or {}).get(res)
                    div = quantity(r.get("divisor", "1")) or 1
                    val = str(int(-(-quantity(q) // div))) if q is not None else "0"
                env_map[e["name"]] = val
            else:
                env_map[e["name"]] = expand_vars(str(e.get("value", "")), env_map)
        argv = [expand_vars(str(a), env_map) for a in (c.get("command") or []) + (c.get("args") or [])]
        dns = self._resolve_dns(argv + list(env_map.values()), pods, waited)
        if dns is None:
            return

        def localize(text):
            text = replace_mounts(text, mounts)
            if dns:
                text = _DNS_RE.sub(lambda m: dns.get(m.group(0), m.group(0)), text)
            return text

        if self.container_runtime:
            self._start_container(pod, c, directory, local_vols, files, memory_vols, sized_vols, mount_info,
                                  env_map, dns)
            return
        argv = [localize(a) for a in argv]
        env = dict(os.environ)
        env["PATH"] = (self.bin_dir + ":" if self.bin_dir else "") + os.environ.get("PATH", "/usr/bin:/bin")
        env["HOME"] = directory
        env["HOSTNAME"] = spec.get("hostname") or meta["name"]
        env.update({k: localize(v) for k, v in env_map.items()})
        self._materialize(directory, local_vols, files)
        proc = PodProc(pod, directory)
        with self.lock:
            self.procs[uid] = proc
        self.first_try.pop(uid, None)
        started = now_rfc3339()
        log = open(os.path.join(directory, "log"), "ab")
        try:
            if not argv:
                raise OSError("container has no command")
            proc.popen = subprocess.Popen(argv, cwd=directory, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
            proc.pid = proc.popen.pid
        except OSError as e:
            self._start_failed(proc, c, started, log, e)
            return
        log.close()
        self._set_running(proc, c, started)
        threading.Thread(target=self._reap, args=(proc, c, started), daemon=True).start()

    def _start_failed(self, proc, c, started, log, error):
        """A container that could not start: Failed, exit code 128, StartError."""
        log.write(("failed to start container: %s\n" % error).encode())
        log.close()
        proc.exit_code = 128
        proc.done.set()
        self._set_terminated(proc, c, started, 128, None, "StartError", str(error))

    def _materialize(self, directory, local_vols, files):
        """The pod directory, its volumes' folders (0777, as the kubelet makes
        emptyDirs) and its configMap and secret files."""
        os.makedirs(directory, exist_ok=True)
        for name, vdir in local_vols.items():
            if vdir.startswith(directory):
                os.makedirs(vdir, exist_ok=True)
                os.chmod(vdir, 0o777)
        for path, content in files.items():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(content)
            os.chmod(path, 0o644)

    def _start_container(self, pod, c, directory, local_vols, files, memory_vols, sized_vols, mount_info, env_map,
                         dns):
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid = meta["uid"]
        security = dict((spec.get("securityContext") or {}))
        security.update(c.get("securityContext") or {})
        image = c.get("image", "")
        proc = PodProc(pod, directory)
        with self.lock:
            self.procs[uid] = proc
        self.first_try.pop(uid, None)
        started = now_rfc3339()
        refusal = containers.refuse_root(image, security)
        if refusal:
            proc.exit_code = 128
            proc.done.set()
            self._set_waiting_error(proc, c, "CreateContainerConfigError", "Error: " + refusal)
            return
        self._materialize(directory, local_vols, files)
        bind, tmpfs = list(self.node_mounts), []
        for vol, path, local, ro in mount_info:
            if vol in memory_vols:
                tmpfs.append((path, memory_vols[vol]))
            else:
                bind.append((local, path, ro))
        env = {k: v for k, v in env_map.items()}
        env.setdefault("HOSTNAME", spec.get("hostname") or meta["name"])
        command = [expand_vars(str(a), env_map) for a in c.get("command") or []]
        args = [expand_vars(str(a), env_map) for a in c.get("args") or []]
        container = containers.DockerContainer("pstar-fake-%s" % uid[:13], self.container_label)
        run = container.run_args(container.name, self.container_label, image, command, args, env, bind, tmpfs,
                                 c.get("resources") or {}, security, dns or {}, c.get("workingDir"))
        log = open(os.path.join(directory, "log"), "ab")
        try:
            container.start(run, log)
        except OSError as e:
            self._start_failed(proc, c, started, log, e)
            return
        log.close()
        proc.container = container
        proc.popen = container.popen
        proc.pid = container.popen.pid
        self._set_running(proc, c, started)
        threading.Thread(target=self._reap_container, args=(proc, c, started), daemon=True).start()
        limit = quantity(((c.get("resources") or {}).get("limits") or {}).get("ephemeral-storage"))
        sized = {local_vols[n]: (n, b) for n, b in sized_vols.items() if n in local_vols}
        if sized or limit:
            threading.Thread(target=self._watch_storage, args=(proc, sized, int(limit)), daemon=True).start()

    def _watch_storage(self, proc, sized, limit):
        """Evicts the pod when an emptyDir outgrows its sizeLimit or the pod's
        emptyDirs and log outgrow the container's ephemeral-storage limit, as
        the kubelet's local storage eviction does."""
        def usage(path):
            total = 0
            for dirpath, _, names in os.walk(path):
                for n in names:
                    try:
                        total += os.lstat(os.path.join(dirpath, n)).st_blocks * 512
                    except OSError:
                        pass
            return total
        while not proc.done.wait(1.0):
            message = None
            used_total = 0
            for path, (name, cap) in sized.items():
                used = usage(path)
                used_total += used
                if used > cap:
                    message = 'Usage of EmptyDir volume "%s" exceeds the limit "%s". ' % (name, _format_quantity(cap))
                    break
            if message is None and limit:
                used_total = usage(os.path.join(proc.dir, "volumes")) + usage(os.path.join(proc.dir, "log"))
                if used_total > limit:
                    message = "Pod ephemeral local storage usage exceeds the total limit of containers %s. " % \
                        _format_quantity(limit)
            if message:
                proc.evicted = message
                self._signal_pod(proc, signal.SIGKILL)
                return

    def _reap_container(self, proc, c, started):
        code, oom = proc.container.wait()
        proc.exit_code = code
        proc.done.set()
        proc.container.remove()
        if proc.evicted:
            self._set_terminated(proc, c, started, code, None, "Error", None, evicted=proc.evicted)
        else:
            self._set_terminated(proc, c, started, code, None,
                                 "OOMKilled" if oom else "Completed" if code == 0 else "Error")

    def _set_waiting_error(self, proc, c, reason, message):
        """A container the kubelet will not start: Pending, waiting with the reason."""
        def waiting(p):
            st = p.setdefault("status", {})
            st["phase"] = "Pending"
            st["containerStatuses"] = [self._container_status(c, proc, {"waiting": {"reason": reason,
                                                                                      "message": message}}, False)]
            return p
        self.store.mutate("/pods", proc.ns, proc.name, waiting, proc.uid)

    def _container_status(self, c, proc, state, ready):
        return {"name": c.get("name", "main"), "image": c.get("image", ""), "imageID": "",
                "containerID": ("docker://%s" % proc.container.id) if proc.container and proc.container.id
                else "fake://%s" % (proc.pid or 0), "ready": ready, "started": ready,
                "restartCount": 0, "state": state, "lastState": {}}

    def _set_running(self, proc, c, started):
        def running(p):
            st = p.setdefault("status", {})
            st["phase"] = "Running"
            st["startTime"] = started
            t = now_rfc3339()
            st["conditions"] = [
                {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": t},
                {"type": "Ready", "status": "True", "lastProbeTime": None, "lastTransitionTime": t},
                {"type": "ContainersReady", "status": "True", "lastProbeTime": None, "lastTransitionTime": t},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": t}]
            st["containerStatuses"] = [self._container_status(c, proc, {"running": {"startedAt": started}}, True)]
            return p
        self.store.mutate("/pods", proc.ns, proc.name, running, proc.uid)

    def _set_terminated(self, proc, c, started, code, sig, reason, message=None, evicted=None):
        def terminated(p):
            st = p.setdefault("status", {})
            st["phase"] = "Succeeded" if code == 0 and not evicted else "Failed"
            if evicted:
                st["reason"] = "Evicted"
                st["message"] = evicted
            st.setdefault("startTime", started)
            t = now_rfc3339()
            term = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": t,
                    "containerID": ("docker://%s" % proc.container.id) if proc.container and proc.container.id
                    else "fake://%s" % (proc.pid or 0)}
            if sig:
                term["signal"] = sig
            if message:
                term["message"] = message
            st["conditions"] = [
                {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": t},
                {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastProbeTime": None,
                 "lastTransitionTime": t},
                {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastProbeTime": None,
                 "lastTransitionTime": t},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": t}]
            st["containerStatuses"] = [self._container_status(c, proc, {"terminated": term}, False)]
            return p
        self.store.mutate("/pods", proc.ns, proc.name, terminated, proc.uid)
        self.store.finish_pod(proc.ns, proc.name, proc.uid)
        self.wake.set()

    def _reap(self, proc, c, started):
        rc = proc.popen.wait()
        self._killpg(proc.pid, signal.SIGKILL)  # the container ends with its main process
        sig = -rc if rc < 0 else None
        code = 128 + sig if sig else rc
        proc.exit_code = code
        proc.done.set()
        self._set_terminated(proc, c, started, code, sig, "Completed" if code == 0 else "Error")

    def _kill(self, proc, grace):
        self._signal_pod(proc, signal.SIGTERM)
        if not proc.done.wait(max(0.0, float(grace or 0))):
            self._signal_pod(proc, signal.SIGKILL)
