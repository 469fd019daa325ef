#!/usr/bin/python3
"""Walks docs/install.md as a new user would, from a clean copy of the
repository (the files git tracks, as a fresh clone holds them).

Every command line of the page's code blocks is handled, in page order, or
the test fails naming it, so a step added to the page is a step the walk must
know. Steps that can run here run for real: the loopback fake API server with
its kubelet (pods as local processes), the real kubectl, the operator built
in --build, the CPU example trained to Succeeded, the CRD takeover labels. The
rest is checked as far as this machine allows: `docker build` names a
Dockerfile (and its .dockerignore) that exists and a tag the chart expects,
`docker push` a tag built before, `helm` a chart that exists with every
`--set` accepted by values.schema.json (and `helm template` with the same
values where helm is installed), the build line the targets the walk uses.

Substitutions, the only ones: ~/.kube/config and /tmp/fk.* name files in the
walk's temporary directory, fixed metrics ports become 0 (any free port), and
`helm install` is stood in for by what it installs that can run here (the
CRD from the chart's copy, and the operator with leader election in the
release namespace)."""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
KUBECTL = "/usr/bin/kubectl"
BUILD = None  # set from --build

try:
    import jsonschema
    import yaml
except ImportError:  # pragma: no cover
    jsonschema = None
    yaml = None


