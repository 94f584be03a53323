#!/usr/bin/env python3
"""Driver of scripts/bench-agent-scale: one node agent against a real
kube-apiserver that holds N simulated nodes, measured from /proc, the kernel
and the API server's own metrics.

populate: makes the API server hold exactly the base set of simulated nodes
(nodes 1..N): for each, a Node (spec.podCIDR and the flannel.alpha.coreos.com/*
annotations flanneld's kube-subnet-mgr reads) and a CiliumNode (spec.ipam.podCIDRs,
spec.addresses: what podnet's agent reads), created with concurrent clients;
objects of the churn's nodes left from an earlier run are deleted and deleted
ones created again. Prints one JSON object.

run: starts the agent (its command line after --), waits until the kernel of the
node namespace holds every remote node's route (and, for a tunnel, its FDB and
neighbour entry), lets it rest, then applies a churn (joins and deletions
arriving at once) and waits until the kernel follows. Stops the agent (by PID)
before it exits. Prints one JSON object.

Figures: times by the monotonic clock; CPU (utime + stime, with the children it
reaped: nft, iptables) and RSS (VmRSS, VmHWM) from /proc/<pid>; API requests and
watch events from the API server's /metrics (apiserver_request_total; apiserver_watch_events_total, by
resource, to every watcher); the bytes the agent received (TLS, on the wire) from
`ss -ti` in the node namespace, whose only TCP connections are the agent's; the
agent's send syscalls (its netlink requests, and its few API writes) during the
churn by `perf stat -e syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg`.
"""

import argparse
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from operator_scale import api_subcommands, connection, create_all, request

CNODES = "/apis/cilium.io/v2/ciliumnodes"
NODES = "/api/v1/nodes"
FLANNEL = "flannel.alpha.coreos.com/"
# Simulated node i (1-based): pod CIDR 10.<1 + i / 256>.<i % 256>.0/24 inside the
# cluster's 10.0.0.0/8 (the real node has 10.0.0.0/24), InternalIP 172.16.0.10 + i
# inside the real node's 172.16.0.0/12 (so native routes' gateways are on-link).
FIRST_IP = int(ipaddress.IPv4Address("172.16.0.10"))
POLL = 0.2


def pod_cidr(i):
    return f"10.{1 + i // 256}.{i % 256}.0/24"


def internal_ip(i):
    return str(ipaddress.IPv4Address(FIRST_IP + i))


def vtep_mac(ip):
    return "02:fa:" + ":".join(f"{b:02x}" for b in ipaddress.IPv4Address(ip).packed)


def name(i):
    return f"sim-{i:05d}"


def node_objects(i):
    """The (path, body) pairs of simulated node i: its Node and its CiliumNode."""
    ip, cidr = internal_ip(i), pod_cidr(i)
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name(i), "labels": {
                "kubernetes.io/hostname": name(i), "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64"},
                "annotations": {
                    FLANNEL + "backend-type": "vxlan",
                    FLANNEL + "backend-data": json.dumps({"VNI": 1, "VtepMAC": vtep_mac(ip)}),
                    FLANNEL + "public-ip": ip,
                    FLANNEL + "kube-subnet-manager": "true"}},
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}}
    router = str(ipaddress.ip_network(cidr)[1])
    cnode = {"apiVersion": "cilium.io/v2", "kind": "CiliumNode",
             "metadata": {"name": name(i)},
             "spec": {"addresses": [{"type": "InternalIP", "ip": ip},
                                    {"type": "CiliumInternalIP", "ip": router}],
                      "ipam": {"podCIDRs": [cidr]}}}
    return [(NODES, node), (CNODES, cnode)]


def names_of(args, path):
    for _ in range(30):
        status, body = request(connection(args), "GET", path)
        if status != 429:  # a new CRD's storage still initializing
            break
        time.sleep(1)
    if status != 200:
        raise SystemExit(f"list {path}: HTTP {status}: {body[:200]!r}")
    return {o["metadata"]["name"] for o in json.loads(body)["items"]}


