"""Container mode of the fake kubelet: each pod's first container runs from
its image under the local Docker daemon, with the pod's limits as cgroup
limits, the way the kubelet and a container runtime would run it.

What a pod gets (docker run flags):
- resources: limits.memory -> --memory (and --memory-swap, no swap),
  requests.memory -> --memory-reservation, limits.cpu -> --cpus;
- the host network (--network host); the pod DNS names of the pods the
  container's args and environment name -> --add-host to their pod IPs;
- volumes: configMap/secret files and emptyDir as host folders under the pod
  directory (mode 0777, as the kubelet makes emptyDirs), emptyDir with
  medium Memory as a tmpfs of its sizeLimit (charged to the container's
  memory, as on a node), hostPath as given; mount paths as the pod names them;
- securityContext (container over pod): runAsUser/runAsGroup -> --user,
  readOnlyRootFilesystem -> --read-only (with a /tmp tmpfs, as images
  expect), capabilities drop/add, allowPrivilegeEscalation false ->
  no-new-privileges; runAsNonRoot refuses an image whose user is root
  (CreateContainerConfigError, as the kubelet does);
- command -> --entrypoint plus the rest, args after the image.

While a container runs its cgroup is read every 0.5 s (v1:
memory.limit_in_bytes, max_usage_in_bytes, failcnt; v2: memory.max,
memory.peak, memory.events oom_kill), and so is the peak RSS (VmHWM) of each
of its processes; the last readings stay with the pod after it ends
(GET /fake/kubelet/pods). A container the kernel OOM-killed is reported as
the kubelet reports it: terminated, reason OOMKilled, exit code 137.
"""

import json
import os
import subprocess
import threading
import time

CGROUP_ROOT = "/sys/fs/cgroup"
POLL_S = 0.5