def code_blocks(markdown):
    """(first line number, lines) of every fenced code block."""
    blocks, current, start = [], None, 0
    for n, line in enumerate(markdown.splitlines(), 1):
        if line.startswith("```"):
            if current is None:
                current, start = [], n + 1
            else:
                blocks.append((start, current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def commands(lines):
    """Command lines, continuations joined, comments and blank lines dropped."""
    out, pending = [], ""
    for line in lines:
        stripped = line.split(" #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
        if not stripped and not pending:
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        out.append((pending + stripped).strip())
        pending = ""
    return [c for c in out if c]


def clean_copy(dest):
    """The tracked files of the checkout, as a clone has them."""
    files = subprocess.run(["git", "-C", REPO, "ls-files", "-z"], check=True, capture_output=True).stdout
    for rel in files.decode().split("\0"):
        if not rel:
            continue
        src, dst = os.path.join(REPO, rel), os.path.join(dest, rel)
        if not os.path.lexists(src):
            continue  # deleted in the working tree, not yet committed
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def set_path(values, dotted, value):
    keys = dotted.split(".")
    node = values
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise AssertionError("--set %s: %s is not a map" % (dotted, k))
    node[keys[-1]] = value


def typed(text):
    """A --set value as helm types it."""
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text == "null":
        return None
    return text


class Walk:
    def __init__(self, test, root, tmp):
        self.test, self.root, self.tmp = test, root, tmp
        self.env = dict(os.environ)
        self.vars = {}
        self.built_tags = set()
        self.processes = []
        self.operator = None  # the operator process standing in for the installed one
        self.kubeconfig = os.path.join(tmp, "fk.kubeconfig")
        self.log = []

    # -- helpers -------------------------------------------------------------

    def expand(self, text):
        for name, value in self.vars.items():
            text = text.replace("$" + name, value).replace("${%s}" % name, value)
        return text

    def substitute(self, text):
        text = text.replace("~/.kube/config", self.kubeconfig)
        text = re.sub(r"/tmp/fk(\.\w+)?", lambda m: os.path.join(self.tmp, "fk" + (m.group(1) or "")), text)
        return re.sub(r"--metrics-port \d+", "--metrics-port 0", text)

    def run(self, argv, timeout=60, check=True):
        r = subprocess.run(argv, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check:
            self.test.assertEqual(r.returncode, 0, "%s failed:\n%s%s" % (" ".join(argv), r.stdout, r.stderr))
        return r

    def start(self, argv, name):
        log_path = os.path.join(self.tmp, name + ".log")
        with open(log_path, "w") as out:
            p = subprocess.Popen(argv, cwd=self.root, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        p.log_path = log_path
        self.processes.append(p)
        return p

    @staticmethod
    def output(p):
        with open(p.log_path) as f:
            return f.read()

    def stop(self, p):
        if p is None or p.poll() is not None:
            return
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def stop_all(self):
        for p in self.processes:
            self.stop(p)

    def operator_ready(self, p, timeout=30):
        """Waits for the operator's metrics line, then for /readyz."""
        end = time.time() + timeout
        port = 0
        while time.time() < end and p.poll() is None:
            m = re.search(r"on [0-9.]+:(\d+)", self.output(p))
            if m:
                port = int(m.group(1))
                try:
                    with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % port, timeout=2) as r:
                        if r.status == 200:
                            return port
                except OSError:
                    pass
            time.sleep(0.2)
        self.test.fail("the operator did not become ready:\n" + self.output(p))

    # -- environment ---------------------------------------------------------

    def start_cluster(self, line):
        """The page's fake API server line, started before the walk needs a cluster."""
        argv = shlex.split(self.substitute(line.rstrip("&").strip()))
        self.cluster = self.start(argv, "fake-apiserver")
        port_file = argv[argv.index("--port-file") + 1]
        end = time.time() + 30
        while time.time() < end and not (os.path.exists(port_file) and os.path.exists(self.kubeconfig)):
            self.test.assertIsNone(self.cluster.poll(), self.output(self.cluster))
            time.sleep(0.1)
        self.test.assertTrue(os.path.exists(self.kubeconfig), "the fake API server wrote no kubeconfig")
        self.env["KUBECONFIG"] = self.kubeconfig

    # -- step handlers -------------------------------------------------------

    def step(self, cmd):
        cmd = cmd.strip()
        self.log.append(cmd)
        m = re.fullmatch(r"([A-Z_]+)=(\S+)", cmd)
        if m:
            self.vars[m.group(1)] = m.group(2)
            return
        m = re.fullmatch(r"export ([A-Z_]+)=(\S+)", cmd)
        if m:
            self.env[m.group(1)] = self.substitute(m.group(2))
            self.test.assertEqual(self.env["KUBECONFIG"], self.kubeconfig)
            return
        m = re.fullmatch(r"for (\w+) in ([\w\- ]+); do (.+); done", cmd)
        if m:
            for item in m.group(2).split():
                self.step(m.group(3).replace("$" + m.group(1), item))
            return
        cmd = self.expand(cmd)
        words = shlex.split(cmd.rstrip("&").strip())
        tool = words[0]
        if tool == "docker":
            return self.docker(words)
        if tool == "helm":
            return self.helm(words)
        if tool == "kubectl":
            return self.kubectl(words)
        if tool == "cmake":
            return self.build_line(cmd)
        if tool == "build/bin/pstar-operator":
            return self.run_operator(cmd)
        if tool == "scripts/build-images.sh":
            return self.build_images(words)
        if tool == "/usr/bin/python3" and "tests/fake_kube/fake_apiserver.py" in cmd:
            self.test.assertIsNone(self.cluster.poll(), "the fake API server, started first, is gone")
            return
        self.test.fail("install.md has a step the walk does not know: " + cmd)

    def docker(self, words):
        if words[1] == "build":
            dockerfile = words[words.index("-f") + 1]
            tag = words[words.index("-t") + 1]
            self.test.assertEqual(words[-1], ".", "images build from the repository root")
            self.test.assertTrue(os.path.isfile(os.path.join(self.root, dockerfile)), dockerfile + " is not in a clone")
            self.test.assertTrue(os.path.isfile(os.path.join(self.root, dockerfile + ".dockerignore")),
                                 dockerfile + ".dockerignore is not in a clone")
            self.check_tag(tag)
            self.built_tags.add(tag)
        elif words[1] == "push":
            self.test.assertIn(words[2], self.built_tags, "pushes an image the page did not build")
        else:
            self.test.fail("unknown docker step: " + " ".join(words))

    def build_images(self, words):
        """The image script is in a clone and executable; its images are the
        Dockerfiles' and carry the tags the chart expects, so pushes of them
        may follow."""
        script = os.path.join(self.root, words[0])
        self.test.assertTrue(os.access(script, os.X_OK), words[0] + " is not an executable file in a clone")
        repo, names, i = "ghcr.io/patrickstar-k8s", [], 1
        while i < len(words):
            self.test.assertIn(words[i], ("--repository", "--only"), "unknown build-images.sh option " + words[i])
            if words[i] == "--repository":
                repo = words[i + 1]
            else:
                names.append(words[i + 1])
            i += 2
        with open(os.path.join(self.root, "CMakeLists.txt")) as f:
            version = re.search(r"project\(patrickstar VERSION ([0-9.]+)", f.read()).group(1)
        for name in names or ["worker-cpu", "operator", "worker"]:
            self.test.assertTrue(os.path.isfile(os.path.join(self.root, "docker", name + ".Dockerfile")),
                                 "build-images.sh --only " + name + ": no such Dockerfile")
            tag = "%s/pstar-%s:%s" % (repo, name, version)
            self.check_tag(tag)
            self.built_tags.add(tag)

    def yaml_file(self, rel):
        with open(os.path.join(self.root, rel)) as f:
            return yaml.safe_load(f)

    def check_tag(self, tag):
        chart = self.yaml_file("charts/patrickstar/Chart.yaml")
        values = self.yaml_file("charts/patrickstar/values.yaml")
        repo, _, version = tag.rpartition(":")
        self.test.assertEqual(version, chart["appVersion"], tag + ": the chart expects its appVersion as the tag")
        names = {values["operator"]["image"]["repository"].rsplit("/", 1)[1],
                 values["worker"]["image"]["repository"].rsplit("/", 1)[1],
                 values["worker"]["cpuImage"]["repository"].rsplit("/", 1)[1]}
        self.test.assertIn(repo.rsplit("/", 1)[1], names, tag + " is not an image the chart names")

    def helm(self, words):
        sub = words[1]
        if sub == "uninstall":
            # What uninstall removes that runs here: the operator. The CRD and the jobs stay (crds.keep).
            self.stop(self.operator)
            self.operator = None
            self.run([KUBECTL, "get", "crd", "patrickstarjobs.patrickstar.io"])
            return
        self.test.assertIn(sub, ("install", "upgrade"), "unknown helm step")
        chart = words[3]
        self.test.assertTrue(os.path.isfile(os.path.join(self.root, chart, "Chart.yaml")), chart + " is no chart")
        values = self.yaml_file(os.path.join(chart, "values.yaml"))
        with open(os.path.join(self.root, chart, "values.schema.json")) as f:
            schema = json.load(f)
        i = 4
        while i < len(words):
            w = words[i]
            if w in ("--set", "--set-string"):
                key, _, value = words[i + 1].partition("=")
                set_path(values, key, value if w == "--set-string" else typed(value))
                i += 2
            elif w in ("--namespace", "-n"):
                namespace = words[i + 1]
                i += 2
            else:
                self.test.assertIn(w, ("--create-namespace", "--reuse-values"), "unknown helm flag " + w)
                i += 1
        try:
            jsonschema.validate(values, schema)
        except jsonschema.ValidationError as e:
            self.test.fail("%s: values.schema.json refuses it: %s" % (" ".join(words), e.message))
        if shutil.which("helm"):
            argv = ["helm", "template", words[2], chart] + [w for w in words[4:] if w not in
                                                             ("--create-namespace", "--reuse-values")]
            self.run(argv)
        if sub == "install" and self.operator is None:
            self.run([KUBECTL, "apply", "-f", os.path.join(chart, "files/crds/patrickstarjob.yaml")])
            self.operator = self.start([os.path.join(self.root, "build/bin/pstar-operator"), "--kubeconfig",
                                        self.kubeconfig, "--metrics-port", "0", "--leader-elect",
                                        "--leader-election-namespace", namespace], "operator-installed")
            self.operator_ready(self.operator)

    def kubectl(self, words):
        argv = [KUBECTL] + words[1:]
        if "-w" in words:
            return self.watch(argv)
        if words[1:3] == ["logs", "-f"]:
            r = self.run(argv, timeout=120)
            self.test.assertRegex(r.stdout, r"step\s+\d+", "the rank's log has no progress lines")
            return
        r = self.run(argv)
        if words[1] == "describe":
            self.test.assertIn("Succeeded", r.stdout)
        if words[1] in ("label", "annotate"):
            crd = json.loads(self.run([KUBECTL, "get"] + words[2:4] + ["-o", "json"]).stdout)
            field = "labels" if words[1] == "label" else "annotations"
            for pair in words[4:]:
                key, _, value = pair.partition("=")
                self.test.assertEqual(crd["metadata"].get(field, {}).get(key), value, pair)

    def watch(self, argv):
        """A -w step: read its lines until the job it watches has Succeeded."""
        p = subprocess.Popen(argv, cwd=self.root, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        seen = []
        deadline = time.time() + 240
        try:
            for line in p.stdout:
                seen.append(line)
                if re.search(r"\bSucceeded\b", line) and line.split()[0].startswith(("tiny-cpu",
                                                                                     "patrickstarjob")):
                    return
                if re.search(r"\bFailed\b", line) and "tiny-cpu" in line.split()[0]:
                    self.test.fail("the job failed:\n" + "".join(seen))
                if time.time() > deadline:
                    break
            self.test.fail("%s never showed Succeeded:\n%s" % (" ".join(argv), "".join(seen)))
        finally:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait()
            p.stdout.close()

    def build_line(self, cmd):
        """The build: here --build holds its output; the walk needs the targets it names."""
        m = re.search(r"ninja -C build (.+)$", cmd)
        self.test.assertIsNotNone(m, "unknown build step: " + cmd)
        for target in m.group(1).split():
            self.test.assertTrue(os.access(os.path.join(self.root, "build/bin", target), os.X_OK),
                                 target + " was not built")

    def run_operator(self, cmd):
        argv = shlex.split(self.substitute(cmd.rstrip("&").strip()))
        # The page's flags, checked against --help: a renamed flag fails here.
        helptext = self.run([argv[0], "--help"]).stdout
        for flag in (a for a in argv[1:] if a.startswith("--")):
            self.test.assertIn(flag, helptext, flag + " is not a pstar-operator flag")
        # One operator at a time (the page: stop the installed one first).
        self.stop(self.operator)
        self.operator = self.start(argv, "operator-local")
        self.operator_ready(self.operator)


class InstallWalkTest(unittest.TestCase):
    def test_walk_install_md(self):
        if jsonschema is None or yaml is None:
            self.skipTest("python3-jsonschema and python3-yaml are needed (scripts/install-deps.sh)")
        tmp = tempfile.mkdtemp(prefix="install-walk-")
        walk = None
        try:
            root = os.path.join(tmp, "clone")
            clean_copy(root)
            os.symlink(os.path.abspath(BUILD), os.path.join(root, "build"))
            walk = Walk(self, root, tmp)
            with open(os.path.join(root, "docs/install.md"), encoding="utf-8") as f:
                page = f.read()
            steps = [(start, c) for start, lines in code_blocks(page) for c in commands(lines)
                     if not c.startswith(("#", "|"))]
            shell_steps = [(n, c) for n, c in steps if re.match(r"^([A-Z_]+=|export |for |docker|helm|kubectl|cmake|"
                                                                r"build/|/usr/bin/python3)", c)]
            self.assertGreater(len(shell_steps), 20, "the walk found too few steps in install.md")
            cluster = [c for _, c in shell_steps if "fake_apiserver.py" in c]
            self.assertEqual(len(cluster), 1, "install.md should start the fake API server once")
            walk.start_cluster(cluster[0])
            for n, c in steps:
                try:
                    walk.step(c)
                except AssertionError as e:
                    raise AssertionError("docs/install.md line %d: %s\n%s" % (n, c, e)) from None
            self.assertIn("kubectl apply -f examples/jobs/tiny-cpu.yaml", walk.log)
        finally:
            if walk is not None:
                walk.stop_all()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    args, rest = ap.parse_known_args()
    BUILD = args.build
    unittest.main(argv=[sys.argv[0]] + rest)
