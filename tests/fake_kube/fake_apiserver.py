#!/usr/bin/python3
"""A loopback fake Kubernetes API server for tests (see README.md).

Usage: fake_apiserver.py [--port N] [--port-file F] [--tls-dir D] [--token T]
                         [--kubeconfig-out K] [--kubelet --bin-dir B --work-dir W --node NAME:MEM:CPU[:GPU]]
                         [--gang-scheduler volcano|scheduler-plugins|kueue ...]"""

import argparse
import base64
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gang  # noqa: E402
import http_api  # noqa: E402
from kubelet import Kubelet, make_node  # noqa: E402
from registry import Registry  # noqa: E402
from store import Store  # noqa: E402

INITIAL_NAMESPACES = ("default", "kube-system", "pstar")


def write_atomic(path, text):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def ensure_certs(tls_dir):
    """A CA and a server certificate for 127.0.0.1/localhost, made once."""
    os.makedirs(tls_dir, exist_ok=True)
    ca_crt, ca_key = os.path.join(tls_dir, "ca.crt"), os.path.join(tls_dir, "ca.key")
    crt, key = os.path.join(tls_dir, "server.crt"), os.path.join(tls_dir, "server.key")
    if all(os.path.exists(p) for p in (ca_crt, crt, key)):
        return ca_crt, crt, key

    def run(*args):
        subprocess.run(["openssl"] + list(args), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", ca_key, "-out", ca_crt, "-days", "3650", "-subj", "/CN=fake-kube-ca",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    csr = os.path.join(tls_dir, "server.csr")
    run("req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=localhost")
    ext = os.path.join(tls_dir, "server.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial", "-out", crt + ".tmp",
        "-days", "3650", "-extfile", ext)
    os.replace(crt + ".tmp", crt)
    return ca_crt, crt, key


def kubeconfig(server_url, ca_file, token):
    cluster = {"server": server_url}
    if ca_file:
        with open(ca_file, "rb") as f:
            cluster["certificate-authority-data"] = base64.b64encode(f.read()).decode()
    user = {"token": token} if token else {}
    lines = ["apiVersion: v1", "kind: Config", "clusters:", "- name: fake", "  cluster:"]
    lines += ["    %s: %s" % (k, v) for k, v in cluster.items()]
    lines += ["users:", "- name: fake", "  user:" + ("" if user else " {}")]
    lines += ["    %s: %s" % (k, v) for k, v in user.items()]
    lines += ["contexts:", "- name: fake", "  context:", "    cluster: fake", "    user: fake",
              "    namespace: default", "current-context: fake", ""]
    return "\n".join(lines)


def parse_node(text):
    parts = text.split(":")
    if len(parts) < 3:
        raise argparse.ArgumentTypeError("--node NAME:MEM:CPU[:GPU]")
    return parts[0], parts[1], parts[2], (parts[3] if len(parts) > 3 else None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument("--tls-dir")
    ap.add_argument("--token")
    ap.add_argument("--kubeconfig-out")
    ap.add_argument("--kubelet", action="store_true")
    ap.add_argument("--bin-dir")
    ap.add_argument("--work-dir")
    ap.add_argument("--container-runtime", choices=["docker"],
                    help="run pods as containers from their images (tests/fake_kube/containers.py)")
    ap.add_argument("--container-mount", action="append", default=[], metavar="HOST:PATH[:ro]",
                    help="a node folder mounted into every container (as a GPU node mounts its driver's libraries)")
    ap.add_argument("--node", action="append", type=parse_node, default=[])
    ap.add_argument("--bookmark-interval", type=float, default=1.0)
    ap.add_argument("--event-history", type=int, default=10000)
    ap.add_argument("--gang-scheduler", action="append", default=[],
                    help="serve this gang scheduler's API and play its part: volcano, scheduler-plugins, kueue")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)

    registry = Registry()
    gang.register(registry, args.gang_scheduler)
    store = Store(registry, args.event_history)
    ns_type = registry.lookup("", "v1", "namespaces")
    for ns in INITIAL_NAMESPACES:
        store.create(ns_type, None, {"metadata": {"name": ns}})

    kubelet = None
    if args.kubelet:
        work_dir = args.work_dir or tempfile.mkdtemp(prefix="fake-kubelet-")
        if args.container_runtime:
            import containers
            try:
                containers.docker("info", timeout=30)
            except Exception as e:  # noqa: BLE001 - any failure: no daemon
                print("fake_apiserver: --container-runtime docker: no Docker daemon answers: %s" % e,
                      file=sys.stderr)
                sys.exit(2)
        node_mounts = []
        for m in args.container_mount:
            parts = m.split(":")
            if len(parts) not in (2, 3) or not parts[0] or not parts[1] or (len(parts) == 3 and parts[2] != "ro"):
                print("fake_apiserver: --container-mount %r: expected HOST:PATH or HOST:PATH:ro" % m, file=sys.stderr)
                sys.exit(2)
            node_mounts.append((parts[0], parts[1], len(parts) == 3))
        kubelet = Kubelet(store, args.bin_dir, work_dir, args.gang_scheduler, args.container_runtime, node_mounts)
        node_type = registry.lookup("", "v1", "nodes")
        for name, mem, cpu, gpu in args.node or [("node-1", "64Gi", "16", None)]:
            store.create(node_type, None, make_node(name, mem, cpu, gpu))

    app = http_api.App(store, registry, args.token, args.bookmark_interval, kubelet, args.verbose)
    ctx = None
    ca_file = None
    if args.tls_dir:
        ca_file, crt, key = ensure_certs(args.tls_dir)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key)
        ctx.set_alpn_protocols(["http/1.1"])
    server = http_api.Server((args.address, args.port), app, ctx)
    port = server.server_address[1]
    host = args.address if ":" not in args.address else "[%s]" % args.address
    app.address = "%s:%d" % (host, port)
    url = "%s://%s:%d" % ("https" if ctx else "http", host, port)

    if kubelet:
        kubelet.start()
    if args.kubeconfig_out:
        write_atomic(args.kubeconfig_out, kubeconfig(url, ca_file, args.token))
    if args.port_file:
        write_atomic(args.port_file, "%d\n" % port)
    print("fake apiserver listening on %s" % url, flush=True)

    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    while not stop.wait(0.5):
        pass
    store.shutdown()
    if kubelet:
        kubelet.stop()
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
