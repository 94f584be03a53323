#!/usr/bin/env python3
"""Drivers of scripts/bench-operator, against a real kube-apiserver.

scale: creates N CiliumNode objects at once and measures how long it takes until
every one of them has spec.ipam.podCIDRs (written by the operator), by watching
them, not polling. It reads the API server's request counters before and after,
so the writes the operator made per node can be counted, and checks that no CIDR
was given to two nodes.

join: starts one `podnet daemon` per node namespace at once (cluster-pool, the
operator running) and measures, per node, the time from its start until its
/v1/healthz answers 200 (it serves pods), and the API writes per node joining.
It starts the daemons itself and stops them (by PID) before it exits.

Each prints one JSON object on stdout and exits non-zero on failure.
"""

import argparse
import http.client
import json
import os
import re
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

PATH = "/apis/cilium.io/v2/ciliumnodes"


def connection(args):
    ctx = ssl.create_default_context(cafile=args.ca)
    ctx.load_cert_chain(args.cert, args.key)
    url = urlparse(args.server)
    return http.client.HTTPSConnection(url.hostname, url.port, context=ctx, timeout=60)


def request(conn, method, path, body=None):
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body)
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.read()


# apiserver_request_total names an update "PUT" (an apply is "APPLY").
WRITE_VERBS = ("APPLY", "PATCH", "PUT", "POST", "DELETE")
RESOURCES = ("ciliumnodes", "nodes")
METRIC = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def write_counts(args, resources=("ciliumnodes",), by_resource=False):
    """apiserver_request_total for the resources, by verb and subresource (keys
    like "APPLY/status"), and by resource first with by_resource ("ciliumnodes
    APPLY/status")."""
    conn = connection(args)
    status, body = request(conn, "GET", "/metrics")
    if status != 200:
        raise SystemExit(f"GET /metrics: HTTP {status}")
    counts = {}
    for line in body.decode().splitlines():
        m = METRIC.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
        if labels.get("resource") not in resources or labels.get("verb") not in WRITE_VERBS:
            continue
        key = f'{labels["verb"]}{"/" + labels["subresource"] if labels.get("subresource") else ""}'
        if by_resource:
            key = f'{labels["resource"]} {key}'
        counts[key] = counts.get(key, 0) + int(float(m.group("value")))
    return counts


def create_all(args, objects, threads):
    """POSTs the (path, body) pairs with `threads` clients, each retried a few
    times; 409 (it exists) counts as done. Exits on the first lasting failure."""
    local = threading.local()
    failures = []

    def create(item):
        path, body = item
        if not hasattr(local, "conn"):
            local.conn = connection(args)
        status, text = 0, b""
        for attempt in range(5):
            try:
                status, text = request(local.conn, "POST", path, body)
            except (OSError, http.client.HTTPException) as e:
                local.conn = connection(args)
                status, text = 0, str(e).encode()
            if status in (200, 201, 409):
                return
            time.sleep(0.2 * (attempt + 1))
        failures.append(f"{path} {body['metadata']['name']}: HTTP {status}: {text[:200]!r}")

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(create, objects))
    if failures:
        raise SystemExit(f"{len(failures)} creates failed, first: {failures[0]}")


class Watcher(threading.Thread):
    """Follows every CiliumNode from a resourceVersion and records when the
    number of named nodes holding podCIDRs reaches the target."""

    def __init__(self, args, rv, names):
        super().__init__(daemon=True)
        self.args, self.rv, self.names = args, rv, names
        self.cidrs = {}
        self.done_at = None
        self.error = None
        self.restarts = 0
        self.done = threading.Event()

    def note(self, obj):
        """Records a CiliumNode's podCIDRs; True once every named node has them."""
        name = obj.get("metadata", {}).get("name")
        if name in self.names:
            pod_cidrs = obj.get("spec", {}).get("ipam", {}).get("podCIDRs") or []
            if pod_cidrs:
                self.cidrs[name] = pod_cidrs
        if len(self.cidrs) == len(self.names) and self.done_at is None:
            self.done_at = time.monotonic()
            self.done.set()
        return self.done_at is not None

    def relist(self):
        """Reads every CiliumNode (after a watch expired); the list's resourceVersion."""
        status, body = request(connection(self.args), "GET", PATH)
        if status != 200:
            raise RuntimeError(f"list CiliumNodes: HTTP {status}")
        listed = json.loads(body)
        for obj in listed.get("items", []):
            self.note(obj)
        return listed["metadata"]["resourceVersion"]

    def run(self):
        # The API server may end a watch (a slow reader on a loaded machine): it
        # is resumed from the last resourceVersion seen, or after a list when that
        # one is gone (410). Restarts are counted in the report.
        rv = self.rv
        try:
            while True:
                conn = connection(self.args)
                conn.timeout = None
                conn.request("GET", f"{PATH}?watch=1&allowWatchBookmarks=true&resourceVersion={rv}",
                             headers={"Accept": "application/json"})
                resp = conn.getresponse()
                if resp.status != 200:
                    raise RuntimeError(f"watch: HTTP {resp.status}")
                for line in resp:
                    ev = json.loads(line)
                    obj = ev.get("object", {})
                    if ev.get("type") == "ERROR":
                        if obj.get("code") == 410:
                            rv = self.relist()
                            break
                        raise RuntimeError(f"watch error: {obj}")
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if ev.get("type") != "BOOKMARK" and self.note(obj):
                        return
                if self.done_at is not None:
                    return
                self.restarts += 1
                conn.close()
        except Exception as e:  # reported by the main thread
            self.error = str(e)
            self.done.set()