def delete_all(args, names, threads):
    objects = [(f"{path}/{n}", None) for n in names for path in (NODES, CNODES)]
    run_all(args, "DELETE", objects, threads)


def run_all(args, method, objects, threads):
    """DELETEs (404 is done) with `threads` clients; POSTs go through create_all."""
    if method == "POST":
        create_all(args, objects, threads)
        return
    local = threading.local()

    def delete(item):
        if not hasattr(local, "conn"):
            local.conn = connection(args)
        for _ in range(5):
            try:
                status, _ = request(local.conn, "DELETE", item[0])
            except OSError:
                local.conn = connection(args)
                continue
            if status in (200, 202, 404):
                return
        raise SystemExit(f"DELETE {item[0]} failed")

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(delete, objects))


def populate(args):
    want = {name(i) for i in range(1, args.nodes + 1)}
    t0 = time.monotonic()
    for path in (NODES, CNODES):
        have = names_of(args, path) & {name(i) for i in range(1, args.nodes + args.churn + 1)}
        extra = sorted(have - want)
        if extra:
            run_all(args, "DELETE", [(f"{path}/{n}", None) for n in extra], args.threads)
        missing = [i for i in range(1, args.nodes + 1) if name(i) not in have]
        objs = [o for i in missing for o in node_objects(i) if o[0] == path]
        create_all(args, objs, args.threads)
    json.dump({"nodes": args.nodes, "populate_s": round(time.monotonic() - t0, 1)}, sys.stdout)
    print()


# --- the kernel ------------------------------------------------------------------

def ip_lines(netns, *argv):
    out = subprocess.run(["ip", "-n", netns, *argv], capture_output=True, text=True)
    return out.stdout.splitlines() if out.returncode == 0 else []


def kernel_view(args):
    """The remote routes' destinations, the FDB entries' destinations and the
    neighbour entries of the agent's device, in the node namespace."""
    if args.route_proto:
        routes = ip_lines(args.netns, "-4", "route", "show", "proto", args.route_proto)
    else:
        routes = ip_lines(args.netns, "-4", "route", "show", "dev", args.device)
    dsts = {l.split()[0] for l in routes if l and "/" in l.split()[0]}
    if not args.device:
        return dsts, set(), 0
    fdb = subprocess.run(["bridge", "-n", args.netns, "fdb", "show", "dev", args.device],
                         capture_output=True, text=True).stdout.splitlines()
    dst = {m.group(1) for l in fdb if (m := re.search(r" dst (\S+)", l))}
    neigh = ip_lines(args.netns, "-4", "neigh", "show", "dev", args.device)
    return dsts, dst, len(neigh)


def converged(args, members):
    routes, fdb, neigh = kernel_view(args)
    want_routes = {pod_cidr(i) for i in members}
    if routes != want_routes:
        return False
    if not args.device:
        return True
    return fdb >= {internal_ip(i) for i in members} and len(fdb) == len(members) \
        and neigh == len(members)


