#!/usr/bin/env python3
"""Scale driver of scripts/bench-operator: creates N CiliumNode objects at once
against a real kube-apiserver and measures how long it takes until every one of
them has spec.ipam.podCIDRs (written by whichever operator runs), by watching
them, not polling. It also reads the API server's request counters before and
after, so the writes the operator made per node can be counted, and checks that
no CIDR was given to two nodes.

Prints one JSON object on stdout. Exits non-zero if the nodes were not all
served within the timeout or a CIDR was handed out twice.
"""

import argparse
import http.client
import json
import re
import ssl
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


WRITE_VERBS = ("APPLY", "PATCH", "UPDATE", "POST", "DELETE")
METRIC = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def write_counts(args):
    """apiserver_request_total for ciliumnodes, by verb and subresource."""
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
        if labels.get("resource") != "ciliumnodes" or labels.get("verb") not in WRITE_VERBS:
            continue
        key = f'{labels["verb"]}{"/" + labels["subresource"] if labels.get("subresource") else ""}'
        counts[key] = counts.get(key, 0) + int(float(m.group("value")))
    return counts


class Watcher(threading.Thread):
    """Follows every CiliumNode from a resourceVersion and records when the
    number of named nodes holding podCIDRs reaches the target."""

    def __init__(self, args, rv, names):
        super().__init__(daemon=True)
        self.args, self.rv, self.names = args, rv, names
        self.cidrs = {}
        self.done_at = None
        self.error = None
        self.done = threading.Event()

    def run(self):
        try:
            conn = connection(self.args)
            conn.timeout = None
            conn.request("GET", f"{PATH}?watch=1&resourceVersion={self.rv}",
                         headers={"Accept": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"watch: HTTP {resp.status}")
            for line in resp:
                ev = json.loads(line)
                obj = ev.get("object", {})
                name = obj.get("metadata", {}).get("name")
                if ev.get("type") == "ERROR":
                    raise RuntimeError(f"watch error: {obj}")
                if name not in self.names:
                    continue
                pod_cidrs = obj.get("spec", {}).get("ipam", {}).get("podCIDRs") or []
                if pod_cidrs:
                    self.cidrs[name] = pod_cidrs
                if len(self.cidrs) == len(self.names) and self.done_at is None:
                    self.done_at = time.monotonic()
                    self.done.set()
                    return
        except Exception as e:  # reported by the main thread
            self.error = str(e)
            self.done.set()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--prefix", default="bench-node-")
    args = p.parse_args()

    names = {f"{args.prefix}{i:05d}" for i in range(args.nodes)}
    conn = connection(args)
    status, body = request(conn, "GET", f"{PATH}?limit=1")
    if status != 200:
        raise SystemExit(f"list CiliumNodes: HTTP {status}: {body[:300]!r}")
    rv = json.loads(body)["metadata"]["resourceVersion"]
    before = write_counts(args)
    watcher = Watcher(args, rv, names)
    watcher.start()

    local = threading.local()
    failures = []

    def create(name):
        if not hasattr(local, "conn"):
            local.conn = connection(args)
        obj = {"apiVersion": "cilium.io/v2", "kind": "CiliumNode",
               "metadata": {"name": name}, "spec": {}}
        for attempt in range(5):
            try:
                status, body = request(local.conn, "POST", PATH, obj)
            except (OSError, http.client.HTTPException) as e:
                local.conn = connection(args)
                status, body = 0, str(e).encode()
            if status in (200, 201, 409):
                return
            time.sleep(0.2 * (attempt + 1))
        failures.append(f"{name}: HTTP {status}: {body[:200]!r}")

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        list(pool.map(create, sorted(names)))
    created = time.monotonic()
    if failures:
        raise SystemExit(f"{len(failures)} creates failed, first: {failures[0]}")
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
    }, sys.stdout)
    print()


if __name__ == "__main__":
    main()
