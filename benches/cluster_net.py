"""The network part of benches/cluster_peers.py: pod to pod, host to host and pod
to Service across two nodes of the running cluster of scripts/cluster, with
netbench (benches/netbench, image localhost/netbench:1, imported by
scripts/bench-peers).

Pods, pinned by nodeName: a netbench server on the first node and an idle client
on the second, once on the pod network and once with hostNetwork (host to host:
the baseline, measured in the same cluster), and a ClusterIP Service in front of
the pod server (kube-proxy, nftables mode). Each round runs, through `kubectl
exec` in the client pods: TCP throughput with 1 and with 8 streams for SECONDS
each (host, then pod; the order swapped every round), and COUNT one-byte
request/response round trips on one connection (host, pod, Service). The
figures are the medians over the rounds (for p99, the median of the rounds'
p99s); every figure carries the machine's 1-minute load average when it was
taken.
"""

import json
import statistics
import subprocess

IMAGE = "localhost/netbench:1"
POD_PORT, HOST_PORT = 5201, 5202
LABEL = "podnet-bench=net"


def pod(name, node, host, args):
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default",
                     "labels": {"podnet-bench": "net", "app": name}},
        "spec": {"nodeName": node, "hostNetwork": host, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "netbench", "image": IMAGE, "imagePullPolicy": "Never",
                                 "command": ["/netbench", *args]}]}}


def objects(server_node, client_node):
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "nb-server", "namespace": "default",
                            "labels": {"podnet-bench": "net"}},
               "spec": {"selector": {"app": "nb-server"},
                        "ports": [{"port": POD_PORT, "targetPort": POD_PORT, "protocol": "TCP"}]}}
    return {"apiVersion": "v1", "kind": "List", "items": [
        pod("nb-server", server_node, False, ["server", "--port", str(POD_PORT)]),
        pod("nb-host-server", server_node, True, ["server", "--port", str(HOST_PORT)]),
        pod("nb-client", client_node, False, ["idle"]),
        pod("nb-host-client", client_node, True, ["idle"]),
        service]}


def netbench(kubectl, client, *args):
    out = kubectl("exec", client, "--", "/netbench", *args)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"netbench {' '.join(args)} in {client}: no result in {out!r}")
    return json.loads(lines[-1])


def in_node(cluster, node, *cmd):
    out = subprocess.run(["bash", cluster, "exec", node, *cmd], capture_output=True, text=True, check=False)
    return json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else None


def datapath(cluster, node):
    """What a packet meets on the node: each link's MTU (the pods' host ends, a
    peer in another namespace, summed up as "pod links"), the VXLAN device's
    settings, and the nftables rules per table (kube-proxy's, podnet's, flannel's
    iptables-nft)."""
    mtus, vxlan = {}, {}
    for link in in_node(cluster, node, "ip", "-d", "-j", "link") or []:
        name = link["ifname"]
        key = "pod links" if "link_netnsid" in link and name != "eth0" else name
        mtus.setdefault(key, set()).add(link.get("mtu"))
        info = link.get("linkinfo", {})
        if info.get("info_kind") == "vxlan":
            data = info.get("info_data", {})
            vxlan[name] = {k: data.get(k) for k in ("id", "port", "udp_csum", "learning", "gbp")}
            vxlan[name].update({k: link.get(k) for k in ("gso_max_size", "gro_max_size", "tso_max_size")})
    rules = {}
    for obj in (in_node(cluster, node, "nft", "-j", "list", "ruleset") or {}).get("nftables", []):
        if "rule" in obj:
            key = f"{obj['rule']['family']} {obj['rule']['table']}"
            rules[key] = rules.get(key, 0) + 1
    return {"mtus": {k: sorted(v) for k, v in sorted(mtus.items())}, "vxlan": vxlan, "nft_rules": rules}


def median(values, digits):
    return round(statistics.median(values), digits) if values else None


def measure(kubectl, cluster, nodes, rounds, seconds, count):
    if len(nodes) < 2:
        raise SystemExit("the network part needs two nodes")
    server_node, client_node = nodes[0], nodes[1]
    kubectl("apply", "-f", "-", stdin=json.dumps(objects(server_node, client_node)))
    kubectl("wait", "--for=condition=Ready", "pod", "-l", LABEL, "--timeout=180s")
    pods = {p["metadata"]["name"]: p for p in
            json.loads(kubectl("get", "pods", "-l", LABEL, "-o", "json"))["items"]}
    for name, p in pods.items():
        want = server_node if "server" in name else client_node
        if p["spec"]["nodeName"] != want:
            raise SystemExit(f"{name} runs on {p['spec']['nodeName']}, not {want}")
    if pods["nb-server"]["status"]["podIP"] == pods["nb-host-server"]["status"]["podIP"]:
        raise SystemExit("the pod server has the node's address: not on the pod network")
    cluster_ip = json.loads(kubectl("get", "service", "nb-server", "-o", "json"))["spec"]["clusterIP"]
    targets = {
        "host": ("nb-host-client", f"{pods['nb-host-server']['status']['podIP']}:{HOST_PORT}"),
        "pod": ("nb-client", f"{pods['nb-server']['status']['podIP']}:{POD_PORT}"),
        "service": ("nb-client", f"{cluster_ip}:{POD_PORT}"),
    }
    # A first small exchange on every path: the servers listen, kube-proxy has the
    # Service's rules (the client retries its connect for 15 s).
    for client, to in targets.values():
        netbench(kubectl, client, "rr", "--to", to, "--count", "100", "--warmup", "0")

    raw = []
    for r in range(rounds):
        order = ["host", "pod"] if r % 2 == 0 else ["pod", "host"]
        for streams in (1, 8):
            for path in order:
                client, to = targets[path]
                res = netbench(kubectl, client, "stream", "--to", to, "--streams", str(streams),
                               "--seconds", str(seconds))
                raw.append({"round": r, "path": path, "test": f"stream{streams}", **res})
        for path in order + ["service"]:
            client, to = targets[path]
            res = netbench(kubectl, client, "rr", "--to", to, "--count", str(count))
            raw.append({"round": r, "path": path, "test": "rr", **res})

    def pick(path, test, key):
        return [x[key] for x in raw if x["path"] == path and x["test"] == test]

    result = {"net_rounds": rounds, "net_seconds": seconds, "net_rr_count": count,
              "net_server_node": server_node, "net_client_node": client_node}
    for path in ("host", "pod", "service"):
        if path != "service":
            result[f"{path}_stream1_gbit_s"] = median(pick(path, "stream1", "gbit_s"), 2)
            result[f"{path}_stream8_gbit_s"] = median(pick(path, "stream8", "gbit_s"), 2)
        result[f"{path}_rr_p50_us"] = median(pick(path, "rr", "p50_us"), 1)
        result[f"{path}_rr_p99_us"] = median(pick(path, "rr", "p99_us"), 1)
    loads = [x["load1"] for x in raw if x.get("load1") is not None]
    result["net_load_min"] = min(loads) if loads else None
    result["net_load_max"] = max(loads) if loads else None
    result["net_datapath_client_node"] = datapath(cluster, client_node)
    result["net_raw"] = raw
    kubectl("delete", "-f", "-", "--wait=false", stdin=json.dumps(objects(server_node, client_node)))
    return result
