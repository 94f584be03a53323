"""The soak's hands on the cluster of scripts/cluster: kubectl as the admin (with a
deadline, never raising: the API server may be down on purpose), the script's own
commands, and what a node's processes and podnet's agent say, read from the host
so that they answer while the API server is down."""

import json
import os
import subprocess

MARKER = "/run/podnet-cluster.dir"


class Cluster:
    def __init__(self, repo, podnet_bin):
        self.script_path = os.path.join(repo, "scripts", "cluster")
        self.podnet_bin = podnet_bin
        with open(MARKER, encoding="utf-8") as f:
            self.dir = f.read().strip()
        with open(os.path.join(self.dir, "nodes-count"), encoding="utf-8") as f:
            self.nodes = [f"node-{i}" for i in range(1, int(f.read().strip()) + 1)]

    def script(self, *args, timeout=300):
        """scripts/cluster ARGS: (exit code, stdout + stderr); 124 on a timeout."""
        try:
            out = subprocess.run(["bash", self.script_path, *args], capture_output=True,
                                 text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as e:
            return 124, f"timed out after {timeout} s: {e.stdout or ''}{e.stderr or ''}"
        return out.returncode, out.stdout + out.stderr

    def kubectl(self, *args, timeout=30):
        """kubectl ARGS as the admin, with --request-timeout: (code, stdout, stderr)."""
        cmd = ["bash", self.script_path, "kubectl", f"--request-timeout={timeout}s", *args]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 15, check=False)
        except subprocess.TimeoutExpired:
            return 124, "", f"kubectl {' '.join(args)}: timed out"
        return out.returncode, out.stdout, out.stderr

    def kubectl_json(self, *args, timeout=30):
        """kubectl ARGS -o json, parsed; None when the API server did not answer."""
        code, out, _ = self.kubectl(*args, "-o", "json", timeout=timeout)
        if code != 0:
            return None
        try:
            return json.loads(out)
        except ValueError:
            return None

    def apply(self, manifest):
        code, _, err = self.kubectl_stdin(["apply", "-f", "-"], json.dumps(manifest))
        return code == 0, err

    def kubectl_stdin(self, args, text, timeout=30):
        cmd = ["bash", self.script_path, "kubectl", f"--request-timeout={timeout}s", *args]
        try:
            out = subprocess.run(cmd, input=text, capture_output=True, text=True,
                                 timeout=timeout + 15, check=False)
        except subprocess.TimeoutExpired:
            return 124, "", "timed out"
        return out.returncode, out.stdout, out.stderr

    def supervise(self):
        """What a real control plane's supervisor does for the components no
        fault stops: starts kube-scheduler and kube-controller-manager again when
        they exited (the scheduler exits when it finds its cache corrupted).
        Returns the names it started."""
        _, out = self.script("status", timeout=30)
        started = []
        for name in ("kube-scheduler", "kube-controller-manager"):
            if any(l.split()[:2] == ["cp", name] and "not running" in l for l in out.splitlines()):
                c, _ = self.script("cp-start", name, timeout=60)
                if c == 0:
                    started.append(name)
        return started

    def node_is_on(self, node):
        return os.path.exists(f"/run/netns/pnc-{node}")

    def run_podnet_dir(self, node):
        """The node's /run/podnet (a tmpfs), as the host sees it."""
        return os.path.join(self.dir, "nodes", node, "fs", "run", "podnet")

    def node_pids(self, node):
        """Every process of the node (its components and pods), from its cgroups."""
        root = f"/sys/fs/cgroup/pids/podnet-cluster/{node}"
        pids = set()
        for dirpath, _, files in os.walk(root):
            if "cgroup.procs" in files:
                try:
                    with open(os.path.join(dirpath, "cgroup.procs"), encoding="utf-8") as f:
                        pids.update(int(p) for p in f.read().split())
                except OSError:
                    pass
        return sorted(pids)

    def pod_runs(self, node, uid):
        """Whether a process of pod UID runs on NODE, from the kubelet's pod cgroup
        (cgroupfs: .../podnet-cluster/NODE/kubepods/<qos>/pod<UID>/): the node's
        own truth, independent of the API server, whose status of a pod can lag
        (a pod the kubelet tore down while the API server was down stays Running
        there until the kubelet can write again)."""
        return pod_cgroup_has_processes(f"/sys/fs/cgroup/pids/podnet-cluster/{node}", uid)

    def node_process(self, node, *argv_prefix):
        """PIDs of the node's processes whose argv starts with ARGV_PREFIX."""
        found = []
        for pid in self.node_pids(node):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            except OSError:
                continue
            if argv[:len(argv_prefix)] == list(argv_prefix):
                found.append(pid)
        return found

    def agent_status(self, node, timeout=10):
        """The node's agent's `podnet status -o json` over its socket, or None."""
        sock = os.path.join(self.run_podnet_dir(node), "podnet.sock")
        if not os.path.exists(sock):
            return None
        try:
            out = subprocess.run([self.podnet_bin, "status", "-o", "json", "--socket", sock],
                                 capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return None
        if out.returncode != 0:
            return None
        try:
            return json.loads(out.stdout)
        except ValueError:
            return None

    def allocations(self, node):
        """The agent's allocations on NODE: address -> owner; None if it did not answer."""
        status = self.agent_status(node)
        if status is None:
            return None
        allocs = ((status.get("status") or {}).get("ipam") or {}).get("allocations") or {}
        return dict(allocs)

    def ipam_check(self):
        """`podnet ipam check` as the admin, in the control plane: (exit code, report)."""
        kubeconfig = os.path.join(self.dir, "pki", "admin.kubeconfig")
        return self.script("exec", "cp", self.podnet_bin, "ipam", "check", "--kubeconfig",
                           kubeconfig, timeout=120)

    def ping_from(self, pid, addresses, wait=2):
        """Pings each address once from the network namespace of process PID (a
        prober pod on some node), all in parallel: {address: True if it answered}."""
        if not addresses:
            return {}
        script = ("for ip in \"$@\"; do (ping -c 1 -W %d -q \"$ip\" > /dev/null 2>&1 "
                  "&& echo \"$ip ok\" || echo \"$ip lost\") & done; wait") % wait
        try:
            out = subprocess.run(["nsenter", "-t", str(pid), "-n", "sh", "-c", script, "ping",
                                  *addresses], capture_output=True, text=True,
                                 timeout=wait + 20, check=False)
        except subprocess.TimeoutExpired:
            return {a: False for a in addresses}
        seen = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
        return {a: seen.get(a) == "ok" for a in addresses}


def pod_cgroup_has_processes(root, uid):
    """True when a cgroup named pod<UID> under ROOT, or one below it, lists a
    process in its cgroup.procs."""
    want = f"pod{uid}"
    for dirpath, dirnames, _ in os.walk(root):
        if os.path.basename(dirpath) == want:
            for sub, _, files in os.walk(dirpath):
                if "cgroup.procs" not in files:
                    continue
                try:
                    with open(os.path.join(sub, "cgroup.procs"), encoding="utf-8") as f:
                        if f.read().split():
                            return True
                except OSError:
                    pass
            return False
        # Not below another pod's cgroup.
        dirnames[:] = [d for d in dirnames if not d.startswith("pod") or d == want]
    return False
