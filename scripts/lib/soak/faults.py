"""The soak's faults: one every 20-60 s, kind, target and durations drawn from a
random generator seeded by SOAK_SEED, so the same seed gives the same sequence.
Each runs in a thread of its own, so a long one (a node off, the API server down,
a partition) overlaps the next. A node already under a fault is not picked for
another one. Every fault is recorded with its start, its end and its outcome; a
fault that checks a promise itself (the policy table back after it was deleted)
records a break in `violation`, which the invariants count."""

import json
import threading
import time

KINDS = ("agent-kill", "reboot", "poweroff", "runtime-restart", "apiserver-down",
         "etcd-restart", "operator-leader-kill", "partition", "enospc", "rollout-restart",
         "pool-edit", "policy-table-delete")
NODE_KINDS = {"agent-kill", "reboot", "poweroff", "runtime-restart", "partition", "enospc",
              "policy-table-delete"}
CONFIG = "podnet-config"
# The policy table's repair comes at the agent's next resync (30 s); a busy
# node gets three times that.
TABLE_BACK_WITHIN = 90
LEASE = "podnet-operator-resource-lock"


class Fault:
    def __init__(self, kind, target, start):
        self.kind = kind
        self.target = target
        self.start = start
        self.end = None
        self.outcome = ""
        self.recovered = None
        # A broken promise the fault saw itself (None: none).
        self.violation = None

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
                      "delay": self.rng.uniform(0.3, 2.5), "malformed": self.rng.random() < 0.5}
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
        """scripts/cluster ARGS, which must succeed; returns its last line (what
        it did), without the `==> `."""
        code, out = self.locked_script(*args)
        if code != 0:
            raise RuntimeError(f"scripts/cluster {' '.join(args)}: exit {code}: {out.strip()[-300:]}")
        lines = out.strip().splitlines()
        return lines[-1].removeprefix("==> ") if lines else ""

    # --- the kinds ------------------------------------------------------------
    def agent_kill(self, node, params):
        if params["burst"]:
            self.churn.burst()
            time.sleep(params["delay"])
        did = self.expect("kill", node, "daemon")
        return did + (" during an ADD burst" if params["burst"] else "")

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
        return f"the leader {holder}: " + self.expect("kill", node, "operator")

    def partition(self, node, params):
        self.held(("partition", node), ("heal", node), params["hold"])
        return f"cut off from the fabric for {params['hold']:.0f} s"

    def enospc(self, node, params):
        hold = params["hold"] / 2
        self.held(("fill-run", node), ("free-run", node), hold)
        return f"/run/podnet filled (ENOSPC) for {hold:.0f} s, then freed"

    def rollout_restart(self, _node, _params):
        outcomes = []
        for what in ("daemonset/podnet", "deployment/podnet-operator"):
            code, _, err = self.cluster.kubectl("-n", "kube-system", "rollout", "restart", what)
            outcomes.append(what if code == 0 else f"{what}: {err.strip()}")
        return "rollout restart of " + ", ".join(outcomes)

    def pool_edit(self, _node, params):
        """A ConfigMap edit the operator refuses (the mask size changed under ranges
        in use) or that does not parse (an entry with a bad mask), then the agents
        and the operator restarted, as an upgrade does, while it stands; put back
        after the hold. Restarted agents must serve and the operator must lead with
        the pool in force: the invariants (pods that do not start, addresses twice)
        and `podnet ipam check` judge it."""
        cm = self.cluster.kubectl_json("-n", "kube-system", "get", "configmap", CONFIG)
        data = (cm or {}).get("data") or {}
        if "cluster-pool-ipv4-cidr" not in data:
            return "the ConfigMap could not be read (or has no cluster pool): no edit"
        before = {k: data.get(k) for k in ("cluster-pool-ipv4-cidr", "cluster-pool-ipv4-mask-size")}
        if params["malformed"]:
            edit = {"cluster-pool-ipv4-cidr": f"{before['cluster-pool-ipv4-cidr']} 10.250.0.0/16@x"}
            what = "a malformed entry (10.250.0.0/16@x)"
        else:
            mask = int(before["cluster-pool-ipv4-mask-size"] or "24")
            edit = {"cluster-pool-ipv4-mask-size": str(mask + 2)}
            what = f"the mask size {mask} -> {mask + 2} (refused: ranges in use)"
        if not self.patch_config(edit):
            return f"{what}: the ConfigMap could not be patched"
        outcomes = []
        for target in ("daemonset/podnet", "deployment/podnet-operator"):
            code, _, err = self.cluster.kubectl("-n", "kube-system", "rollout", "restart", target)
            outcomes.append(target if code == 0 else f"{target}: {err.strip()}")
        time.sleep(params["hold"])
        restored = self.patch_config({k: v for k, v in before.items() if v is not None})
        return (f"{what}, rollout restart of {', '.join(outcomes)}, {params['hold']:.0f} s, "
                f"{'put back' if restored else 'NOT put back'}")

    def patch_config(self, data):
        """Merges DATA into the ConfigMap, retried while the API server does not
        answer (another fault may hold it down); whether it took."""
        patch = json.dumps({"data": data})
        deadline = time.time() + 240
        while time.time() < deadline:
            code, _, _ = self.cluster.kubectl("-n", "kube-system", "patch", "configmap", CONFIG,
                                              "--type", "merge", "-p", patch)
            if code == 0:
                return True
            time.sleep(2)
        return False

    def policy_table_delete(self, node, _params):
        """`nft delete table inet podnet_policy` on the node, as `nft flush ruleset`
        or a host firewall's restart does: the agent must put it back by its next
        resync (a break, counted, when it is not back within TABLE_BACK_WITHIN)."""
        code, out = self.locked_script("exec", node, "nft", "delete", "table", "inet",
                                       "podnet_policy")
        if code != 0:
            return f"no table to delete: {out.strip()[-160:]}"
        t0 = time.time()
        while time.time() - t0 < TABLE_BACK_WITHIN:
            time.sleep(2)
            if not self.cluster.node_is_on(node):
                return "the node went off before the table was back"
            code, _ = self.cluster.script("exec", node, "nft", "list", "table", "inet",
                                          "podnet_policy")
            if code == 0:
                return f"deleted; back after {time.time() - t0:.0f} s"
        self.set_violation(node, f"inet podnet_policy deleted on {node} was not back within "
                                 f"{TABLE_BACK_WITHIN} s")
        return f"deleted; NOT back within {TABLE_BACK_WITHIN} s"

    def set_violation(self, node, evidence):
        with self.lock:
            for f in self.active:
                if f.kind == "policy-table-delete" and f.target == node:
                    f.violation = evidence
