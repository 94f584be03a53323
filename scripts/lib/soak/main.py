"""The soak run (scripts/soak starts the cluster and podnet, then this): the
workload and its churn, a fault every 20-60 s, the checks every 10 s, then the
faults stop, the churn stops, the cluster settles, and a last round of checks
(with the allocations against the pods and `podnet ipam check`) ends it. The
report goes to SOAK_OUT (target/soak). Exit 1 when any check broke.

Environment: SOAK_MINUTES (60), SOAK_SEED (random, printed), SOAK_ROUTING (for the
report: scripts/soak installs podnet in that mode), SOAK_SETTLE (seconds, 300),
SOAK_OUT, PODNET_BIN (the podnet binary the host runs for status and ipam check)."""

import os
import random
import sys
import threading
import time

from churn import Churn, PodLedger, manifests
from cluster import Cluster
from faults import Faults
from invariants import Invariants
import report

CHECK_EVERY = 10
SETTLE_MIN = 60


def log(msg):
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {msg}", flush=True)


def wait_workload(cluster, deadline=300):
    t0 = time.time()
    while time.time() - t0 < deadline:
        pods = (cluster.kubectl_json("-n", "soak", "get", "pods") or {}).get("items") or []
        probers = [p for p in pods if (p["metadata"].get("labels") or {}).get("app") == "prober"
                   and (p.get("status") or {}).get("phase") == "Running"]
        if len(probers) == len(cluster.nodes):
            return
        time.sleep(3)
    raise SystemExit("soak: the prober pods did not all run within 300 s")


def main():
    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    minutes = float(os.environ.get("SOAK_MINUTES", "60"))
    seed = int(os.environ.get("SOAK_SEED") or random.SystemRandom().randrange(1, 2**31))
    settle = int(os.environ.get("SOAK_SETTLE", "300"))
    out = os.environ.get("SOAK_OUT", os.path.join(repo, "target", "soak"))
    routing = os.environ.get("SOAK_ROUTING", "tunnel")
    log(f"soak: seed {seed} (SOAK_SEED={seed} replays the faults), {minutes:g} min, {routing} routing")
    cluster = Cluster(repo, os.environ["PODNET_BIN"])
    for obj in manifests():
        ok, err = cluster.apply(obj)
        if not ok:
            raise SystemExit(f"soak: applying {obj['kind']} {obj['metadata']['name']}: {err}")
    wait_workload(cluster)

    ledger = PodLedger(cluster)
    ledger.start()
    churn = Churn(cluster, random.Random(seed + 1), ledger)
    faults = Faults(cluster, random.Random(seed), churn, log)
    checks = Invariants(cluster, ledger, faults, log)
    loads = []
    t0 = time.time()
    churn.start()
    faults.start()

    restarts = []

    def check_round(final=False):
        for name in cluster.supervise():
            restarts.append((time.time(), name))
            log(f"the control plane's {name} had exited; started again (a supervisor's job, not a fault)")
        healthy = checks.check(final=final)
        loads.append(os.getloadavg()[0])
        if healthy:
            for f in faults.all_faults():
                if f.end is not None and f.recovered is None:
                    f.recovered = time.time()
        return healthy

    while time.time() - t0 < minutes * 60:
        started = time.time()
        check_round()
        created, deleted = ledger.counts()
        log(f"check {checks.checks}: {created} pods created, {deleted} deleted, "
            f"{len(checks.violations)} violations, load {os.getloadavg()[0]:.1f}")
        time.sleep(max(0.0, CHECK_EVERY - (time.time() - started)))

    log("faults stop (the running ones end and heal); the churn stops")
    stopper = threading.Thread(target=faults.stop)
    stopper.start()
    churn.stop()
    stopper.join()
    end = time.time()
    log(f"settling (up to {settle} s)")
    # Settled: healthy in two rounds in a row, no Job running, and at least
    # SETTLE_MIN after the last fault (a node off for less than the node
    # controller's 40 s grace never reads NotReady, yet its pods restart).
    streak = 0
    said = None
    while time.time() - end < settle:
        time.sleep(CHECK_EVERY)
        check_round()
        running = [j["metadata"]["name"] for j in jobs_running(cluster)]
        unwell = checks.unwell + ([f"Jobs not finished: {', '.join(running[:5])}"] if running else [])
        streak = streak + 1 if not unwell else 0
        if unwell and unwell != said:
            log("not settled: " + "; ".join(unwell))
        said = unwell
        if streak >= 2 and time.time() - end >= SETTLE_MIN:
            break
    settled = time.time() - end
    healthy = streak >= 2
    log(f"settled in {settled:.0f} s (settled: {healthy}); the last round of checks")
    ledger.sample()
    check_round(final=True)
    ledger.stop()
    created, deleted = ledger.counts()
    run = {"t0": t0, "end": end, "seed": seed, "minutes": f"{minutes:g}", "routing": routing,
           "settle": settle, "settled": settled, "healthy": healthy, "backlog": churn.backlog,
           "restarts": restarts, "unwell": said}
    report.write(out, run, ledger.timeline(), faults.all_faults(), checks, loads, created, deleted)
    with open(os.path.join(out, "report.md"), encoding="utf-8") as f:
        log("report: " + f.readline().strip() + f" ({out}/report.md)")
    return 1 if checks.violations else 0


def jobs_running(cluster):
    jobs = (cluster.kubectl_json("-n", "soak", "get", "jobs") or {}).get("items") or []
    return [j for j in jobs if not (j.get("status") or {}).get("completionTime")]


if __name__ == "__main__":
    sys.exit(main())
