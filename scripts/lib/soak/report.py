"""The soak's report: target/soak/report.md (its first line the totals), the
machine and its load, faults by kind with the longest recovery, pods created and
deleted and the rate, every violation; and soak.png, pods Running, pod creates
per minute and the faults over time, drawn with matplotlib."""

import collections
import os
import platform
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)

COLORS = ["tab:red", "tab:orange", "tab:olive", "tab:green", "tab:cyan", "tab:blue",
          "tab:purple", "tab:pink", "tab:brown", "tab:gray"]


def machine():
    model = "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo", encoding="utf-8") as f:
            mem = int(f.readline().split()[1]) // (1024 * 1024)
    except OSError:
        mem = 0
    return f"{os.cpu_count()} CPUs ({model}), {mem} GiB, Linux {platform.release()}"


def clock(t):
    return time.strftime("%H:%M:%S", time.gmtime(t))


def per_minute(timeline, t0):
    """Pods created in each whole minute of the run: [(minute, count)]."""
    created = collections.Counter()
    last = 0
    for t, _, seen, _ in timeline:
        created[int((t - t0) // 60)] += seen - last
        last = seen
    return sorted(created.items())


def plot(path, timeline, faults, t0, title):
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    minutes = [(t - t0) / 60 for t, *_ in timeline]
    top.plot(minutes, [r for _, r, _, _ in timeline], color="tab:blue", label="pods Running (namespace soak)")
    top.set_ylabel("pods Running")
    rate = per_minute(timeline, t0)
    bottom.bar([m + 0.5 for m, _ in rate], [c for _, c in rate], width=0.9, color="tab:green",
               label="pods created per minute")
    bottom.set_ylabel("pods created / min")
    bottom.set_xlabel("minutes since the start")
    kinds = sorted({f.kind for f in faults})
    color = {k: COLORS[i % len(COLORS)] for i, k in enumerate(kinds)}
    for f in faults:
        end = f.end if f.end is not None else f.start
        for ax in (top, bottom):
            ax.axvspan((f.start - t0) / 60, max((end - t0) / 60, (f.start - t0) / 60 + 0.1),
                       color=color[f.kind], alpha=0.25, label=f.kind if ax is top else None)
    handles, labels = top.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    top.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", ncol=3)
    bottom.legend(fontsize=7, loc="upper left")
    top.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(out, run, timeline, faults, invariants, loads, created, deleted):
    os.makedirs(out, exist_ok=True)
    duration = max(run["end"] - run["t0"], 1)
    rate_c = created / duration * 60
    rate_d = deleted / duration * 60
    title = f"podnet soak, {run['routing']} routing, seed {run['seed']}, {run['minutes']} min"
    plot(os.path.join(out, "soak.png"), timeline, faults, run["t0"], title)
    by_kind = collections.defaultdict(list)
    for f in faults:
        by_kind[f.kind].append(f)
    lines = [f"faults: {len(faults)}, pods created: {created}, pods deleted: {deleted}, "
             f"violations: {len(invariants.violations)}", "",
             f"# {title}", "",
             f"Started {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(run['t0']))} UTC; faults for "
             f"{run['minutes']} min, then {run['settled']:.0f} s to settle (limit {run['settle']} s"
             f"{'' if run['healthy'] else ', reached: not settled: ' + '; '.join(run.get('unwell') or ['unknown'])}"
             f"); {invariants.checks} rounds of checks; "
             f"replay: `SOAK_SEED={run['seed']} SOAK_MINUTES={run['minutes']} SOAK_ROUTING={run['routing']} "
             "make soak`.", "",
             f"Machine: {machine()}; load (1-minute average) {min(loads, default=0):.1f}-"
             f"{max(loads, default=0):.1f} over the run.", "",
             f"Pods: {created} created and {deleted} deleted in namespace soak, {rate_c:.1f} creates and "
             f"{rate_d:.1f} deletes per minute (the churn adds pods while fewer than {run['backlog']} wait to "
             "start: the rate is what this machine held under the faults).", "",
             "![pods Running, creates per minute and faults](soak.png)", "",
             "## Faults by kind", "",
             "| fault | times | longest recovery (fault over to a healthy cluster) | outcomes |",
             "|---|---|---|---|"]
    for kind in sorted(by_kind):
        fs = by_kind[kind]
        rec = [f.recovered - f.end for f in fs if f.recovered is not None and f.end is not None]
        never = sum(1 for f in fs if f.recovered is None)
        longest = f"{max(rec):.0f} s" if rec else "-"
        if never:
            longest += f" ({never} never seen healthy before the next fault or the end)"
        outcomes = "; ".join(sorted({f.outcome.split(' (PID')[0] for f in fs}))[:400]
        lines.append(f"| {kind} | {len(fs)} | {longest} | {outcomes} |")
    lines += ["", "Kubernetes components that exited by themselves and the soak started again, as a "
              "control plane's supervisor would: " + (", ".join(f"{name} at {clock(t)}" for t, name in
                                                        run["restarts"]) or "none") + "."]
    lines += ["", "## Violations", ""]
    if not invariants.violations:
        lines.append("None: every check held in every round.")
    for v in invariants.violations:
        lines.append(f"- **{clock(v.when)} {v.kind}** (after {v.fault}): {v.evidence}")
    lines += ["", "## Every fault", "", "| start (UTC) | fault | target | took | outcome |", "|---|---|---|---|---|"]
    for f in faults:
        took = f"{f.end - f.start:.0f} s" if f.end else "-"
        lines.append(f"| {clock(f.start)} | {f.kind} | {f.target or 'cluster'} | {took} | {f.outcome} |")
    with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