def scale(args):
    names = {f"{args.prefix}{i:05d}" for i in range(args.nodes)}
    conn = connection(args)
    status, body = request(conn, "GET", f"{PATH}?limit=1")
    if status != 200:
        raise SystemExit(f"list CiliumNodes: HTTP {status}: {body[:300]!r}")
    rv = json.loads(body)["metadata"]["resourceVersion"]
    before = write_counts(args)
    watcher = Watcher(args, rv, names)
    watcher.start()

    objects = [(PATH, {"apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                       "metadata": {"name": name}, "spec": {}}) for name in sorted(names)]
    start = time.monotonic()
    create_all(args, objects, args.threads)
    created = time.monotonic()
    if not watcher.done.wait(args.timeout - (created - start)):
        served = len(watcher.cidrs)
        raise SystemExit(f"timed out: {served} of {args.nodes} nodes had podCIDRs")
    if watcher.error:
        raise SystemExit(watcher.error)
    # Let trailing writes (status updates) land before counting.
    time.sleep(2)
    after = write_counts(args)

    seen = {}
    for name, cidrs in watcher.cidrs.items():
        for c in cidrs:
            if c in seen:
                raise SystemExit(f"CIDR {c} given to both {seen[c]} and {name}")
            seen[c] = name
    writes = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    writes = {k: v for k, v in writes.items() if v}
    creates = writes.get("POST", 0)
    operator_writes = sum(v for k, v in writes.items() if k != "POST")
    json.dump({
        "nodes": args.nodes,
        "create_s": round(created - start, 2),
        "all_served_s": round(watcher.done_at - start, 2),
        "served_after_create_s": round(max(watcher.done_at - created, 0), 2),
        "creates": creates,
        "operator_writes": operator_writes,
        "writes_per_node": round(operator_writes / args.nodes, 3),
        "writes_by_verb": writes,
        "distinct_cidrs": len(seen),
        "watch_restarts": watcher.restarts,
    }, sys.stdout)
    print()


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=2)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(2)
        self.sock.connect(self.path)


def serving(sock_path):
    if not os.path.exists(sock_path):
        return False
    try:
        conn = UnixHTTPConnection(sock_path)
        conn.request("GET", "/v1/healthz")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def join(args):
    """args.node: NAMESPACE:NODE_NAME:DIR, one per node."""
    nodes = [n.split(":", 2) for n in args.node]
    before = write_counts(args, RESOURCES)
    procs = {}
    ready = {}
    try:
        start = time.monotonic()
        for ns, name, d in nodes:
            os.makedirs(d, exist_ok=True)
            log = open(os.path.join(d, "daemon.log"), "w")
            procs[name] = subprocess.Popen(
                ["ip", "netns", "exec", ns, args.podnet, "daemon",
                 "--socket", os.path.join(d, "podnet.sock"),
                 "--state-dir", os.path.join(d, "state"),
                 "--k8s-kubeconfig-path", args.node_kubeconfig,
                 "--k8s-node-name", name, "--ipam", "cluster-pool"] + args.daemon_arg,
                stdout=log, stderr=subprocess.STDOUT)
        deadline = start + args.timeout
        while len(ready) < len(nodes) and time.monotonic() < deadline:
            for ns, name, d in nodes:
                if name in ready:
                    continue
                if procs[name].poll() is not None:
                    raise SystemExit(f"{name}: the daemon exited ({procs[name].returncode}); "
                                     f"see {d}/daemon.log")
                if serving(os.path.join(d, "podnet.sock")):
                    ready[name] = time.monotonic() - start
            time.sleep(0.02)
        if len(ready) < len(nodes):
            raise SystemExit(f"timed out: {len(ready)} of {len(nodes)} daemons serving")
        time.sleep(3)
        after = write_counts(args, RESOURCES)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    writes = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    writes = {k: v for k, v in writes.items() if v}
    times = sorted(ready.values())
    json.dump({
        "nodes": len(nodes),
        "ready_p50_s": round(statistics.median(times), 3),
        "ready_max_s": round(times[-1], 3),
        "ready_min_s": round(times[0], 3),
        "writes_per_join": round(sum(writes.values()) / len(nodes), 2),
        "writes_by_verb": writes,
    }, sys.stdout)
    print()


def add_api_args(q):
    """The API server's address and the admin client's credentials (connection())."""
    q.add_argument("--server", required=True)
    q.add_argument("--ca", required=True)
    q.add_argument("--cert", required=True)
    q.add_argument("--key", required=True)


def api_subcommands(names):
    """A parser with a subcommand per name, each taking add_api_args's arguments."""
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="what", required=True)
    for name in names:
        add_api_args(sub.add_parser(name))
    return p, sub


def main():
    p, sub = api_subcommands(("scale", "join"))
    for name in ("scale", "join"):
        sub.choices[name].add_argument("--timeout", type=float, default=900)
    q = sub.choices["scale"]
    q.add_argument("--nodes", type=int, required=True)
    q.add_argument("--threads", type=int, default=16)
    q.add_argument("--prefix", default="bench-node-")
    q = sub.choices["join"]
    q.add_argument("--podnet", required=True)
    q.add_argument("--node-kubeconfig", required=True)
    q.add_argument("--node", action="append", required=True,
                   help="NAMESPACE:NODE_NAME:DIR")
    q.add_argument("--daemon-arg", action="append", default=[])
    args = p.parse_args()
    {"scale": scale, "join": join}[args.what](args)


if __name__ == "__main__":
    main()
