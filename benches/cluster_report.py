#!/usr/bin/env python3
"""The report of scripts/bench-cluster: reads its results (one JSON object per
line, each with a "part"), writes OUT.json and OUT.md and prints the tables.

usage: cluster_report.py RESULTS.jsonl OUT REV LOAD_BEFORE LOAD_AFTER MASK PREALLOC
"""

import json
import sys


def writes_total(d):
    return sum((d or {}).values())


def verbs(d):
    return ", ".join(f"{k} {v}" for k, v in sorted((d or {}).items())) or "none"


def ratio(a, b):
    return f"{a / b:.1f}x" if b else "n/a"


def burst_lines(rows, mask, prealloc):
    serial = next((r for r in rows if r["kind"] == "serial"), None)
    lines = [f"### Multi-pool burst (/{mask} blocks, pre-allocation {prealloc})", "",
             "| node | pre-allocation | update rate | ADDs (P) | failed | p50 ms | p99 ms | max ms | wall s | "
             "blocks after | writes: join | writes: ADDs | writes: DELs | p99 / serial p50 |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = serial["add"]["p50_ms"] if serial else 0
    for r in rows:
        a = r["add"]
        lines.append(
            f"| {r['kind']} | {r.get('prealloc', prealloc)} | {r['rate']} | {r['count']} ({r['parallel']}) | "
            f"{r['add_failures']} | "
            f"{a['p50_ms']} | {a['p99_ms']} | {a['max_ms']} | {r['add_wall_s']} | "
            f"{r.get('blocks_after_adds', '')} | {writes_total(r['join_writes'])} | "
            f"{writes_total(r['add_writes'])} | {writes_total(r.get('del_writes'))} | "
            f"{ratio(a['p99_ms'], base)} |")
    for r in rows:
        if r["add_failures"]:
            lines.append(f"\n{r['kind']} at {r['rate']}: first failure: {r['add_first_failure']}")
    lines += ["", "Writes by verb: " + "; ".join(
        f"{r['kind']} {r['rate']}: ADDs {verbs(r['add_writes'])}, DELs {verbs(r.get('del_writes'))}"
        for r in rows)]
    return lines


def writes_lines(rows):
    lines = ["### API-server writes per mode (CiliumNodes and Nodes, all answer codes)", "",
             "| mode | node join | 100 ADDs (P=8) | 100 DELs (P=8) | ADD p50 ms | "
             "by resource and verb (join; ADDs; DELs) |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {writes_total(r['join_writes'])} | {writes_total(r['add_writes'])} | "
            f"{writes_total(r.get('del_writes'))} | {r['add']['p50_ms']} | "
            f"{verbs(r['join_writes'])}; {verbs(r['add_writes'])}; {verbs(r.get('del_writes'))} |")
    return lines


def memory_lines(rows):
    lines = ["### Agent memory on a node (each daemon with its local pods ADDed; the multi-pool daemon reflects "
             "its node's Pods and all Namespaces, the kubernetes-mode one watches no Pods)", "",
             "| daemon | ipam | when | pods in the cluster | VmRSS MiB | VmHWM MiB | operator VmRSS MiB |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if r["phase"] == "created":
            continue
        lines.append(f"| {r['daemon']} | {r.get('ipam', '')} | {r['phase']} | {r['cluster_pods']} | "
                     f"{r['rss_mib']} | {r['hwm_mib']} | {r.get('operator_rss_mib', '')} |")
    for c in rows:
        if c["phase"] == "created":
            lines += ["", f"{c['pods']} Pods of other nodes created in {c['create_s']} s "
                          f"({c['nodes']} node names, {c['namespaces']} namespaces)"]
    return lines


def main():
    path, out, rev, load0, load1, mask, prealloc = sys.argv[1:]
    rows = [json.loads(line) for line in open(path)]
    doc = {"rev": rev, "load_before": load0, "load_after": load1, "results": rows}
    json.dump(doc, open(out + ".json", "w"), indent=1)
    lines = [f"Cluster benchmarks, podnet {rev}; load average before {load0}, after {load1}", ""]
    parts = {
        "burst": lambda rs: burst_lines(rs, mask, prealloc),
        "writes": writes_lines,
        "memory": memory_lines,
    }
    for part, render in parts.items():
        rs = [r for r in rows if r["part"] == part]
        if rs:
            lines += render(rs) + [""]
    open(out + ".md", "w").write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
