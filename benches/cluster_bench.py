#!/usr/bin/env python3
"""Drivers of scripts/bench-cluster, against a real kube-apiserver (standard
library only; the API helpers are operator_scale.py's).

counts: prints the API server's write requests (any answer code) on CiliumNodes
and Nodes so far, by resource and verb (apiserver_request_total; keys like
"ciliumnodes APPLY/status"), as one JSON object.

pods: creates Pod objects (and their Namespaces) with concurrent clients, spread
over the given node names (spec.nodeName; no kubelet runs them).

cni: runs INSIDE a node's network namespace, next to its `podnet daemon`: the real
plugin exec'd with CNI_* variables for the given sandboxes (network namespaces the
script made), P at a time, ADD then (with --del) DEL, timing every call. It reads
the API server's write counters before the ADDs, after them (plus --settle
seconds) and after the DELs (plus --del-settle). With --create-pods it first creates
the Pod objects the sandboxes stand for (multi-pool selection reads them).

Each prints one JSON object on stdout and exits non-zero on failure.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from operator_scale import RESOURCES, connection, create_all, request, write_counts


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def ms_stats(values):
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(values), 2),
        "p99_ms": round(pct(values, 99), 2),
        "max_ms": round(max(values), 2),
        "mean_ms": round(statistics.mean(values), 2),
    }


def delta(after, before):
    d = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    return {k: v for k, v in d.items() if v}


def pod_objects(names, namespaces, nodes):
    """(path, body) for pod i of `names`: namespace i mod len, node i mod len."""
    out = []
    for i, name in enumerate(names):
        ns = namespaces[i % len(namespaces)]
        out.append((f"/api/v1/namespaces/{ns}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": f"bench-{i % 20}"}},
            "spec": {"nodeName": nodes[i % len(nodes)],
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        }))
    return out


def ensure_namespaces(args, namespaces):
    create_all(args, [("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": ns}})
                      for ns in namespaces], 4)


def counts(args):
    json.dump(write_counts(args, RESOURCES, by_resource=True), sys.stdout)
    print()


def pods(args):
    namespaces = [f"{args.namespace_prefix}{i}" for i in range(args.namespaces)]
    nodes = args.node
    ensure_namespaces(args, namespaces)
    names = [f"{args.name_prefix}{i:05d}" for i in range(args.count)]
    start = time.monotonic()
    create_all(args, pod_objects(names, namespaces, nodes), args.threads)
    json.dump({"pods": args.count, "nodes": len(nodes), "namespaces": len(namespaces),
               "create_s": round(time.monotonic() - start, 2)}, sys.stdout)
    print()


class Plugin:
    def __init__(self, args):
        self.podnet = args.podnet
        self.conf = json.dumps({"cniVersion": "1.1.0", "name": "podnet-bench", "type": "podnet",
                                "socket-path": args.socket}).encode()
        self.namespace = args.pod_namespace

    def run(self, command, sandbox):
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": f"bench-{sandbox}",
            "CNI_NETNS": f"/run/netns/{sandbox}",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": os.path.dirname(self.podnet),
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={self.namespace};K8S_POD_NAME={sandbox}",
        }
        t = time.monotonic()
        p = subprocess.run([self.podnet], input=self.conf, env=env, capture_output=True)
        ms = (time.monotonic() - t) * 1000
        return ms, p.returncode, p.stdout.decode(errors="replace").strip()


def run_calls(plugin, command, sandboxes, parallel):
    """Every sandbox once, `parallel` at a time: (latencies, failures, wall s)."""
    lat, failures = [], []
    lock = threading.Lock()

    def one(sb):
        ms, rc, out = plugin.run(command, sb)
        with lock:
            lat.append(ms)
            if rc != 0:
                failures.append(f"{sb}: {out[:300]}")

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(one, sandboxes))
    return lat, failures, time.monotonic() - start


def cni(args):
    sandboxes = [f"{args.sandbox_prefix}{i}" for i in range(args.count)]
    for sb in sandboxes:
        if not os.path.exists(f"/run/netns/{sb}"):
            raise SystemExit(f"cluster_bench: sandbox /run/netns/{sb} does not exist")
    if args.create_pods:
        ensure_namespaces(args, [args.pod_namespace])
        create_all(args, pod_objects(sandboxes, [args.pod_namespace], [args.node_name]), 8)
        time.sleep(1)  # the daemon's pod reflector sees them
    plugin = Plugin(args)
    result = {"count": args.count, "parallel": args.parallel}
    writes_before = write_counts(args, RESOURCES, by_resource=True)

    def phase(command, settle):
        """Every sandbox once, then `settle` seconds: its figures under `command`."""
        nonlocal writes_before
        lat, failures, wall = run_calls(plugin, command, sandboxes, args.parallel)
        time.sleep(settle)
        writes = write_counts(args, RESOURCES, by_resource=True)
        key = command.lower()
        result.update({key: ms_stats(lat), f"{key}_wall_s": round(wall, 2),
                       f"{key}_failures": len(failures),
                       f"{key}_first_failure": failures[0] if failures else "",
                       f"{key}_writes": delta(writes, writes_before)})
        writes_before = writes

    phase("ADD", args.settle)
    if args.cilium_node:
        status, body = request(connection(args), "GET",
                               f"/apis/cilium.io/v2/ciliumnodes/{args.cilium_node}")
        if status != 200:
            raise SystemExit(f"GET CiliumNode {args.cilium_node}: HTTP {status}")
        pools = json.loads(body).get("spec", {}).get("ipam", {}).get("pools", {})
        result["blocks_after_adds"] = sum(len(a.get("cidrs", [])) for a in pools.get("allocated", []))
    if args.del_after:
        phase("DEL", args.del_settle if args.del_settle is not None else args.settle)
    json.dump(result, sys.stdout)
    print()
    if result["add_failures"] or result.get("del_failures"):
        sys.exit(1 if args.fail_on_error else 0)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="what", required=True)
    for name in ("counts", "pods", "cni"):
        q = sub.add_parser(name)
        q.add_argument("--server", required=True)
        q.add_argument("--ca", required=True)
        q.add_argument("--cert", required=True)
        q.add_argument("--key", required=True)
    q = sub.choices["pods"]
    q.add_argument("--count", type=int, required=True)
    q.add_argument("--node", action="append", required=True, help="a node name (repeat)")
    q.add_argument("--namespaces", type=int, default=50)
    q.add_argument("--namespace-prefix", default="team-")
    q.add_argument("--name-prefix", default="pod-")
    q.add_argument("--threads", type=int, default=16)
    q = sub.choices["cni"]
    q.add_argument("--podnet", required=True)
    q.add_argument("--socket", required=True)
    q.add_argument("--node-name", required=True)
    q.add_argument("--sandbox-prefix", required=True)
    q.add_argument("--count", type=int, required=True)
    q.add_argument("--parallel", type=int, default=1)
    q.add_argument("--pod-namespace", default="bench")
    q.add_argument("--create-pods", action="store_true")
    q.add_argument("--del", dest="del_after", action="store_true")
    q.add_argument("--settle", type=float, default=3.0,
                   help="seconds after the last call before the writes are counted")
    q.add_argument("--del-settle", type=float,
                   help="the same after the DELs (default: --settle); a block given back "
                        "waits for its addresses' release cooldown")
    q.add_argument("--fail-on-error", action="store_true")
    q.add_argument("--cilium-node", default="",
                   help="count this CiliumNode's multi-pool blocks after the ADDs")
    args = p.parse_args()
    {"counts": counts, "pods": pods, "cni": cni}[args.what](args)


if __name__ == "__main__":
    main()
