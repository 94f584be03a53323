"""The soak's workload: pods that come and go in namespace `soak` (two Deployments
scaled up and down, pods deleted, Jobs run to completion, a StatefulSet), a prober
pod on every node (the reachability check pings from them), and the ledger that
counts the pods created and deleted from what the API server lists.

The churn pushes as hard as the machine takes: it adds pods while fewer than
`backlog` of them wait to start, and holds back while more do, so the rate it
reaches is what this machine holds; the report gives it."""

import random
import threading
import time

NS = "soak"
IMAGE = "localhost/busybox:1.35"
DEPLOYMENTS = ("churn-a", "churn-b")
STATEFULSET = "web"
# The prober's command, which no other pod runs: the soak finds its process by it.
PROBER_COMMAND = ["sleep", "999999"]


def container(command):
    return {"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
            "command": ["/bin/busybox", *command]}


def pod_template(app, command, restart="Always", extra=None):
    spec = {"terminationGracePeriodSeconds": 1, "restartPolicy": restart,
            "containers": [container(command)]}
    spec.update(extra or {})
    return {"metadata": {"labels": {"app": app}}, "spec": spec}


def manifests():
    """The namespace, the prober DaemonSet, the Deployments and the StatefulSet."""
    sleep = ["sleep", "86400"]
    objs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}]
    prober = pod_template("prober", PROBER_COMMAND, extra={"tolerations": [{"operator": "Exists"}]})
    objs.append({"apiVersion": "apps/v1", "kind": "DaemonSet",
                 "metadata": {"name": "prober", "namespace": NS},
                 "spec": {"selector": {"matchLabels": {"app": "prober"}}, "template": prober}})
    for name in DEPLOYMENTS:
        objs.append({"apiVersion": "apps/v1", "kind": "Deployment",
                     "metadata": {"name": name, "namespace": NS},
                     "spec": {"replicas": 3, "selector": {"matchLabels": {"app": name}},
                              "template": pod_template(name, sleep)}})
    objs.append({"apiVersion": "v1", "kind": "Service",
                 "metadata": {"name": STATEFULSET, "namespace": NS},
                 "spec": {"clusterIP": "None", "selector": {"app": STATEFULSET}}})
    objs.append({"apiVersion": "apps/v1", "kind": "StatefulSet",
                 "metadata": {"name": STATEFULSET, "namespace": NS},
                 "spec": {"replicas": 3, "serviceName": STATEFULSET,
                          "podManagementPolicy": "Parallel",
                          "selector": {"matchLabels": {"app": STATEFULSET}},
                          "template": pod_template(STATEFULSET, sleep)}})
    return objs


def job(name):
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS},
            "spec": {"completions": 3, "parallelism": 3, "backoffLimit": 6,
                     "ttlSecondsAfterFinished": 30,
                     "template": pod_template("job", ["sleep", "2"], restart="Never")}}


def waiting_to_start(pod):
    """True for a pod that is bound to a node but whose containers have not started."""
    status = pod.get("status") or {}
    if status.get("phase") != "Pending" or not (pod.get("spec") or {}).get("nodeName"):
        return False
    return not any(((c.get("state") or {}).get("running")) for c in status.get("containerStatuses") or [])


class Churn:
    """Actions every 1-4 s: scale a Deployment, delete a pod, start a Job, delete a
    StatefulSet pod. Runs until stop() is called."""

    def __init__(self, cluster, rng, ledger, max_replicas=14, backlog=12):
        self.cluster = cluster
        self.rng = rng
        self.ledger = ledger
        self.max_replicas = max_replicas
        self.backlog = backlog
        self.stopping = threading.Event()
        self.jobs = 0
        self.thread = threading.Thread(target=self.run, name="churn", daemon=True)

    def start(self):
        self.thread.start()

    def stop(self):
        self.stopping.set()
        self.thread.join()

    def run(self):
        while not self.stopping.wait(self.rng.uniform(1, 4)):
            pods = self.ledger.latest_pods()
            busy = sum(1 for p in pods if waiting_to_start(p)) >= self.backlog
            action = self.rng.choice(["scale", "scale", "delete", "job", "stateful"])
            if busy and action in ("job",):
                action = "delete"
            getattr(self, action)(pods, busy)

    def scale(self, _pods, busy):
        name = self.rng.choice(DEPLOYMENTS)
        low = 0 if busy else 2
        high = 3 if busy else self.max_replicas
        self.cluster.kubectl("-n", NS, "scale", "deployment", name,
                             f"--replicas={self.rng.randint(low, high)}")

    def delete(self, pods, _busy):
        mine = [p["metadata"]["name"] for p in pods
                if (p["metadata"].get("labels") or {}).get("app") in DEPLOYMENTS
                and not p["metadata"].get("deletionTimestamp")]
        for name in self.rng.sample(mine, min(len(mine), self.rng.randint(1, 3))):
            self.cluster.kubectl("-n", NS, "delete", "pod", name, "--wait=false")

    def job(self, _pods, _busy):
        self.jobs += 1
        self.cluster.apply(job(f"job-{self.jobs}"))

    def stateful(self, pods, _busy):
        mine = [p["metadata"]["name"] for p in pods
                if (p["metadata"].get("labels") or {}).get("app") == STATEFULSET]
        if mine:
            self.cluster.kubectl("-n", NS, "delete", "pod", self.rng.choice(mine), "--wait=false")

    def burst(self, extra=8):
        """Adds EXTRA pods to a Deployment at once (the agent kill comes during it)."""
        name = self.rng.choice(DEPLOYMENTS)
        scale = self.cluster.kubectl_json("-n", NS, "get", "deployment", name)
        replicas = ((scale or {}).get("spec") or {}).get("replicas", 3)
        self.cluster.kubectl("-n", NS, "scale", "deployment", name, f"--replicas={replicas + extra}")


class PodLedger:
    """Every pod the API server lists, sampled every few seconds: each UID seen is
    a pod created; a UID no longer listed is a pod deleted. Also the timeline of
    pods Running and creations, for the report's plot."""

    def __init__(self, cluster, period=4):
        self.cluster = cluster
        self.period = period
        self.lock = threading.Lock()
        self.seen = {}
        self.gone = set()
        self.pods = []
        self.api_up = False
        self.last_listed = None
        self.samples = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="ledger", daemon=True)

    def start(self):
        self.sample()
        self.thread.start()

    def stop(self):
        self.stopping.set()
        self.thread.join()

    def run(self):
        while not self.stopping.wait(self.period):
            self.sample()

    def sample(self):
        listed = self.cluster.kubectl_json("get", "pods", "-A", timeout=15)
        now = time.time()
        with self.lock:
            self.api_up = listed is not None
            if listed is None:
                return
            pods = listed.get("items") or []
            self.pods = pods
            self.last_listed = now
            uids = set()
            for p in pods:
                uid = p["metadata"]["uid"]
                uids.add(uid)
                if p["metadata"]["namespace"] == NS and uid not in self.seen:
                    self.seen[uid] = now
            for uid in self.seen:
                if uid not in uids:
                    self.gone.add(uid)
            running = sum(1 for p in pods if p["metadata"]["namespace"] == NS
                          and (p.get("status") or {}).get("phase") == "Running")
            self.samples.append((now, running, len(self.seen), len(self.gone)))

    def latest_pods(self):
        with self.lock:
            return list(self.pods)

    def counts(self):
        with self.lock:
            return len(self.seen), len(self.gone)

    def timeline(self):
        with self.lock:
            return list(self.samples)
