"""The soak's faults: one every 20-60 s, kind, target and durations drawn from a
random generator seeded by SOAK_SEED, so the same seed gives the same sequence.
Each runs in a thread of its own, so a long one (a node off, the API server down,
a partition) overlaps the next. A node already under a fault is not picked for
another one. Every fault is recorded with its start, its end and its outcome."""

import os
import subprocess
import threading
import time

KINDS = ("agent-kill", "reboot", "poweroff", "runtime-restart", "apiserver-down",
         "etcd-restart", "operator-leader-kill", "partition", "enospc", "rollout-restart")
NODE_KINDS = {"agent-kill", "reboot", "poweroff", "runtime-restart", "partition", "enospc"}
LEASE = "podnet-operator-resource-lock"
FILL = "soak-fill"


class Fault:
    def __init__(self, kind, target, start):
        self.kind = kind
        self.target = target
        self.start = start
        self.end = None
        self.outcome = ""
        self.recovered = None

    def describe(self):
        at = f" on {self.target}" if self.target else ""
        return f"{self.kind}{at} at {time.strftime('%H:%M:%S', time.gmtime(self.start))} UTC"


class Faults:
    def __init__(self, cluster, rng, churn, log):
        self.cluster = cluster
        self.rng = rng
        self.churn = churn
        self.log = log
        self.lock = threading.Lock()
        self.done = []
        self.active = []
        self.stopping = threading.Event()
        self.threads = []
        self.thread = threading.Thread(target=self.run, name="faults", daemon=True)

    def start(self):
        self.thread.start()

    def stop(self):
        """No new fault; waits for the running ones to end (each heals itself)."""
        self.stopping.set()
        self.thread.join()
        for t in self.threads:
            t.join()

    def run(self):
        while not self.stopping.wait(self.rng.uniform(20, 60)):
            kind = self.rng.choice(KINDS)
            target = None
            if kind not in NODE_KINDS and any(f.kind == kind for f in self.active_faults()):
                continue
            if kind in NODE_KINDS:
                free = [n for n in self.cluster.nodes if n not in self.busy_nodes()]
                if not free:
                    continue
                target = self.rng.choice(free)
            # Every draw made now, so the sequence depends on the seed alone.
            params = {"hold": self.rng.uniform(10, 60), "burst": self.rng.random() < 0.5,
                      "delay": self.rng.uniform(0.3, 2.5)}
            fault = Fault(kind, target, time.time())
            with self.lock:
                self.active.append(fault)
            t = threading.Thread(target=self.inject, args=(fault, params), daemon=True)
            self.threads.append(t)
            t.start()

    def active_faults(self):
        with self.lock:
            return list(self.active)

    def busy_nodes(self):
        with self.lock:
            return {f.target for f in self.active if f.target}

    def all_faults(self):
        with self.lock:
            return sorted(self.done + self.active, key=lambda f: f.start)

    def last_end(self, node=None, cluster_wide=True):
        """When the last fault on NODE (or on any node, for None), or with
        CLUSTER_WIDE on the whole cluster (the API server, etcd, the operator, a
        rollout), ended; now while one is still going on."""
        ends = []
        with self.lock:
            for f in self.done + self.active:
                if node is None or f.target == node or (cluster_wide and f.target is None):
                    ends.append(f.end if f.end is not None else time.time())
        return max(ends, default=0.0)

    def inject(self, fault, params):
        self.log(f"fault: {fault.describe()}")
        try:
            fault.outcome = getattr(self, fault.kind.replace("-", "_"))(fault.target, params)
        except Exception as e:  # a fault that could not be injected is still reported
            fault.outcome = f"failed: {e}"
        fault.end = time.time()
        self.log(f"fault over: {fault.describe()}: {fault.outcome} ({fault.end - fault.start:.0f} s)")
        with self.lock:
            self.active.remove(fault)
            self.done.append(fault)

    def locked_script(self, *args, deadline=240):
        """scripts/cluster ARGS, retried while another fault's command holds the
        cluster's lock."""
        t0 = time.time()
        while True:
            code, out = self.cluster.script(*args)
            if code == 0 or "holds" not in out or time.time() - t0 > deadline:
                return code, out
            time.sleep(1)

    def held(self, down, up, hold):
        """scripts/cluster DOWN, HOLD seconds, then scripts/cluster UP: the faults
        that last (a node off, the API server down, a partition)."""
        self.expect(*down)
        time.sleep(hold)
        self.expect(*up)

    def expect(self, *args):
        code, out = self.locked_script(*args)
        if code != 0:
            raise RuntimeError(f"scripts/cluster {' '.join(args)}: exit {code}: {out.strip()[-300:]}")

    # --- the kinds ------------------------------------------------------------
    def agent_kill(self, node, params):
        if params["burst"]:
            self.churn.burst()
            time.sleep(params["delay"])
        pids = self.cluster.node_process(node, "/usr/local/bin/podnet", "daemon")
        for pid in pids:
            os.kill(pid, 9)
        return f"SIGKILL to the agent (PID {pids})" + (" during an ADD burst" if params["burst"] else "")

    def reboot(self, node, _params):
        self.expect("reboot", node)
        return "power cut and boot"

    def poweroff(self, node, params):
        self.held(("poweroff", node), ("boot", node), params["hold"])
        return f"off for {params['hold']:.0f} s, then booted"

    def runtime_restart(self, node, _params):
        self.expect("restart-runtime", node)
        return "runtime restarted"

    def apiserver_down(self, _node, params):
        self.held(("cp-stop", "kube-apiserver"), ("cp-start", "kube-apiserver"), params["hold"])
        return f"kube-apiserver down for {params['hold']:.0f} s"

    def etcd_restart(self, _node, _params):
        self.expect("cp-stop", "etcd")
        self.expect("cp-start", "etcd")
        return "etcd stopped and started"

    def operator_leader_kill(self, _node, _params):
        lease = self.cluster.kubectl_json("-n", "kube-system", "get", "lease", LEASE)
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
        if not holder:
            return "no leader to kill (the Lease has no holder, or the API server did not answer)"
        pod = self.cluster.kubectl_json("-n", "kube-system", "get", "pod", holder)
        node = ((pod or {}).get("spec") or {}).get("nodeName")
        if not node:
            return f"the leader {holder} has no node"
        pids = self.cluster.node_process(node, "/usr/local/bin/podnet", "operator")
        for pid in pids:
            os.kill(pid, 9)
        return f"SIGKILL to the leader {holder} on {node} (PID {pids})"

    def partition(self, node, params):
        self.held(("partition", node), ("heal", node), params["hold"])
        return f"cut off from the fabric for {params['hold']:.0f} s"

    def enospc(self, node, params):
        path = os.path.join(self.cluster.run_podnet_dir(node), FILL)
        out = subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M"], capture_output=True,
                             text=True, check=False)
        full = "No space left" in out.stderr
        hold = params["hold"] / 2
        time.sleep(hold)
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        return f"/run/podnet filled ({'ENOSPC' if full else out.stderr.strip()[-120:]}) for {hold:.0f} s, then freed"

    def rollout_restart(self, _node, _params):
        outcomes = []
        for what in ("daemonset/podnet", "deployment/podnet-operator"):
            code, _, err = self.cluster.kubectl("-n", "kube-system", "rollout", "restart", what)
            outcomes.append(what if code == 0 else f"{what}: {err.strip()}")
        return "rollout restart of " + ", ".join(outcomes)
