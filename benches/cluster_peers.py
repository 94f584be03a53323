#!/usr/bin/env python3
"""Pod start-up, release, control-plane load and the pod network's throughput and
latency on the running cluster of scripts/cluster, for one network (podnet or
flannel); scripts/bench-peers runs it once per network on a fresh cluster and
puts the results side by side.

  cluster_peers.py NETWORK PODS REST_SECONDS PODNET_BIN [PARTS]  -> one JSON line on stdout

PARTS: "startup net" (default), "startup" (rest, startup, release) or "net".
Measured, in this order:
  rest       the API server's requests (apiserver_request_total, every verb and
             resource) over REST_SECONDS with no workload: per node per minute;
             each node's network agent's RSS (podnet's daemon, or flanneld)
  startup    a Deployment of PODS busybox pods spread evenly over the nodes:
             apply to all Ready (wall), and each pod's first sight in a watch to
             its Ready (p50, p99, max), taken from the watch's arrival times; the
             API requests during it per node per minute; the agents' RSS after
  release    the Deployment deleted: until the API has no pod of it, and until
             no node holds an address for one (podnet: no allocation owned by a
             pod of `default`, asked over each agent's socket; flannel: the address
             files in host-local's store /var/lib/cni/networks/cbr0 back to their
             number before the start-up)
  net        benches/cluster_net.py: pod to pod, host to host (hostNetwork pods)
             and pod to Service across two nodes, TCP throughput (1 and 8
             streams) and request/response latency; BENCH_NET_ROUNDS (5),
             BENCH_NET_SECONDS (8, per stream test), BENCH_NET_RR (20000 round
             trips per latency test)
"""

import json
import os
import re
import subprocess
import sys
import threading
import time

import cluster_net

CLUSTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "cluster")


def kubectl(*args, stdin=None):
    out = subprocess.run(["bash", CLUSTER, "kubectl", *args], input=stdin,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def cluster_dir():
    with open("/run/podnet-cluster.dir", encoding="utf-8") as f:
        return f.read().strip()


def nodes():
    return sorted(n["metadata"]["name"] for n in json.loads(kubectl("get", "nodes", "-o", "json"))["items"])


def api_requests():
    """The API server's apiserver_request_total, summed over every label set."""
    total = 0.0
    for line in kubectl("get", "--raw", "/metrics").splitlines():
        if line.startswith("apiserver_request_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def agent_pids(network, node):
    """The PIDs of the node's network agent: podnet's daemon (a container in the
    node's cgroup tree), or flanneld (a node component, by its PID file)."""
    d = cluster_dir()
    if network == "flannel":
        try:
            with open(f"{d}/pids/{node}/flanneld", encoding="utf-8") as f:
                return [int(f.read().strip())]
        except (OSError, ValueError):
            return []
    pids = []
    root = f"/sys/fs/cgroup/pids/podnet-cluster/{node}"
    for dirpath, _, files in os.walk(root):
        if "cgroup.procs" not in files:
            continue
        with open(os.path.join(dirpath, "cgroup.procs"), encoding="utf-8") as f:
            for pid in f.read().split():
                argv = cmdline(pid)
                if len(argv) > 1 and argv[0].endswith(b"/podnet") and argv[1] == b"daemon":
                    pids.append(int(pid))
    return pids


def agents_rss_mib(network):
    per_node = {}
    for node in nodes():
        kib = [rss_kib(p) for p in agent_pids(network, node)]
        kib = [k for k in kib if k is not None]
        per_node[node] = round(sum(kib) / 1024, 1) if kib else None
    return per_node


def held_addresses(network, podnet_bin):
    """Addresses held for pods of `default`, summed over the nodes."""
    d = cluster_dir()
    held = 0
    for node in nodes():
        if network == "flannel":
            store = f"{d}/nodes/{node}/fs/var/lib/cni/networks/cbr0"
            try:
                held += sum(1 for f in os.listdir(store) if re.fullmatch(r"[0-9.]+", f))
            except FileNotFoundError:
                pass
            continue
        sock = f"{d}/nodes/{node}/fs/run/podnet/podnet.sock"
        out = subprocess.run([podnet_bin, "status", "--socket", sock, "-o", "json"],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"podnet status on {node}: {out.stderr.strip()}")
        allocations = json.loads(out.stdout)["status"]["ipam"].get("allocations", {})
        held += sum(1 for owner in allocations.values() if owner.startswith("default/"))
    return held


def deployment(pods):
    return json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "startup", "namespace": "default"},
        "spec": {"replicas": pods, "selector": {"matchLabels": {"app": "startup"}},
                 "template": {"metadata": {"labels": {"app": "startup"}}, "spec": {
                     "terminationGracePeriodSeconds": 1,
                     "topologySpreadConstraints": [{
                         "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                         "whenUnsatisfiable": "DoNotSchedule",
                         "labelSelector": {"matchLabels": {"app": "startup"}}}],
                     "containers": [{"name": "busybox", "image": "localhost/busybox:1.35",
                                     "imagePullPolicy": "Never",
                                     "command": ["/bin/busybox", "sleep", "86400"]}]}}}})


