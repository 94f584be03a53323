"""What must hold at every moment of the soak, checked every 10 s and once more
after the settle period: no address on two live pods, none held by two nodes'
agents, no IPAMLeak Event naming a live pod, every Running pod reachable from each
other node's prober, no pod creating for over 60 s after the last fault on its
node ended; after the settle period also each agent's allocations equal to its
node's pods' addresses and `podnet ipam check` clean. A break is recorded once
per episode, with its time, the fault before it and the evidence; the run goes on."""

import collections
import json
import threading
import time

from churn import NS, PROBER_COMMAND, waiting_to_start

STUCK_AFTER = 60
SETTLE_AFTER_FAULT = 30
READY_FOR = 10


class Violation:
    def __init__(self, kind, key, when, fault, evidence):
        self.kind = kind
        self.key = key
        self.when = when
        self.fault = fault
        self.evidence = evidence


def pod_ips(pod):
    status = pod.get("status") or {}
    ips = [p.get("ip") for p in status.get("podIPs") or [] if p.get("ip")]
    if not ips and status.get("podIP"):
        ips = [status["podIP"]]
    return ips


def host_network(pod):
    return bool((pod.get("spec") or {}).get("hostNetwork"))


def live(pod):
    """A pod that holds its address: not on the host's network, not finished."""
    phase = (pod.get("status") or {}).get("phase")
    return not host_network(pod) and phase in ("Pending", "Running") and pod_ips(pod)


def name_of(pod):
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def ready_since(pod):
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return parse_time(c.get("lastTransitionTime"))
    return None


def parse_time(stamp):
    if not stamp:
        return None
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone


