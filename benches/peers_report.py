#!/usr/bin/env python3
"""The tables of scripts/bench-peers, from its results (one JSON line per network,
benches/cluster_peers.py's output): the start-up table and the network table
(pod to pod, host to host, pod to Service), each only for the networks that ran
that part, then the ratios podnet / flannel and pod / host and the issue's
targets (throughput >= 0.95x flannel's in tunnel mode and >= 0.95x host to host
in native mode; request/response p99 <= flannel's), under a line naming the
machine (the ratios move with the CPU). Markdown on stdout.

usage: peers_report.py RESULTS.jsonl
"""

import json
import sys

from cni_compare import machine

STARTUP = [("startup_wall_s", "start-up, all Ready (s)"), ("startup_p50_s", "pod p50 (s)"),
           ("startup_p99_s", "pod p99 (s)"), ("delete_addresses_free_s", "delete, addresses free (s)"),
           ("rest_requests_per_node_min", "API req/node/min at rest"),
           ("startup_requests_per_node_min", "API req/node/min during start-up")]
NET = [("stream1_gbit_s", "1 stream Gbit/s"), ("stream8_gbit_s", "8 streams Gbit/s"),
       ("rr_p50_us", "rr p50 µs"), ("rr_p99_us", "rr p99 µs")]
PATHS = [("host", "host to host"), ("pod", "pod to pod"), ("service", "pod to Service")]


def rss(r, k):
    v = [x for x in r[k].values() if x is not None]
    return round(max(v), 1) if v else None


def ratio(a, b):
    if a is None:
        return ""
    return f"{a / b:.2f}" if b else "n/a"


def normalized(r, key):
    """Pod to pod over host to host in the same cluster: the load of the moment
    (the networks run one after the other) divides out."""
    pod, host = r.get(f"pod_{key}"), r.get(f"host_{key}")
    return pod / host if pod is not None and host else None


def startup_table(rows):
    rows = [r for r in rows if "startup_wall_s" in r]
    if not rows:
        return
    print("| network | pods | " + " | ".join(c[1] for c in STARTUP) + " | agent RSS max, rest / loaded (MiB) | load |")
    print("|---" * (len(STARTUP) + 4) + "|")
    for r in rows:
        print(f"| {r['network']} | {r['pods']} | " + " | ".join(str(r[c[0]]) for c in STARTUP)
              + f" | {rss(r, 'agent_rss_mib_rest')} / {rss(r, 'agent_rss_mib_loaded')} | {r['load']:.1f} |")
    by = {r["network"]: r for r in rows}
    if "flannel" in by:
        f = by["flannel"]
        for name in ("podnet-tunnel", "podnet-native"):
            if name in by:
                p = by[name]
                ratios = ", ".join(f"{c[1]} {p[c[0]] / f[c[0]]:.2f}x" for c in STARTUP if f[c[0]])
                print(f"\n{name} / flannel: {ratios}")
    print()


def cell(r, path, key):
    v = r.get(f"{path}_{key}")
    return "" if v is None else f"{v:g}"


def net_tables(rows):
    rows = [r for r in rows if "pod_rr_p50_us" in r]
    if not rows:
        return
    r0 = rows[0]
    print(f"Network: {r0['net_server_node']} serves, {r0['net_client_node']} is the client; "
          f"medians over {r0['net_rounds']} rounds of {r0['net_seconds']:g} s per stream test and "
          f"{r0['net_rr_count']} one-byte round trips per rr test.\n")
    print("| network | path | " + " | ".join(c[1] for c in NET) + " | load (1 min) |")
    print("|---" * (len(NET) + 3) + "|")
    for r in rows:
        for path, label in PATHS:
            print(f"| {r['network']} | {label} | " + " | ".join(cell(r, path, c[0]) for c in NET)
                  + f" | {r['net_load_min']:g}-{r['net_load_max']:g} |")
    by = {r["network"]: r for r in rows}
    f = by.get("flannel")
    print("\n| ratio | " + " | ".join(c[1] for c in NET) + " |")
    print("|---" * (len(NET) + 1) + "|")
    for r in rows:
        name = r["network"]
        print(f"| {name} pod / own host | " + " | ".join(
            ratio(r.get(f"pod_{c[0]}"), r.get(f"host_{c[0]}")) for c in NET) + " |")
        if f is not None and r is not f:
            for path, label in PATHS[1:]:
                print(f"| {name} / flannel, {label} | " + " | ".join(
                    ratio(r.get(f"{path}_{c[0]}"), f.get(f"{path}_{c[0]}")) for c in NET) + " |")
            print(f"| {name} / flannel, pod to pod, each over its own host | " + " | ".join(
                ratio(normalized(r, c[0]), normalized(f, c[0])) for c in NET) + " |")
    targets = []
    for name, base, against in (("podnet-tunnel", "flannel", "flannel's"),
                                ("podnet-native", None, "host to host")):
        r = by.get(name)
        if r is None or (base and f is None):
            continue
        for key, label in NET[:2]:
            ref = f[f"pod_{key}"] if base else r[f"host_{key}"]
            x = r[f"pod_{key}"] / ref
            extra = f" (each over its own host: {normalized(r, key) / normalized(f, key):.2f})" if base else ""
            targets.append(f"{name} {label} >= 0.95x {against}: {x:.2f}{extra}, "
                           f"{'met' if x >= 0.95 else 'not met'}")
        if f is not None:
            for path, label in PATHS[1:]:
                p, q = r[f"{path}_rr_p99_us"], f[f"{path}_rr_p99_us"]
                targets.append(f"{name} {label} rr p99 <= flannel's: {p:g} vs {q:g} µs, "
                               f"{'met' if p <= q else 'not met'}")
    if targets:
        print("\nTargets (load " + ", ".join(f"{r['network']} {r['net_load_min']:g}-{r['net_load_max']:g}"
                                            for r in rows) + "):")
        for t in targets:
            print(f"- {t}")
    print()


def main():
    rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8") if line.strip()]
    m = machine()
    print(f"Machine: {m['nproc']} CPUs ({m['cpu']}), kernel {m['kernel']}, {m['mem']} RAM.\n")
    startup_table(rows)
    net_tables(rows)


if __name__ == "__main__":
    main()