def docker(*args, check=True, timeout=120):
    r = subprocess.run(["docker"] + list(args), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError("docker %s: %s" % (args[0], (r.stderr or r.stdout).strip().splitlines()[-1:]))
    return r


def cgroup_version():
    return 2 if os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")) else 1


def _read_int(path):
    try:
        with open(path) as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _cgroup_dirs(container_id):
    """The container's memory cgroup folder (cgroupfs driver, v1 or v2; the
    systemd driver's docker-<id>.scope too)."""
    cands = []
    v1 = os.path.join(CGROUP_ROOT, "memory")
    base = v1 if os.path.isdir(v1) else CGROUP_ROOT
    cands.append(os.path.join(base, "docker", container_id))
    cands.append(os.path.join(base, "system.slice", "docker-%s.scope" % container_id))
    return [c for c in cands if os.path.isdir(c)]


class ContainerStats:
    """The last cgroup readings of a container, and its processes' peak RSS."""

    def __init__(self):
        self.version = cgroup_version()
        self.limit_bytes = None
        self.max_usage_bytes = None
        self.failcnt = None      # v1
        self.oom_kill = None     # v2 memory.events, and v1 memory.oom_control where the kernel has it
        self.peak_rss = {}       # pid -> {"cmdline": ..., "vmhwm_bytes": ...}

    def read(self, container_id):
        dirs = _cgroup_dirs(container_id)
        if not dirs:
            return
        d = dirs[0]
        if self.version == 1:
            self.limit_bytes = _read_int(os.path.join(d, "memory.limit_in_bytes"))
            self.max_usage_bytes = _read_int(os.path.join(d, "memory.max_usage_in_bytes"))
            self.failcnt = _read_int(os.path.join(d, "memory.failcnt"))
            events = os.path.join(d, "memory.oom_control")
        else:
            self.limit_bytes = _read_int(os.path.join(d, "memory.max"))
            peak = _read_int(os.path.join(d, "memory.peak"))
            self.max_usage_bytes = peak if peak is not None else _read_int(os.path.join(d, "memory.current"))
            events = os.path.join(d, "memory.events")
        try:
            with open(events) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == "oom_kill":
                        self.oom_kill = int(v)
        except (OSError, ValueError):
            pass
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                pids = [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            pids = []
        for pid in pids:
            try:
                with open("/proc/%d/status" % pid) as f:
                    hwm = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")), None)
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except (OSError, ValueError, StopIteration):
                continue
            if hwm is not None:
                prev = self.peak_rss.get(pid, {}).get("vmhwm_bytes", 0)
                self.peak_rss[pid] = {"cmdline": cmdline, "vmhwm_bytes": max(prev, hwm)}

    def to_json(self):
        return {"cgroup_version": self.version, "limit_bytes": self.limit_bytes,
                "max_usage_bytes": self.max_usage_bytes, "failcnt": self.failcnt, "oom_kill": self.oom_kill,
                "processes": [dict(pid=pid, **v) for pid, v in sorted(self.peak_rss.items())]}


def image_user(image):
    r = docker("image", "inspect", "--format", "{{.Config.User}}", image, check=False)
    if r.returncode != 0:
        return None
    return r.stdout.strip()


def _runs_as_root(user):
    name = (user or "").split(":")[0]
    return name in ("", "0", "root")


class DockerContainer:
    """One pod's container under the Docker daemon."""

    def __init__(self, name, label):
        self.name = name
        self.label = label
        self.id = None
        self.popen = None
        self.stats = ContainerStats()
        self._stop = threading.Event()

    @staticmethod
    def run_args(name, label, image, argv_command, argv_args, env, mounts, tmpfs, resources, security, add_hosts,
                 workdir):
        """The docker run command line. mounts: (host, container, read_only);
        tmpfs: (path, size_bytes); label: this kubelet's, on every container."""
        a = ["docker", "run", "--name", name, "--network", "host", "--label", "io.patrickstar.fake-kubelet=" + label]
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        from kubelet import quantity  # the one parser of quantities
        if limits.get("memory"):
            mem = int(quantity(limits["memory"]))
            a += ["--memory", str(mem), "--memory-swap", str(mem)]
        if requests.get("memory"):
            a += ["--memory-reservation", str(int(quantity(requests["memory"])))]
        if limits.get("cpu"):
            a += ["--cpus", "%g" % quantity(limits["cpu"])]
        for k, v in env.items():
            a += ["--env", "%s=%s" % (k, v)]
        for host, path, ro in mounts:
            a += ["--mount", "type=bind,source=%s,target=%s%s" % (host, path, ",readonly" if ro else "")]
        for path, size in tmpfs:
            a += ["--tmpfs", "%s:rw,mode=1777%s" % (path, (",size=%d" % size) if size else "")]
        for host, ip in sorted(add_hosts.items()):
            a += ["--add-host", "%s:%s" % (host, ip)]
        if security.get("runAsUser") is not None:
            user = str(security["runAsUser"])
            if security.get("runAsGroup") is not None:
                user += ":%s" % security["runAsGroup"]
            a += ["--user", user]
        if security.get("readOnlyRootFilesystem"):
            a += ["--read-only"]
            if not any(p == "/tmp" for p, _ in tmpfs):
                a += ["--tmpfs", "/tmp:rw,mode=1777"]
        caps = security.get("capabilities") or {}
        for c in caps.get("drop") or []:
            a += ["--cap-drop", c]
        for c in caps.get("add") or []:
            a += ["--cap-add", c]
        if security.get("allowPrivilegeEscalation") is False:
            a += ["--security-opt", "no-new-privileges"]
        if workdir:
            a += ["--workdir", workdir]
        if argv_command:
            a += ["--entrypoint", argv_command[0], image] + argv_command[1:] + argv_args
        else:
            a += [image] + argv_args
        return a

    def start(self, args, log):
        """Starts `docker run` attached (its exit mirrors the container's)."""
        self.popen = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.popen.poll() is None:
            r = docker("inspect", "--format", "{{.Id}}", self.name, check=False, timeout=30)
            if r.returncode == 0 and r.stdout.strip():
                self.id = r.stdout.strip()
                break
            time.sleep(0.1)
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self):
        while not self._stop.is_set():
            if self.id:
                self.stats.read(self.id)
            if self.popen.poll() is not None:
                break
            self._stop.wait(POLL_S)

    def wait(self):
        """Waits for the end; returns (exit_code, oom_killed, signal_name or None)."""
        rc = self.popen.wait()
        self._stop.set()
        r = docker("inspect", "--format", "{{json .State}}", self.name, check=False, timeout=60)
        oom, code = False, rc
        if r.returncode == 0:
            try:
                state = json.loads(r.stdout)
                oom = bool(state.get("OOMKilled"))
                code = int(state.get("ExitCode", rc))
            except ValueError:
                pass
        if oom:
            code = 137
        return code, oom

    def signal(self, sig):
        docker("kill", "--signal", str(int(sig)), self.name, check=False, timeout=30)

    def remove(self):
        docker("rm", "-f", self.name, check=False, timeout=60)


def refuse_root(image, security):
    """The kubelet's runAsNonRoot check: a message when it refuses the start."""
    if not security.get("runAsNonRoot"):
        return None
    if security.get("runAsUser") is not None:
        return None if int(security["runAsUser"]) != 0 else "container's runAsUser breaks non-root policy"
    user = image_user(image)
    if user is None:
        return None  # the start itself reports a missing image
    if _runs_as_root(user):
        return "container has runAsNonRoot and image will run as root"
    if not user.split(":")[0].isdigit():
        return "container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is non-root" % user
    return None


def remove_all(label):
    """This kubelet's containers, whatever their state."""
    r = docker("ps", "-aq", "--filter", "label=io.patrickstar.fake-kubelet=" + label, check=False)
    ids = r.stdout.split() if r.returncode == 0 else []
    if ids:
        docker("rm", "-f", *ids, check=False)