class PodWatch:
    """`kubectl get pods -w -o json`: when each pod of app=startup was first seen
    and first seen Ready, by arrival time. A watch the API server ends is started
    again (its first list brings what changed meanwhile, seen late: the figures
    are then upper bounds)."""

    def __init__(self):
        self.seen, self.ready, self.lock = {}, {}, threading.Lock()
        self.stopping, self.proc, self.restarts = False, None, 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping:
            self.proc = subprocess.Popen(
                ["bash", CLUSTER, "kubectl", "get", "pods", "-n", "default", "-l", "app=startup",
                 "-w", "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._read(self.proc.stdout)
            self.proc.wait()
            self.restarts += 1

    def _read(self, stream):
        decoder, buf = json.JSONDecoder(), ""
        for line in stream:
            buf += line
            while True:
                buf = buf.lstrip()
                try:
                    obj, end = decoder.raw_decode(buf)
                except ValueError:
                    break
                buf = buf[end:]
                self._saw(obj, time.monotonic())

    def _saw(self, pod, now):
        items = pod.get("items", [pod]) if pod.get("kind") == "List" else [pod]
        with self.lock:
            for p in items:
                name = p["metadata"]["name"]
                self.seen.setdefault(name, now)
                conds = p.get("status", {}).get("conditions", [])
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                    self.ready.setdefault(name, now)

    def ready_count(self):
        with self.lock:
            return len(self.ready)

    def latencies(self):
        with self.lock:
            return sorted(self.ready[n] - self.seen[n] for n in self.ready)

    def stop(self):
        self.stopping = True
        if self.proc is not None:
            self.proc.terminate()
        self.thread.join(timeout=10)
        return self.restarts - 1


def percentile(values, q):
    if not values:
        return None
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def startup(network, pods, rest, podnet_bin, n, result):
    a0, t0 = api_requests(), time.monotonic()
    time.sleep(rest)
    result["rest_requests_per_node_min"] = round((api_requests() - a0) / n / ((time.monotonic() - t0) / 60), 1)
    result["agent_rss_mib_rest"] = agents_rss_mib(network)

    # Addresses held before (flannel's store has CoreDNS's too; podnet's count is
    # of pods of `default` only).
    base = held_addresses(network, podnet_bin)
    watch = PodWatch()
    time.sleep(1)
    a0, t0 = api_requests(), time.monotonic()
    kubectl("apply", "-f", "-", stdin=deployment(pods))
    deadline = t0 + 600
    while watch.ready_count() < pods:
        if time.monotonic() > deadline:
            raise SystemExit(f"{network}: only {watch.ready_count()} of {pods} pods Ready in 600 s")
        time.sleep(0.05)
    wall = time.monotonic() - t0
    lat = watch.latencies()
    result["watch_restarts"] = watch.stop()
    result["startup_wall_s"] = round(wall, 2)
    result["startup_p50_s"] = round(percentile(lat, 0.5), 2)
    result["startup_p99_s"] = round(percentile(lat, 0.99), 2)
    result["startup_max_s"] = round(lat[-1], 2)
    result["startup_requests_per_node_min"] = round((api_requests() - a0) / n / (wall / 60), 1)
    result["agent_rss_mib_loaded"] = agents_rss_mib(network)
    held = held_addresses(network, podnet_bin) - base
    if held != pods:
        raise SystemExit(f"{network}: {held} addresses held for {pods} Ready pods")

    t0 = time.monotonic()
    kubectl("delete", "deployment", "startup", "--wait=false")
    gone, freed = None, None
    while gone is None or freed is None:
        if time.monotonic() - t0 > 600:
            raise SystemExit(f"{network}: the pods or their addresses not gone in 600 s")
        now = time.monotonic() - t0
        if gone is None and not json.loads(kubectl("get", "pods", "-n", "default", "-l", "app=startup",
                                                   "-o", "json"))["items"]:
            gone = now
        if freed is None and held_addresses(network, podnet_bin) == base:
            freed = now
        time.sleep(0.2)
    result["delete_pods_gone_s"] = round(gone, 2)
    result["delete_addresses_free_s"] = round(freed, 2)


def main():
    network, pods, rest, podnet_bin = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    parts = (sys.argv[5] if len(sys.argv) > 5 else "startup net").split()
    unknown = set(parts) - {"startup", "net"}
    if unknown:
        raise SystemExit(f"unknown parts {sorted(unknown)}: startup, net")
    names = nodes()
    result = {"network": network, "nodes": len(names), "pods": pods, "parts": parts}
    if "startup" in parts:
        startup(network, pods, rest, podnet_bin, len(names), result)
        result["load"] = os.getloadavg()[0]
    if "net" in parts:
        result.update(cluster_net.measure(
            kubectl, CLUSTER, names, int(os.environ.get("BENCH_NET_ROUNDS", "5")),
            float(os.environ.get("BENCH_NET_SECONDS", "8")), int(os.environ.get("BENCH_NET_RR", "20000"))))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