def wait_converged(args, members, proc, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the agent exited ({proc.returncode}); see its log")
        if converged(args, members):
            return time.monotonic()
        time.sleep(POLL)
    routes, fdb, neigh = kernel_view(args)
    raise SystemExit(f"timed out after {timeout} s: {len(routes)} routes, {len(fdb)} FDB, "
                     f"{neigh} neighbours of {len(members)} nodes")


# --- /proc and /metrics ------------------------------------------------------------

def cpu_s(pid):
    """utime + stime of the agent and of its children it reaped (nft, iptables)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def received_bytes(netns):
    """What each of the agent's TCP connections (the node namespace holds no
    others) has received, by its (local, peer) addresses: TLS bytes on the wire,
    from `ss -ti` (bytes_received)."""
    out = subprocess.run(["ip", "netns", "exec", netns, "ss", "-tinH", "state", "established"],
                         capture_output=True, text=True).stdout
    counts, conn = {}, None
    for line in out.splitlines():
        if not line[:1].isspace():
            fields = line.split()
            conn = tuple(fields[2:4]) if len(fields) >= 4 else None
        m = re.search(r"bytes_received:(\d+)", line)
        if m and conn is not None:
            counts[conn] = int(m.group(1))
    return counts


def received_between(before, after):
    """Bytes received from `before` to `after` (received_bytes): a connection
    opened in between counts from zero; one closed in between counts nothing (its
    last bytes are not seen), so a re-established watch never makes the sum negative."""
    return sum(n - before.get(conn, 0) for conn, n in after.items())


SAMPLE = re.compile(r'^(?P<name>\w+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def api_metrics(args):
    """Resource requests by "VERB resource" (leases, the API server's own, left out)
    and watch events sent, by resource (to every watcher: the API server's own
    informers among them)."""
    status, body = request(connection(args), "GET", "/metrics")
    if status != 200:
        raise SystemExit(f"GET /metrics: HTTP {status}")
    m = {"requests": {}, "watch_events": {}}
    for line in body.decode().splitlines():
        s = SAMPLE.match(line)
        if not s:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', s.group("labels")))
        value = float(s.group("value"))
        if s.group("name") == "apiserver_request_total":
            res = labels.get("resource", "")
            if res and res != "leases":
                key = f'{labels.get("verb")} {res}'
                m["requests"][key] = m["requests"].get(key, 0) + int(value)
        elif s.group("name") == "apiserver_watch_events_total":
            res = labels.get("resource", labels.get("kind", ""))
            m["watch_events"][res] = m["watch_events"].get(res, 0) + int(value)
    return m


def api_delta(a, b):
    def diff(key):
        d = {k: b[key].get(k, 0) - a[key].get(k, 0) for k in set(a[key]) | set(b[key])}
        return {k: v for k, v in sorted(d.items()) if v}
    return {"requests": diff("requests"), "watch_events": diff("watch_events")}


def perf_start(pid, path):
    return subprocess.Popen(["perf", "stat", "-x", " ", "-o", path, "-e",
                             "syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg",
                             "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def perf_stop(proc, path):
    """The send syscalls perf counted, or None when perf could not count."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None
    total, seen = 0, False
    with open(path) as f:
        for line in f:
            parts = line.split()
            event = next((p for p in parts if p.startswith("syscalls:sys_enter_send")), None)
            if event and parts[0].isdigit():
                total += int(parts[0])
                seen = True
    return total if seen else None


# --- one agent's run -----------------------------------------------------------------

def churn(args):
    """100 (args.churn) joins and as many deletions, at once."""
    joins = range(args.nodes + 1, args.nodes + args.churn + 1)
    gone = range(1, args.churn + 1)
    creates = [o for i in joins for o in node_objects(i)]
    deletes = [(f"{p}/{name(i)}", None) for i in gone for p in (NODES, CNODES)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        a = pool.submit(create_all, args, creates, args.threads // 2)
        b = pool.submit(run_all, args, "DELETE", deletes, args.threads // 2)
        a.result()
        b.result()
    return set(range(args.churn + 1, args.nodes + args.churn + 1))


def run(args):
    base = set(range(1, args.nodes + 1))
    log = open(args.log, "w")
    start = time.monotonic()
    proc = subprocess.Popen(args.agent, stdout=log, stderr=subprocess.STDOUT)
    pid = proc.pid
    out = {"agent": args.name, "nodes": args.nodes}
    try:
        done = wait_converged(args, base, proc, args.timeout)
        out["converge_s"] = round(done - start, 2)
        out["converge_cpu_s"] = round(cpu_s(pid), 2)
        out["converge_rss_mib"] = rss_mib(pid, "VmRSS")
        time.sleep(args.settle)
        out.update(rest(args, pid))
        out.update(churn_figures(args, proc))
        out["peak_rss_mib"] = rss_mib(pid, "VmHWM")
        out["final_rss_mib"] = rss_mib(pid, "VmRSS")
        out["total_cpu_s"] = round(cpu_s(pid), 2)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    json.dump(out, sys.stdout)
    print()


def rest(args, pid):
    """The agent at rest for args.rest seconds."""
    m1, b1, cpu1, t1 = api_metrics(args), received_bytes(args.netns), cpu_s(pid), time.monotonic()
    time.sleep(args.rest)
    m2, b2 = api_metrics(args), received_bytes(args.netns)
    secs = time.monotonic() - t1
    d = api_delta(m1, m2)
    return {"rest_s": round(secs, 1), "rest_cpu_s": round(cpu_s(pid) - cpu1, 2),
            "rest_requests_per_min": round(sum(d["requests"].values()) * 60 / secs, 1),
            "rest_requests": d["requests"], "rest_received_bytes": received_between(b1, b2),
            "rest_watch_events": d["watch_events"], "settled_rss_mib": rss_mib(pid, "VmRSS")}


def churn_figures(args, proc):
    """The churn, from the first request to the kernel holding the new set."""
    pid = proc.pid
    perf_out = args.log + ".perf"
    perf = perf_start(pid, perf_out)
    profile = None
    if args.profile:
        profile = subprocess.Popen(["perf", "record", "-F", "499", "-g", "-o", args.log + ".perf.data",
                                    "-p", str(pid)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    m1, b1, cpu1, t1 = api_metrics(args), received_bytes(args.netns), cpu_s(pid), time.monotonic()
    members = churn(args)
    sent = time.monotonic()
    done = wait_converged(args, members, proc, args.timeout)
    cpu2 = cpu_s(pid)
    time.sleep(1)
    m2, b2 = api_metrics(args), received_bytes(args.netns)
    d = api_delta(m1, m2)
    if profile:
        profile.send_signal(signal.SIGINT)
        profile.wait()
        with open(args.log + ".profile.txt", "w") as f:
            subprocess.run(["perf", "report", "--stdio", "--no-children", "--sort", "symbol",
                            "-g", "none", "-i", args.log + ".perf.data"], stdout=f,
                           stderr=subprocess.DEVNULL)
    return {"churn_nodes": args.churn, "churn_api_s": round(sent - t1, 2),
            "churn_s": round(done - t1, 2), "churn_cpu_s": round(cpu2 - cpu1, 2),
            "churn_received_bytes": received_between(b1, b2), "churn_watch_events": d["watch_events"],
            "churn_send_syscalls": perf_stop(perf, perf_out)}


def report(args):
    rows = [json.loads(line) for line in open(args.results)]
    json.dump({"rev": args.rev, "machine": args.machine, "runs": rows},
              open(args.out + ".json", "w"), indent=1)
    names = {"podnet-tunnel": f"podnet {args.rev} tunnel", "podnet-native": f"podnet {args.rev} native",
             "podnet-base-tunnel": "podnet base (PODNET_BASE_BIN) tunnel",
             "podnet-base-native": "podnet base (PODNET_BASE_BIN) native",
             "flannel": "flanneld v0.28.10 vxlan"}
    loads = [r["load_start"] for r in rows] + [r["load_end"] for r in rows]
    lines = [f"Agent scale, podnet {args.rev}, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; "
             f"{args.machine}; 1-minute load {min(loads)}-{max(loads)} during the run",
             "",
             "| agent | nodes | converge (s) | CPU to converge (s) | peak RSS (MiB) | settled RSS (MiB) "
             "| CPU at rest (s/min) | API requests/min at rest | bytes received at rest | churn (s) "
             "| churn CPU (s) | churn KiB received | send syscalls per 100 node changes | load (start, end) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        sends = r.get("churn_send_syscalls")
        per100 = "n/a" if sends is None else round(sends * 100 / (2 * r["churn_nodes"]), 1)
        lines.append(
            f"| {names.get(r['agent'], r['agent'])} | {r['nodes']} | {r['converge_s']} | "
            f"{r['converge_cpu_s']} | {r['peak_rss_mib']} | {r['settled_rss_mib']} | "
            f"{round(r['rest_cpu_s'] * 60 / r['rest_s'], 2)} | {r['rest_requests_per_min']} | "
            f"{r['rest_received_bytes']} | {r['churn_s']} | {r['churn_cpu_s']} | "
            f"{round(r['churn_received_bytes'] / 1024, 1)} | {per100} | {r['load_start']}, {r['load_end']} |")

    def ratio(a, b):
        return f"{a / b:.2f}" if b else "n/a"
    pairs = [(p, f) for p in rows if p["agent"].startswith("podnet")
             for f in rows if f["agent"] == "flannel" and f["nodes"] == p["nodes"]]
    if pairs:
        lines += ["", "podnet / flanneld, same run (targets: converge <= 1 at 5,000 nodes, "
                  "settled RSS <= 0.5, churn CPU <= 1):", "",
                  "| podnet | nodes | converge time | CPU to converge | peak RSS | settled RSS "
                  "| churn time | churn CPU | churn bytes received |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for p, f in pairs:
            lines.append(
                f"| {p['agent']} | {p['nodes']} | {ratio(p['converge_s'], f['converge_s'])} | "
                f"{ratio(p['converge_cpu_s'], f['converge_cpu_s'])} | "
                f"{ratio(p['peak_rss_mib'], f['peak_rss_mib'])} | "
                f"{ratio(p['settled_rss_mib'], f['settled_rss_mib'])} | "
                f"{ratio(p['churn_s'], f['churn_s'])} | {ratio(p['churn_cpu_s'], f['churn_cpu_s'])} | "
                f"{ratio(p['churn_received_bytes'], f['churn_received_bytes'])} |")
    counts = sorted({r["nodes"] for r in rows})
    if len(counts) > 1:
        lo, hi = counts[0], counts[-1]
        lines += ["", f"Growth from {lo} to {hi} nodes ({hi / lo:g}x the nodes; at most linear: "
                  f"a ratio <= {hi / lo:g}):", "",
                  "| agent | converge time | CPU to converge | settled RSS | churn time | churn CPU |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for agent in dict.fromkeys(r["agent"] for r in rows):
            a = next((r for r in rows if r["agent"] == agent and r["nodes"] == lo), None)
            b = next((r for r in rows if r["agent"] == agent and r["nodes"] == hi), None)
            if a and b:
                lines.append(f"| {names.get(agent, agent)} | " + " | ".join(
                    ratio(b[k], a[k]) for k in ("converge_s", "converge_cpu_s", "settled_rss_mib",
                                                "churn_s", "churn_cpu_s")) + " |")
    open(args.out + ".md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    p, sub = api_subcommands(("populate", "run"))
    for what in ("populate", "run"):
        q = sub.choices[what]
        q.add_argument("--nodes", type=int, required=True)
        q.add_argument("--churn", type=int, default=100)
        q.add_argument("--threads", type=int, default=16)
    q = sub.choices["run"]
    q.add_argument("--name", required=True, help="the agent's name in the results")
    q.add_argument("--netns", required=True, help="the real node's network namespace")
    q.add_argument("--device", default="", help="the tunnel device (none in native mode)")
    q.add_argument("--route-proto", default="", help="count routes of this protocol, not the device's")
    q.add_argument("--log", required=True)
    q.add_argument("--rest", type=float, default=60)
    q.add_argument("--settle", type=float, default=5)
    q.add_argument("--timeout", type=float, default=900)
    q.add_argument("--profile", action="store_true",
                   help="perf record the agent during the churn: <log>.profile.txt")
    q.add_argument("agent", nargs=argparse.REMAINDER, help="-- the agent's command line")
    q = sub.add_parser("report")
    q.add_argument("--results", required=True, help="the runs' JSON lines")
    q.add_argument("--out", required=True, help="path prefix of the .json and .md written")
    q.add_argument("--rev", required=True)
    q.add_argument("--machine", required=True)
    args = p.parse_args()
    if args.what == "run":
        args.agent = args.agent[1:] if args.agent[:1] == ["--"] else args.agent
        if not args.agent:
            p.error("run: give the agent's command line after --")
    {"populate": populate, "run": run, "report": report}[args.what](args)


if __name__ == "__main__":
    main()