def ready_nodes(nodes, now):
    """{node: since when it is Ready} for the Ready nodes of a `get nodes` list."""
    ready = {}
    for n in (nodes or {}).get("items") or []:
        for c in (n.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") == "True":
                ready[n["metadata"]["name"]] = parse_time(c.get("lastTransitionTime")) or now
    return ready


def kubelet_since(pod):
    """When the pod's kubelet first reported on it (the earliest condition it
    sets), or None while it has not: only the scheduler's PodScheduled is there."""
    times = [parse_time(c.get("lastTransitionTime")) for c in (pod.get("status") or {}).get("conditions") or []
             if c.get("type") != "PodScheduled"]
    times = [t for t in times if t]
    return min(times) if times else None


def duplicate_pod_addresses(pods):
    """Addresses the API server lists on two live pods: {ip: [pod, ...]}."""
    holders = collections.defaultdict(list)
    for p in pods:
        if live(p):
            for ip in pod_ips(p):
                holders[ip].append(p)
    return {ip: ps for ip, ps in holders.items() if len(ps) > 1}


def agent_owner_pod(owner):
    """The `namespace/name` an agent's allocation owner names, or None for the
    agent's own addresses (router, health)."""
    head = owner.split(" ", 1)[0]
    return head if "/" in head else None


class Invariants:
    def __init__(self, cluster, ledger, faults, log):
        self.cluster = cluster
        self.ledger = ledger
        self.faults = faults
        self.log = log
        self.violations = []
        self.open = set()
        self.reported_stuck = set()
        self.checks = 0
        # Why the last round found the cluster unhealthy (the settle log says it).
        self.unwell = []

    def record(self, kind, key, evidence):
        """Records a break once per episode (until a check finds it gone)."""
        self.seen_now.add((kind, key))
        if (kind, key) in self.open:
            return
        self.open.add((kind, key))
        before = [f for f in self.faults.all_faults() if f.start <= time.time()]
        fault = before[-1].describe() if before else "none yet"
        v = Violation(kind, key, time.time(), fault, evidence)
        self.violations.append(v)
        self.log(f"VIOLATION {kind}: {evidence} (after {fault})")

    def check_faults_own(self):
        """The breaks a fault saw itself (the policy table not put back)."""
        for f in self.faults.all_faults():
            if f.violation:
                self.record(f"{f.kind} check", f.describe(), f.violation)

    def node_settled(self, node, now):
        """A node that is on and had no fault of its own for SETTLE_AFTER_FAULT
        seconds. Faults of the whole cluster do not count: pods that run must stay
        reachable while the API server is down or the agents restart."""
        return self.cluster.node_is_on(node) and node not in self.faults.busy_nodes() \
            and now - self.faults.last_end(node, cluster_wide=False) >= SETTLE_AFTER_FAULT

    def check(self, final=False):
        """One round of every check; returns True when the cluster is healthy (the
        API answers, every node is Ready, every agent answers, no pod waits long)."""
        self.checks += 1
        self.seen_now = set()
        now = time.time()
        pods = self.ledger.latest_pods()
        fresh = self.ledger.api_up and self.ledger.last_listed and now - self.ledger.last_listed < 30
        allocs = {n: self.cluster.allocations(n) for n in self.cluster.nodes if self.cluster.node_is_on(n)}
        nodes = self.cluster.kubectl_json("get", "nodes", timeout=10) if fresh else None
        ready = ready_nodes(nodes, now)
        if fresh:
            self.check_pod_addresses(pods)
            self.check_leak_events(pods)
        if nodes is not None:
            self.check_stuck(pods, ready, now)
        self.check_agent_overlap(allocs)
        self.check_faults_own()
        if self.ledger.last_listed and now - self.ledger.last_listed < 90:
            self.check_reachability(pods, now)
        if final:
            self.check_allocations_match(pods, allocs)
            self.check_ipam()
        self.open &= self.seen_now
        if nodes is None:
            self.unwell = ["the API server's node list could not be read"]
            return False
        self.unwell = self.unhealthy(pods, allocs, ready, now)
        return not self.unwell

    def unhealthy(self, pods, allocs, ready, now):
        """Why the cluster is not healthy (empty when it is): nodes not Ready,
        agents not answering, pods waiting over 30 s to start."""
        why = [f"{n} not Ready" for n in self.cluster.nodes if n not in ready]
        why += [f"{n}'s agent not answering" for n in self.cluster.nodes if allocs.get(n) is None]
        waiting = sorted(name_of(p) for p in pods if waiting_to_start(p)
                         and now - self.ledger.seen.get(p["metadata"]["uid"], now) > 30)
        if waiting:
            why.append(f"{len(waiting)} pods waiting over 30 s to start ({', '.join(waiting[:5])})")
        return why

    # --- the checks -------------------------------------------------------------
    def check_pod_addresses(self, pods):
        for ip, holders in duplicate_pod_addresses(pods).items():
            names = sorted(f"{name_of(p)} (uid {p['metadata']['uid'][:8]}, node "
                           f"{p['spec'].get('nodeName')}, {p['status'].get('phase')})" for p in holders)
            self.record("address on two live pods", ip, f"{ip} is listed on {', '.join(names)}")

    def check_agent_overlap(self, allocs):
        holders = collections.defaultdict(list)
        for node, a in allocs.items():
            for ip, owner in (a or {}).items():
                holders[ip].append(f"{node} ({owner})")
        for ip, who in holders.items():
            if len(who) > 1:
                self.record("address held by two agents", ip, f"{ip} is allocated on {', '.join(who)}")

    def check_leak_events(self, pods):
        events = self.cluster.kubectl_json("get", "events", "-A", "--field-selector", "reason=IPAMLeak",
                                           timeout=15)
        if events is None:
            return
        live_names = {name_of(p): p for p in pods if live(p)}
        for e in events.get("items") or []:
            note = e.get("message") or e.get("note") or ""
            # "<ip> (<namespace>/<name>[, container <id>]): <why>"
            head = note.split(": ", 1)[0]
            if "(" not in head:
                continue
            ip, rest = head.split(" (", 1)
            named = rest.rstrip(")").split(",", 1)[0]
            if named in live_names:
                p = live_names[named]
                self.record("IPAMLeak Event names a live pod", f"{named} {ip}",
                            f"Event on {e.get('involvedObject', {}).get('name')}: '{note}'; {named} is "
                            f"{p['status'].get('phase')} with {pod_ips(p)}")

    def check_stuck(self, pods, ready, now):
        """A pod's wait counts from the latest of its creation, the end of the last
        fault on its node (or the cluster), its node's turning Ready and its
        kubelet's first word on it (a kubelet reconnects to a restarted API server
        on its own clock, up to a minute, and sees new pods only then). A pod whose
        containers were created or started waits for the kubelet's status, not for
        its network."""
        for p in pods:
            if not waiting_to_start(p):
                continue
            uid = p["metadata"]["uid"]
            node = p["spec"]["nodeName"]
            kubelet = kubelet_since(p)
            if node not in ready or node in self.faults.busy_nodes() or kubelet is None:
                continue
            since = max(self.ledger.seen.get(uid, now), self.faults.last_end(node), ready[node], kubelet)
            if uid in self.reported_stuck:
                self.seen_now.add(("pod creating over 60 s after the last fault on its node", uid))
            if now - since <= STUCK_AFTER or uid in self.reported_stuck:
                continue
            reasons, notes = self.pod_events(p)
            if reasons & {"Created", "Started"}:
                continue
            self.reported_stuck.add(uid)
            waiting = [((c.get("state") or {}).get("waiting") or {}) for c in
                       (p.get("status") or {}).get("containerStatuses") or []]
            self.record("pod creating over 60 s after the last fault on its node", uid,
                        f"{name_of(p)} on {node}, waiting {now - since:.0f} s (since "
                        f"{time.strftime('%H:%M:%S', time.gmtime(since))}): {waiting or 'no container status'}; "
                        f"events: {notes}")

    def pod_events(self, pod):
        """The pod's Events: (their reasons, the last four as text)."""
        events = self.cluster.kubectl_json("-n", pod["metadata"]["namespace"], "get", "events",
                                           "--field-selector", f"involvedObject.uid={pod['metadata']['uid']}",
                                           timeout=10)
        items = (events or {}).get("items") or []
        notes = [f"{e.get('reason')}: {(e.get('message') or '')[:300]}" for e in items]
        return {e.get("reason") for e in items}, (" | ".join(notes[-4:]) if notes else "none")

    def check_reachability(self, pods, now):
        settled = [n for n in self.cluster.nodes if self.node_settled(n, now)]
        probers = {}
        for node in settled:
            pid = self.prober_pid(node, pods)
            if pid:
                probers[node] = pid
        targets = {}
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            since = ready_since(p)
            if (node in settled and live(p) and p["status"].get("phase") == "Running"
                    and not p["metadata"].get("deletionTimestamp") and since and now - since >= READY_FOR):
                for ip in pod_ips(p):
                    targets[ip] = (p, node)
        results = {}

        def probe(src, pid):
            mine = [ip for ip, (_, node) in targets.items() if node != src]
            lost = [ip for ip, ok in self.cluster.ping_from(pid, mine).items() if not ok]
            for _ in range(2):
                if not lost:
                    break
                time.sleep(2)
                lost = [ip for ip, ok in self.cluster.ping_from(pid, lost).items() if not ok]
            results[src] = lost

        threads = [threading.Thread(target=probe, args=item) for item in probers.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for src, lost in results.items():
            # A fault on either node since the round began excuses the loss.
            after = time.time()
            if not self.node_settled(src, after):
                continue
            for ip in lost:
                p, node = targets[ip]
                if self.node_settled(node, after) and self.still_there(p, ip) and self.runs_on(p, node, ip):
                    self.record("Running pod unreachable from another node", f"{src}->{ip}",
                                f"{name_of(p)} ({ip}, on {node}, Ready since "
                                f"{time.strftime('%H:%M:%S', time.gmtime(ready_since(p)))}) does not answer "
                                f"3 pings from the prober on {src}; {self.route_evidence(node, src, ip)}")

    def route_evidence(self, node, src, ip):
        """How the pod's node and the prober's node route to the pod now."""
        said = []
        for where in (src, node):
            _, out = self.cluster.script("exec", where, "ip", "route", "get", ip, timeout=20)
            said.append(f"`ip route get {ip}` on {where}: {out.strip().splitlines()[0] if out.strip() else '?'}")
        return "; ".join(said)

    def still_there(self, pod, ip):
        """True when the API server says the pod still runs with IP, not being
        deleted. False when it does not answer either: a loss seen while the API
        server is down is judged in a later round, against a fresh list (the list
        this round used may predate a deletion)."""
        code, out, _ = self.cluster.kubectl("-n", pod["metadata"]["namespace"], "get", "pod",
                                            pod["metadata"]["name"], "-o", "json", timeout=10)
        if code != 0:
            return False
        try:
            now = json.loads(out)
        except ValueError:
            return False
        return now["metadata"]["uid"] == pod["metadata"]["uid"] and ip in pod_ips(now) \
            and not now["metadata"].get("deletionTimestamp")

    def runs_on(self, pod, node, ip):
        """True when a process of the pod runs on its node. A pod the API server
        calls Running but whose node runs nothing of it is not a lost pod: its
        status is stale (the kubelet tore it down while it could not write the
        API server); logged, not counted."""
        if self.cluster.pod_runs(node, pod["metadata"]["uid"]):
            return True
        self.log(f"note: {name_of(pod)} ({ip}) is Running in the API server but nothing of it runs on "
                 f"{node}: a stale status, not a lost pod")
        return False

    def prober_pid(self, node, pods):
        """The PID of the prober pod's process on NODE, if it runs."""
        if not any(p for p in pods if p["metadata"]["namespace"] == NS and p["spec"].get("nodeName") == node
                   and (p["metadata"].get("labels") or {}).get("app") == "prober"
                   and p["status"].get("phase") == "Running"):
            return None
        pids = self.cluster.node_process(node, "/bin/busybox", *PROBER_COMMAND)
        return pids[0] if pids else None

    def check_allocations_match(self, pods, allocs):
        for node in self.cluster.nodes:
            a = allocs.get(node)
            if a is None:
                self.record("agent allocations differ from the node's pods", node,
                            f"the agent on {node} did not answer")
                continue
            held = {ip: owner for ip, owner in a.items() if agent_owner_pod(owner)}
            want = {ip: name_of(p) for p in pods if live(p) and p["spec"].get("nodeName") == node
                    for ip in pod_ips(p)}
            extra = sorted(set(held) - set(want))
            missing = sorted(set(want) - set(held))
            if extra or missing:
                self.record("agent allocations differ from the node's pods", node,
                            f"{node}: allocated but no live pod: {[f'{ip} ({held[ip]})' for ip in extra]}; "
                            f"a live pod's address not allocated: {[f'{ip} ({want[ip]})' for ip in missing]}")

    def check_ipam(self):
        code, out = self.cluster.ipam_check()
        if code != 0:
            self.record("podnet ipam check failed", "final", f"exit {code}: {out.strip()[-1500:]}")
