#!/usr/bin/env python3
"""podnet end-to-end benchmark driver (run by scripts/bench, as root).

Three modes:

  compare    run INSIDE the node namespace (`ip netns exec <node> python3 ...`):
             starts the podnet daemon there, then times ADD and DEL of podnet,
             ptp + host-local, bridge + host-local and the "kernel floor"
             (`ip -batch`) on the same pre-made sandboxes, serially and in
             parallel batches. Every plugin is a plain posix_spawn from this
             process (no `ip netns exec` per call). Checks, untimed, that no
             address was handed out twice and that DEL left nothing behind.
  resources  run inside a second node namespace: daemon RSS idle and with a
             full /16 node range allocated through the API, restore time.
  report     merges the JSON of the two modes (and criterion estimates, if any)
             into one results file and a markdown table.

Python 3 standard library only. No timed assertions: a failed check is recorded
and makes the exit status non-zero; times are only reported.
"""

import argparse
import ctypes
import datetime
import json
import os
import platform
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

CLONE_NEWNET = 0x40000000
LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
IP = "/usr/sbin/ip" if os.path.exists("/usr/sbin/ip") else "/sbin/ip"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# --------------------------------------------------------------------------- utils


def log(msg):
    print(f"   {msg}", flush=True)


def setns(fd):
    """Moves the calling thread (only) into the network namespace `fd`."""
    if LIBC.setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"setns: {os.strerror(e)}")


def pct(values, p):
    """Percentile with linear interpolation (numpy's default)."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def stats(ms):
    if not ms:
        return None
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 3),
        "p90_ms": round(pct(ms, 90), 3),
        "p99_ms": round(pct(ms, 99), 3),
        "max_ms": round(max(ms), 3),
        "min_ms": round(min(ms), 3),
        "mean_ms": round(sum(ms) / len(ms), 3),
    }


def read_all(fd):
    chunks = []
    while True:
        b = os.read(fd, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    return b"".join(chunks)


class Call:
    __slots__ = ("ok", "ms", "cpu_ms", "maxrss_kb", "out", "err", "ip")

    def __init__(self, ok, ms, cpu_ms, maxrss_kb, out=b"", err=b""):
        self.ok = ok
        self.ms = ms
        self.cpu_ms = cpu_ms
        self.maxrss_kb = maxrss_kb
        self.out = out
        self.err = err
        self.ip = None


def spawn(argv, env, stdin=b"", netns_fd=None, home_fd=None):
    """posix_spawn + wait4: (rc, stdout, stderr, seconds, cpu seconds, maxrss KB).

    With `netns_fd`, the calling thread enters that namespace just for the spawn
    (the child inherits it), then returns to `home_fd`. Pipes are O_CLOEXEC
    (PEP 446), so concurrent spawns from other threads do not inherit them."""
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    t0 = time.perf_counter()
    if netns_fd is not None:
        setns(netns_fd)
    pid = None
    try:
        pid = os.posix_spawn(
            argv[0],
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, r_in, 0),
                (os.POSIX_SPAWN_DUP2, w_out, 1),
                (os.POSIX_SPAWN_DUP2, w_err, 2),
            ],
        )
    finally:
        if netns_fd is not None:
            setns(home_fd)
        os.close(r_in)
        os.close(w_out)
        os.close(w_err)
        if pid is None:
            for fd in (w_in, r_out, r_err):
                os.close(fd)
    try:
        if stdin:
            os.write(w_in, stdin)
    except BrokenPipeError:
        pass
    os.close(w_in)
    out = read_all(r_out)
    err = read_all(r_err)
    _, status, ru = os.wait4(pid, 0)
    secs = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    return rc, out, err, secs, ru.ru_utime + ru.ru_stime, ru.ru_maxrss


# --------------------------------------------------------------------------- API


def http(sock_path, method, path, headers=(), body=b"", timeout=60):
    """One HTTP/1.1 request over a unix socket (Connection: close, as the plugin)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock_path)
        head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
        for k, v in headers:
            head += f"{k}: {v}\r\n"
        s.sendall(head.encode() + b"\r\n" + body)
        chunks = []
        while True:
            b = s.recv(1 << 20)
            if not b:
                break
            chunks.append(b)
    finally:
        s.close()
    data = b"".join(chunks)
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(b":")
        hdrs[k.strip().lower()] = v.strip().lower()
    if hdrs.get(b"transfer-encoding") == b"chunked":
        body_out, pos = [], 0
        while True:
            eol = rest.index(b"\r\n", pos)
            size = int(rest[pos:eol].split(b";")[0], 16)
            if size == 0:
                break
            body_out.append(rest[eol + 2 : eol + 2 + size])
            pos = eol + 2 + size + 2
        rest = b"".join(body_out)
    return status, rest


def healthz(sock):
    st, body = http(sock, "GET", "/v1/healthz")
    if st != 200:
        raise RuntimeError(f"healthz answered {st}: {body[:200]!r}")
    return json.loads(body)


def phase_sums(sock):
    """{(verb, phase): (sum_s, count)} from the daemon's cni_phase_duration_seconds
    histogram (GET /metrics), or {} when the daemon has none."""
    try:
        st, body = http(sock, "GET", "/metrics")
    except OSError:
        return {}
    if st != 200:
        return {}
    out = {}
    for ln in body.decode(errors="replace").splitlines():
        if ln.startswith("#") or "cni_phase_duration_seconds_" not in ln:
            continue
        name, _, rest = ln.partition("{")
        labels, _, value = rest.rpartition("}")
        kind = name.rsplit("_", 1)[1]
        if kind not in ("sum", "count"):
            continue
        lab = dict(
            (k.strip(), v.strip().strip('"'))
            for k, _, v in (part.partition("=") for part in labels.split(","))
            if k
        )
        key = (lab.get("verb", ""), lab.get("phase", ""))
        cur = out.setdefault(key, [0.0, 0])
        if kind == "sum":
            cur[0] = float(value.split()[0])
        else:
            cur[1] = int(float(value.split()[0]))
    return out


def phase_means(before, after):
    """Mean ms per (verb, phase) between two phase_sums() snapshots."""
    out = {}
    for key, (s1, c1) in after.items():
        s0, c0 = before.get(key, (0.0, 0))
        if c1 > c0:
            out[f"{key[0]} {key[1]}"] = round((s1 - s0) * 1000 / (c1 - c0), 3)
    return out


def proc_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            k, _, v = ln.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads"):
                out[k] = int(v.split()[0])
    return out


def proc_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); utime is field 14, stime field 15.
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


class Daemon:
    """The podnet daemon, spawned by this process in its current namespace."""

    def __init__(self, binary, workdir, args, pidfile):
        self.binary = binary
        self.workdir = workdir
        self.sock = os.path.join(workdir, "run", "podnet.sock")
        self.state = os.path.join(workdir, "state")
        self.args = args
        self.pidfile = pidfile
        self.pid = None
        os.makedirs(os.path.dirname(self.sock), exist_ok=True)

    def start(self, timeout=60):
        logf = os.open(
            os.path.join(self.workdir, "daemon.log"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o600,
        )
        devnull = os.open("/dev/null", os.O_RDWR)
        argv = [self.binary, "daemon", "--socket", self.sock, "--state-dir", self.state]
        argv += self.args
        env = {"PATH": BASE_PATH, "NO_COLOR": "1"}
        t0 = time.perf_counter()
        # Its own session: a Ctrl-C of the run reaches the driver, which then stops
        # the daemon itself (and scripts/bench kills it by PID if the driver cannot).
        self.pid = os.posix_spawn(
            argv[0],
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull, 0),
                (os.POSIX_SPAWN_DUP2, devnull, 1),
                (os.POSIX_SPAWN_DUP2, logf, 2),
            ],
            setsid=True,
        )
        os.close(logf)
        os.close(devnull)
        with open(self.pidfile, "a") as f:
            f.write(f"{self.pid}\n")
        deadline = time.time() + timeout
        while time.time() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = None
                raise RuntimeError(f"daemon exited ({status}); log:\n{self.log_tail()}")
            try:
                healthz(self.sock)
                return time.perf_counter() - t0
            except (OSError, RuntimeError, ValueError):
                time.sleep(0.01)
        raise RuntimeError(f"daemon not ready after {timeout} s; log:\n{self.log_tail()}")

    def stop(self):
        if self.pid is None:
            return
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.time() + 10
        while time.time() < deadline:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = None
                return
            time.sleep(0.02)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        self.pid = None

    def log_tail(self, n=30):
        try:
            with open(os.path.join(self.workdir, "daemon.log"), errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


def bench_daemon(a, workdir, cidr, mask, node):
    """A podnet daemon whose node range is `cidr` cut into /`mask` (IPv4 only, no
    release cooldown), its state under a.state_base/workdir."""
    return Daemon(
        a.podnet,
        os.path.join(a.state_base, workdir),
        [
            "--cluster-pool-ipv4-cidr", cidr,
            "--cluster-pool-ipv4-mask-size", str(mask),
            "--ipam-release-cooldown", "0s",
            "--k8s-node-name", node,
        ],
        a.pidfile,
    )


# --------------------------------------------------------------------------- contenders


def first_ipv4(result_json):
    for ip in result_json.get("ips", []):
        addr = ip.get("address", "").split("/")[0]
        if addr and ":" not in addr:
            return addr
    return None


TIME = "/usr/bin/time"


class Wrapped:
    """Optional `/usr/bin/time -f %M` around every exec (the RSS probe only: GNU
    time is small, so its child's peak RSS is the plugin's; posix_spawn's own
    ru_maxrss would count this Python process, whose memory the vfork child
    shares until exec)."""

    rss_dir = None
    rss_files = None

    def wrap(self, argv):
        if not self.rss_dir:
            return argv
        path = os.path.join(self.rss_dir, f"rss-{len(self.rss_files)}")
        self.rss_files.append(path)
        return [TIME, "-f", "%M", "-o", path] + argv

    def peak_rss_kb(self):
        peak = 0
        for path in self.rss_files:
            with open(path) as f:
                peak = max(peak, int(f.read().split()[-1]))
            os.unlink(path)
        self.rss_files = []
        return peak


class CniPlugin(Wrapped):
    """A CNI plugin exec'd directly with CNI_* variables."""

    def __init__(self, name, binary, conf, cni_path, sandboxes):
        self.name = name
        self.binary = binary
        self.conf = json.dumps(conf).encode()
        self.cni_path = cni_path
        self.sandboxes = sandboxes
        self.round = 0

    def cid(self, i):
        return f"bench-{self.name}-r{self.round}-{i}"

    def env(self, cmd, i):
        sb = self.sandboxes[i]
        return self.env_for(cmd, self.cid(i), f"/run/netns/{sb}", sb)

    def env_for(self, cmd, cid, netns, pod):
        return {
            "PATH": BASE_PATH,
            "CNI_COMMAND": cmd,
            "CNI_CONTAINERID": cid,
            "CNI_NETNS": netns,
            "CNI_IFNAME": "eth0",
            "CNI_PATH": self.cni_path,
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={pod}",
        }

    def call(self, cmd, i):
        return self.call_env(cmd, self.env(cmd, i))

    def call_env(self, cmd, env):
        rc, out, err, secs, cpu, rss = spawn(self.wrap([self.binary]), env, self.conf)
        c = Call(rc == 0, secs * 1000, cpu * 1000, rss, out, err)
        if c.ok and cmd == "ADD":
            try:
                c.ip = first_ipv4(json.loads(out))
            except ValueError:
                c.ok = False
            if not c.ip:
                c.ok = False
        return c

    def add(self, i):
        return self.call("ADD", i)

    def delete(self, i):
        return self.call("DEL", i)


def podnet_plugin(binary, sock, sandboxes):
    return CniPlugin(
        "podnet",
        binary,
        {"cniVersion": "1.0.0", "name": "bench-podnet", "type": "podnet", "socket-path": sock},
        os.path.dirname(binary),
        sandboxes,
    )


def ptp_plugin(cni_dir, name, subnet, data_dir, sandboxes):
    """ptp + host-local: ipMasq off, one range, a default route."""
    return CniPlugin(
        "ptp",
        os.path.join(cni_dir, "ptp"),
        {
            "cniVersion": "1.0.0",
            "name": name,
            "type": "ptp",
            "ipMasq": False,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": subnet}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": data_dir,
            },
        },
        cni_dir,
        sandboxes,
    )


class KernelFloor(Wrapped):
    """The same kernel work with `ip -batch`: one process in the node namespace
    (veth with its peer created in the pod netns, host side up, /32 route), one in
    the pod namespace (lo and eth0 up, /32 address, link route to the router,
    default route). The pod-side process is spawned from a thread that entered the
    pod netns with setns(2) just for the spawn: a plain exec, no `ip -n` (which
    also unshares a mount namespace and remounts /sys). DEL is one `ip -batch`
    process deleting the host end (the pair goes with it)."""

    name = "floor"

    def __init__(self, sandboxes, node_fd, base="10.96.0.0", router="10.96.0.1"):
        self.sandboxes = sandboxes
        self.node_fd = node_fd
        a = [int(x) for x in base.split(".")]
        self.base = (a[0] << 24) | (a[1] << 16) | (a[2] << 8) | a[3]
        self.router = router
        self.round = 0
        self.env = {"PATH": BASE_PATH}

    def ip_of(self, i):
        v = self.base + 2 + i
        return f"{v >> 24 & 255}.{v >> 16 & 255}.{v >> 8 & 255}.{v & 255}"

    def host(self, i):
        return f"flr{i}"

    def add(self, i):
        sb, ip, host = self.sandboxes[i], self.ip_of(i), self.host(i)
        node_cmds = (
            f"link add {host} type veth peer name eth0 netns {sb}\n"
            f"link set {host} up\n"
            f"route add {ip}/32 dev {host} scope link\n"
        ).encode()
        pod_cmds = (
            "link set lo up\n"
            "link set eth0 up\n"
            f"addr add {ip}/32 dev eth0\n"
            f"route add {self.router}/32 dev eth0 scope link\n"
            f"route add default via {self.router} dev eth0\n"
        ).encode()
        argv = [IP, "-batch", "-"]
        t0 = time.perf_counter()
        rc1, o1, e1, _, cpu1, rss1 = spawn(self.wrap(argv), self.env, node_cmds)
        rc2, o2, e2, cpu2, rss2 = 1, b"", b"", 0.0, 0
        if rc1 == 0:
            fd = os.open(f"/run/netns/{sb}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                rc2, o2, e2, _, cpu2, rss2 = spawn(self.wrap(argv), self.env, pod_cmds, fd, self.node_fd)
            finally:
                os.close(fd)
        secs = time.perf_counter() - t0
        c = Call(rc1 == 0 and rc2 == 0, secs * 1000, (cpu1 + cpu2) * 1000, max(rss1, rss2), o1 + o2, e1 + e2)
        c.ip = ip
        return c

    def delete(self, i):
        rc, out, err, secs, cpu, rss = spawn(
            self.wrap([IP, "-batch", "-"]), self.env, f"link del {self.host(i)}\n".encode()
        )
        return Call(rc == 0, secs * 1000, cpu * 1000, rss, out, err)


# --------------------------------------------------------------------------- checks


def node_veths():
    rc, out, err, *_ = spawn([IP, "-o", "link", "show", "type", "veth"], {"PATH": BASE_PATH})
    names = set()
    for ln in out.decode().splitlines():
        parts = ln.split(": ")
        if len(parts) > 1:
            names.add(parts[1].split("@")[0])
    return names


def sandbox_links(sandboxes):
    """Interface names in each sandbox, read from a helper thread that setns(2)s into
    each one (the main thread and the spawning threads stay where they are)."""
    result = {}

    def work():
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            for sb in sandboxes:
                fd = os.open(f"/run/netns/{sb}", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    setns(fd)
                    result[sb] = sorted(n for _, n in socket.if_nameindex())
                finally:
                    setns(home)
                    os.close(fd)
        finally:
            os.close(home)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    return result


def hostlocal_leftovers(data_dir):
    """host-local's files that name an address (not `lock`, not `last_reserved_ip.*`)."""
    left = []
    for root, _, files in os.walk(data_dir):
        for f in files:
            if f == "lock" or f.startswith("last_reserved_ip"):
                continue
            left.append(os.path.join(os.path.relpath(root, data_dir), f))
    return sorted(left)


class Checks:
    def __init__(self):
        self.items = []

    def record(self, what, ok, detail=""):
        self.items.append({"check": what, "ok": bool(ok), "detail": detail})
        if not ok:
            log(f"CHECK FAILED: {what}: {detail}")

    @property
    def failed(self):
        return [c for c in self.items if not c["ok"]]


# --------------------------------------------------------------------------- compare


def run_round(contender, n, workers, label, ctx):
    """ADD n sandboxes then DEL them, with `workers` at once; checks after each half."""
    checks, baseline_veths = ctx["checks"], ctx["baseline_veths"]
    sbs = ctx["sandboxes"][:n]
    contender.round += 1
    tag = f"{label}/{contender.name}"

    def many(fn):
        t0 = time.perf_counter()
        if workers == 1:
            calls = [fn(i) for i in range(n)]
        else:
            with ThreadPoolExecutor(max_workers=workers) as ex:
                calls = list(ex.map(fn, range(n)))
        return calls, time.perf_counter() - t0

    is_podnet = contender.name == "podnet"
    cpu0 = proc_cpu_s(ctx["daemon"].pid) if is_podnet else None
    ph0 = phase_sums(ctx["daemon"].sock) if is_podnet else {}
    adds, add_wall = many(contender.add)
    cpu1 = proc_cpu_s(ctx["daemon"].pid) if contender.name == "podnet" else None

    # --- after ADD: every call succeeded, no address twice, the links exist.
    failed = [(i, c.out.decode(errors="replace")[:300]) for i, c in enumerate(adds) if not c.ok]
    checks.record(f"{tag}: every ADD succeeded", not failed, str(failed[:3]))
    ips = [c.ip for c in adds if c.ip]
    dups = sorted({ip for ip in ips if ips.count(ip) > 1})
    checks.record(f"{tag}: no address handed out twice ({len(ips)} addresses)", not dups, str(dups[:5]))
    new_veths = node_veths() - baseline_veths
    checks.record(
        f"{tag}: {n} host-side veths after ADD", len(new_veths) == n, f"found {len(new_veths)}"
    )
    links = sandbox_links(sbs)
    missing = [sb for sb in sbs if "eth0" not in links.get(sb, [])]
    checks.record(f"{tag}: eth0 in every sandbox after ADD", not missing, str(missing[:3]))
    if contender.name == "podnet":
        allocs = healthz(ctx["daemon"].sock)["ipam"]["allocations"]
        extra = set(allocs) - set(ctx["podnet_baseline_allocs"])
        checks.record(
            f"{tag}: daemon holds exactly the {n} pod addresses",
            extra == set(ips),
            f"daemon {len(extra)}, results {len(set(ips))}",
        )

    dels, del_wall = many(contender.delete)
    t_del_end = time.perf_counter()

    # --- settle: a plugin may answer DEL before the kernel objects are gone (podnet
    # hands the link teardown to its daemon). Poll, untimed for the calls, until
    # the node looks as before ADD, and report how long that took after the last
    # DEL returned; the checks below then see the settled state.
    hl_dir = ctx["hostlocal_dirs"].get(contender.name)

    def settled():
        if node_veths() - baseline_veths:
            return False
        if any(l != ["lo"] for l in sandbox_links(sbs).values()):
            return False
        if is_podnet:
            allocs = healthz(ctx["daemon"].sock)["ipam"]["allocations"]
            if set(allocs) - set(ctx["podnet_baseline_allocs"]):
                return False
        if hl_dir and hostlocal_leftovers(hl_dir):
            return False
        return True

    settle_s = None
    deadline = t_del_end + 60
    while time.perf_counter() < deadline:
        if settled():
            settle_s = time.perf_counter() - t_del_end
            break
        time.sleep(0.01)
    cpu2 = proc_cpu_s(ctx["daemon"].pid) if is_podnet else None
    ph1 = phase_sums(ctx["daemon"].sock) if is_podnet else {}

    # --- after DEL: nothing left anywhere.
    failed = [(i, c.out.decode(errors="replace")[:300]) for i, c in enumerate(dels) if not c.ok]
    checks.record(f"{tag}: every DEL succeeded", not failed, str(failed[:3]))
    checks.record(f"{tag}: the node settled within 60 s of the last DEL", settle_s is not None, "")
    left = node_veths() - baseline_veths
    checks.record(f"{tag}: no veth left in the node netns after DEL", not left, str(sorted(left)[:5]))
    links = sandbox_links(sbs)
    dirty = {sb: l for sb, l in links.items() if l != ["lo"]}
    checks.record(f"{tag}: sandboxes hold only lo after DEL", not dirty, str(list(dirty.items())[:3]))
    if contender.name == "podnet":
        allocs = healthz(ctx["daemon"].sock)["ipam"]["allocations"]
        extra = {k: v for k, v in allocs.items() if k not in ctx["podnet_baseline_allocs"]}
        checks.record(
            f"{tag}: podnet status shows no pod allocations after DEL", not extra, str(list(extra.items())[:5])
        )
    if hl_dir:
        left = hostlocal_leftovers(hl_dir)
        checks.record(f"{tag}: host-local state dir holds no address after DEL", not left, str(left[:5]))

    out = {
        "n": n,
        "workers": workers,
        "add": stats([c.ms for c in adds if c.ok]),
        "del": stats([c.ms for c in dels if c.ok]),
        "add_wall_s": round(add_wall, 4),
        "del_wall_s": round(del_wall, 4),
        "add_per_s": round(n / add_wall, 1),
        "del_per_s": round(n / del_wall, 1),
        # From the last DEL's return until no link, address or state file is left
        # (the first look itself takes a few ms: it lists links in every sandbox).
        "del_settle_s": None if settle_s is None else round(settle_s, 4),
        "add_cpu_ms_mean": round(sum(c.cpu_ms for c in adds) / n, 3),
        "del_cpu_ms_mean": round(sum(c.cpu_ms for c in dels) / n, 3),
        "add_ms": [round(c.ms, 3) for c in adds],
        "del_ms": [round(c.ms, 3) for c in dels],
    }
    if cpu0 is not None:
        out["daemon_cpu_ms_per_add"] = round((cpu1 - cpu0) * 1000 / n, 3)
        out["daemon_cpu_ms_per_del"] = round((cpu2 - cpu1) * 1000 / n, 3)
        out["phase_mean_ms"] = phase_means(ph0, ph1)
    a, d = out["add"], out["del"]
    log(
        f"{tag:<24} ADD p50 {a['p50_ms'] if a else '-':>7} ms p99 {a['p99_ms'] if a else '-':>7}"
        f" | DEL p50 {d['p50_ms'] if d else '-':>7} ms p99 {d['p99_ms'] if d else '-':>7}"
        f" | walls {add_wall:.2f} s / {del_wall:.2f} s"
        f" | settled {settle_s if settle_s is None else round(settle_s, 3)} s after"
    )
    return out


def rss_probe(contender, n, rss_dir, checks):
    """Peak RSS (KB, median of n) of one ADD and one DEL under /usr/bin/time."""
    contender.rss_dir, contender.rss_files = rss_dir, []
    contender.round += 1
    adds, dels = [], []
    try:
        for i in range(n):
            c = contender.add(i)
            checks.record(f"rss/{contender.name}: ADD under time", c.ok, c.out.decode(errors="replace")[:200])
            adds.append(contender.peak_rss_kb())
            c = contender.delete(i)
            checks.record(f"rss/{contender.name}: DEL under time", c.ok, c.out.decode(errors="replace")[:200])
            dels.append(contender.peak_rss_kb())
    finally:
        contender.rss_dir = None
    return {"add_peak_rss_kb_p50": pct(adds, 50), "del_peak_rss_kb_p50": pct(dels, 50)}


def compare(a):
    if os.geteuid() != 0:
        sys.exit("cni_compare: needs root")
    sandboxes = [f"{a.sandbox_prefix}{i}" for i in range(a.sandboxes)]
    for sb in sandboxes:
        if not os.path.exists(f"/run/netns/{sb}"):
            sys.exit(f"cni_compare: sandbox /run/netns/{sb} does not exist")
    node_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    checks = Checks()
    load_start = [round(x, 2) for x in os.getloadavg()]
    os.makedirs(a.workdir, exist_ok=True)

    daemon = bench_daemon(a, "podnet", "10.99.0.0/16", 20, "bench-node")
    log(f"starting the daemon ({a.podnet}), state in {daemon.state}")
    ready_s = daemon.start()
    try:
        baseline_allocs = healthz(daemon.sock)["ipam"]["allocations"]
        log(f"daemon pid {daemon.pid} ready in {ready_s * 1000:.0f} ms; infra addresses: {sorted(baseline_allocs)}")
        hl = {
            "ptp": os.path.join(a.state_base, "host-local-ptp"),
            "bridge": os.path.join(a.state_base, "host-local-bridge"),
        }
        podnet = podnet_plugin(a.podnet, daemon.sock, sandboxes)
        ptp = ptp_plugin(a.cni_dir, "bench-ptp", "10.98.0.0/20", hl["ptp"], sandboxes)
        bridge = CniPlugin(
            "bridge",
            os.path.join(a.cni_dir, "bridge"),
            {
                "cniVersion": "1.0.0",
                "name": "bench-bridge",
                "type": "bridge",
                "bridge": "pbbench0",
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.97.0.0/20"}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": hl["bridge"],
                },
            },
            a.cni_dir,
            sandboxes,
        )
        floor = KernelFloor(sandboxes, node_fd)
        contenders = [floor, podnet, ptp, bridge]

        # Driver overhead: posix_spawn + pipes + wait4 of /bin/true, same env size.
        null = []
        for i in range(100):
            rc, *_rest = spawn(["/bin/true"], podnet.env("ADD", 0), podnet.conf)
            null.append(_rest[2] * 1000)
        log(f"driver overhead (spawn /bin/true): p50 {pct(null, 50):.3f} ms")

        ctx = {
            "checks": checks,
            "baseline_veths": node_veths(),
            "sandboxes": sandboxes,
            "daemon": daemon,
            "podnet_baseline_allocs": baseline_allocs,
            "hostlocal_dirs": hl,
        }
        # Warm-up: one ADD+DEL each (page cache, the bridge device), untimed.
        for c in contenders:
            run_round(c, 2, 1, "warmup", ctx)

        results = {"serial": {}, "batch": {}}
        phases = [("serial", a.serial, 1)] + [(f"batch{w}", a.batch, w) for w in a.parallel]
        for k, (label, n, workers) in enumerate(phases):
            log(f"--- {label}: {n} sandboxes, {workers} at a time")
            order = contenders[k % len(contenders):] + contenders[: k % len(contenders)]
            for c in order:
                r = run_round(c, n, workers, label, ctx)
                if workers == 1:
                    results["serial"][c.name] = r
                else:
                    results["batch"].setdefault(str(workers), {})[c.name] = r

        peak_rss = {}
        if os.access(TIME, os.X_OK):
            for c in contenders:
                peak_rss[c.name] = rss_probe(c, 5, a.workdir, checks)
            log("peak RSS (KB, ADD/DEL): " + ", ".join(
                f"{k} {v['add_peak_rss_kb_p50']:.0f}/{v['del_peak_rss_kb_p50']:.0f}" for k, v in peak_rss.items()))
        else:
            log(f"{TIME} is missing: no peak RSS figures")

        # The bridge device is shared state of the bridge plugin; remove it (untimed).
        spawn([IP, "link", "del", "pbbench0"], {"PATH": BASE_PATH})
        left = node_veths() - ctx["baseline_veths"]
        checks.record("end: no veth left in the node netns", not left, str(sorted(left)))
        podnet_rss = proc_status(daemon.pid)
    finally:
        daemon.stop()

    sizes = {}
    for name, path in [
        ("podnet", a.podnet),
        ("ptp", os.path.join(a.cni_dir, "ptp")),
        ("bridge", os.path.join(a.cni_dir, "bridge")),
        ("host-local", os.path.join(a.cni_dir, "host-local")),
    ]:
        try:
            sizes[name] = os.stat(path).st_size
        except OSError:
            pass
    out = {
        "mode": "compare",
        "settings": {
            "cniVersion": "1.0.0",
            "family": "IPv4 only (podnet daemon without --enable-ipv6, host-local with one IPv4 range)",
            "podnet_daemon": daemon.args,
            "podnet_state_dir": daemon.state,
            "hostlocal_data_dirs": hl,
            "ptp": "ipMasq false, host-local 10.98.0.0/20",
            "bridge": "pbbench0, isGateway true, ipMasq false, host-local 10.97.0.0/20",
            "floor": KernelFloor.__doc__.split("\n\n")[0].replace("\n", " "),
            "serial_n": a.serial,
            "batch_n": a.batch,
            "parallel": a.parallel,
            "exec": "posix_spawn from a Python driver running inside the node netns (ip netns exec once)",
        },
        "loadavg_start_end": [load_start, [round(x, 2) for x in os.getloadavg()]],
        "driver_overhead_ms_p50": round(pct(null, 50), 3),
        "daemon_ready_ms": round(ready_s * 1000, 1),
        "daemon_after_compare": podnet_rss,
        "binary_sizes": sizes,
        "peak_rss_kb": peak_rss,
        "results": results,
        "checks": checks.items,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    log(f"{len(checks.items)} checks, {len(checks.failed)} failed")
    return 1 if checks.failed else 0


# --------------------------------------------------------------------------- resources


def time_status(binary, sock, n=5):
    """CNI STATUS exec'd n times (cniVersion 1.1.0): median ms and the exit code."""
    conf = json.dumps({"cniVersion": "1.1.0", "name": "bench", "type": "podnet", "socket-path": sock}).encode()
    env = {"PATH": BASE_PATH, "CNI_COMMAND": "STATUS"}
    ms, rc = [], None
    for _ in range(n):
        rc, out, err, secs, cpu, rss = spawn([binary], env, conf)
        ms.append(secs * 1000)
    return {"p50_ms": round(pct(ms, 50), 3), "exit": rc}


def resources(a):
    checks = Checks()
    daemon = bench_daemon(a, "podnet-rss", "10.100.0.0/16", 16, "bench-rss")
    out = {"mode": "resources", "node_range": "10.100.0.0/16 (mask size 16)"}
    ready = daemon.start()
    try:
        out["start_ms"] = round(ready * 1000, 1)
        time.sleep(1.0)
        out["idle"] = proc_status(daemon.pid)
        base = len(healthz(daemon.sock)["ipam"]["allocations"])
        log(f"daemon idle: VmRSS {out['idle']['VmRSS']} kB ({base} infra addresses)")

        out["cni_status_idle"] = time_status(a.podnet, daemon.sock)
        target = a.allocations
        lock = threading.Lock()
        counter = {"next": 0, "ok": 0, "full": 0, "err": []}

        def worker():
            while True:
                with lock:
                    k = counter["next"]
                    counter["next"] += 1
                if k >= target:
                    return
                st, body = http(
                    daemon.sock,
                    "POST",
                    f"/v1/ipam?family=ipv4&owner=bench%2Fpod-{k}",
                    headers=[("expiration", "false")],
                )
                with lock:
                    if st == 201:
                        counter["ok"] += 1
                    elif st == 502:
                        counter["full"] += 1
                        counter["next"] = target
                    else:
                        counter["err"].append((st, body[:200].decode(errors="replace")))
                        counter["next"] = target

        log(f"allocating up to {target} addresses through POST /v1/ipam ({a.rss_workers} clients)")
        t0 = time.perf_counter()
        cpu0 = proc_cpu_s(daemon.pid)
        threads = [threading.Thread(target=worker) for _ in range(a.rss_workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        cpu = proc_cpu_s(daemon.pid) - cpu0
        n = counter["ok"]
        out["allocated"] = n
        out["range_full"] = counter["full"] > 0
        out["allocate_wall_s"] = round(wall, 2)
        out["allocate_per_s"] = round(n / wall, 1)
        out["daemon_cpu_ms_per_allocate"] = round(cpu * 1000 / max(n, 1), 3)
        checks.record("resources: no unexpected API error", not counter["err"], str(counter["err"][:3]))
        time.sleep(1.0)
        out["full"] = proc_status(daemon.pid)
        log(f"{n} allocated in {wall:.1f} s; VmRSS {out['full']['VmRSS']} kB (HWM {out['full']['VmHWM']} kB)")

        t0 = time.perf_counter()
        st, body = http(daemon.sock, "GET", "/v1/healthz")
        out["healthz_ms_full"] = round((time.perf_counter() - t0) * 1000, 2)
        out["healthz_bytes_full"] = len(body)
        h = json.loads(body)
        out["cni_status_full"] = time_status(a.podnet, daemon.sock)
        got = len(h["ipam"]["allocations"]) - base
        checks.record(f"resources: daemon reports the {n} allocations", got == n, f"reports {got}")
        addrs = [k for k in h["ipam"]["allocations"]]
        checks.record("resources: no address twice", len(addrs) == len(set(addrs)), "")

        daemon.stop()
        ready = daemon.start(timeout=300)
        out["restart_with_allocations_ms"] = round(ready * 1000, 1)
        time.sleep(1.0)
        out["after_restore"] = proc_status(daemon.pid)
        got = len(healthz(daemon.sock)["ipam"]["allocations"]) - base
        checks.record(f"resources: restart restores the {n} allocations", got == n, f"restored {got}")
        log(
            f"restart with {n} allocations: ready in {ready * 1000:.0f} ms; VmRSS {out['after_restore']['VmRSS']} kB"
        )
        try:
            out["journal_bytes"] = os.stat(os.path.join(daemon.state, "journal.redb")).st_size
        except OSError:
            pass
    finally:
        daemon.stop()
    out["checks"] = checks.items
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    return 1 if checks.failed else 0


# --------------------------------------------------------------------------- fill


class NetnsHolder:
    """Sandboxes for the fill part: network namespaces held open as file
    descriptors by a helper process (`cni_compare.py netns-holder`), made with
    unshare(CLONE_NEWNET). No bind mount per namespace (`ip netns add` mounts one
    each, slow by the thousand), and the driver's own fd table, which every
    posix_spawn copies, stays small at any fill. A sandbox's CNI_NETNS is
    /proc/<holder>/fd/<n>; closing the fd destroys the namespace, and with it both
    ends of the veth pair in it. The holder exits when its stdin closes, so every
    namespace goes with the driver, on any exit."""

    def __init__(self, max_fds):
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "netns-holder", "--max-fds", str(max_fds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer or answer.startswith("error"):
            raise RuntimeError(f"netns holder: {answer.strip() or 'exited'}")
        return answer.split()

    def make(self, n):
        if n <= 0:
            return []
        return [f"/proc/{self.proc.pid}/fd/{fd}" for fd in self.ask(f"make {n}")]

    def close(self, paths):
        if paths:
            self.ask("close " + " ".join(p.rsplit("/", 1)[1] for p in paths))

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def netns_holder(a):
    """The holder's side of NetnsHolder: `make N` answers the N new fds on one line,
    `close FD...` answers ok; anything that fails answers `error: ...`."""
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (a.max_fds, a.max_fds))
    for line in sys.stdin:
        cmd, *args = line.split()
        try:
            if cmd == "make":
                fds = []
                for _ in range(int(args[0])):
                    if LIBC.unshare(CLONE_NEWNET) != 0:
                        e = ctypes.get_errno()
                        raise OSError(e, f"unshare(CLONE_NEWNET): {os.strerror(e)}")
                    fds.append(os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC))
                print(" ".join(map(str, fds)), flush=True)
            elif cmd == "close":
                for fd in args:
                    os.close(int(fd))
                print("ok", flush=True)
            else:
                print(f"error: unknown command {cmd}", flush=True)
        except (OSError, ValueError, IndexError) as e:
            print(f"error: {e}", flush=True)
    return 0


class FillNode:
    """The fill node's counters, each minus what was there before the part began:
    links (the contenders add only their host-side veths), IPv4 routes (all
    tables), podnet's pod addresses and host-local's address files. Links are
    counted in /sys/class/net (`ip netns exec` mounted this namespace's sysfs):
    a netlink dump would make the kernel look up the peer namespace's id of every
    veth, a walk over all namespace ids each, which at 10,000 pods loads the
    machine while the samples run."""

    def __init__(self, daemon, hostlocal_dir):
        self.daemon = daemon
        self.hostlocal_dir = hostlocal_dir
        self.base_links = set(os.listdir("/sys/class/net"))
        self.base_routes = self.routes_total()
        self.base_allocs = set(healthz(daemon.sock)["ipam"]["allocations"])

    @staticmethod
    def routes_total():
        rc, out, *_ = spawn([IP, "-4", "-o", "route", "show", "table", "all"], {"PATH": BASE_PATH})
        return len(out.splitlines())

    def veths(self):
        return len(set(os.listdir("/sys/class/net")) - self.base_links)

    def routes(self):
        return self.routes_total() - self.base_routes

    def podnet_addrs(self):
        return set(healthz(self.daemon.sock)["ipam"]["allocations"]) - self.base_allocs

    def hostlocal_files(self):
        return len(hostlocal_leftovers(self.hostlocal_dir)) if os.path.isdir(self.hostlocal_dir) else 0

    def holds(self, contender, ips):
        """True when exactly the attachments with these addresses are on the node."""
        if self.veths() != len(ips):
            return False
        if contender.name == "podnet":
            return self.podnet_addrs() == set(ips)
        return self.hostlocal_files() == len(ips)


def wait_for(pred, timeout=300):
    """Seconds until pred() held (polled), or None after `timeout`."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if pred():
            return time.perf_counter() - t0
        time.sleep(0.05)
    return None


class FillRun:
    """State shared by the fill part's steps."""

    def __init__(self, holder, node, checks):
        self.holder = holder
        self.node = node
        self.checks = checks
        self.made = 0

    def new_pods(self, contender, tag, n):
        """n fresh sandboxes: [(container ID, CNI_NETNS)]."""
        paths = self.holder.make(n)
        pods = [(f"fill-{contender.name}-{tag}-{self.made + k}", p) for k, p in enumerate(paths)]
        self.made += n
        return pods

    @staticmethod
    def calls(contender, cmd, pods, workers):
        """`cmd` on every pod, `workers` at once: (calls, wall seconds)."""

        def one(pod):
            return contender.call_env(cmd, contender.env_for(cmd, pod[0], pod[1], pod[0]))

        t0 = time.perf_counter()
        if workers == 1:
            done = [one(p) for p in pods]
        else:
            with ThreadPoolExecutor(max_workers=workers) as ex:
                done = list(ex.map(one, pods))
        return done, time.perf_counter() - t0

    def all_ok(self, what, calls):
        failed = [c.out.decode(errors="replace")[:300] + c.err.decode(errors="replace")[-300:] for c in calls if not c.ok]
        self.checks.record(f"{what}: every call succeeded ({len(calls)})", not failed, str(failed[:2]))

    def no_twice(self, what, ips):
        dups = sorted(ip for ip, k in _counts(ips).items() if k > 1)
        self.checks.record(f"{what}: no address handed out twice ({len(ips)})", not dups, str(dups[:5]))

    def settled(self, what, contender, ips):
        """Waits for the node to hold exactly `ips` (a DEL may answer before its
        teardown is done) and records whether it did; seconds or None."""
        s = wait_for(lambda: self.node.holds(contender, ips))
        self.checks.record(
            f"{what}: node holds exactly {len(ips)} attachments (veths, addresses)",
            s is not None,
            f"veths {self.node.veths()}",
        )
        return s


def _counts(items):
    out = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def daemon_probe(contender, daemon):
    """(daemon CPU seconds, phase sums) for podnet; (None, {}) for a peer."""
    if contender.name != "podnet":
        return None, {}
    return proc_cpu_s(daemon.pid), phase_sums(daemon.sock)


def fill_levels(run, c, levels, a, daemon):
    """Fills the node with c's attachments up to each level (untimed, a.fill_parallel
    at once), then times a.samples ADDs one at a time on fresh sandboxes and their
    DELs; at the end DELs the fill and checks the node is back where it began."""
    live = []  # [(pod, ip)]
    rows = []
    try:
        for level in levels:
            pods = run.new_pods(c, f"f{level}", level - len(live))
            calls, wall = run.calls(c, "ADD", pods, a.fill_parallel)
            run.all_ok(f"fill/{c.name}@{level}: fill ADD", calls)
            live += [(p, x.ip) for p, x in zip(pods, calls) if x.ok]
            ips = [ip for _, ip in live]
            run.no_twice(f"fill/{c.name}@{level}: the fill", ips)
            run.settled(f"fill/{c.name}@{level}: after the fill", c, ips)
            veths, routes = run.node.veths(), run.node.routes()
            run.checks.record(
                f"fill/{c.name}@{level}: one veth and at least one route per pod on the node",
                veths == level and routes >= level,
                f"veths {veths}, IPv4 routes {routes}",
            )
            log(f"fill/{c.name}: {level} pods on the node (fill of {len(pods)} in {wall:.1f} s); veths {veths}, routes {routes}")

            samples = run.new_pods(c, f"s{level}", a.samples)
            load = [round(x, 2) for x in os.getloadavg()]
            null = [spawn(["/bin/true"], {"PATH": BASE_PATH})[3] * 1000 for _ in range(20)]
            cpu0, ph0 = daemon_probe(c, daemon)
            adds, _ = run.calls(c, "ADD", samples, 1)
            cpu1, _ = daemon_probe(c, daemon)
            run.all_ok(f"fill/{c.name}@{level}: sample ADD", adds)
            run.no_twice(f"fill/{c.name}@{level}: fill and samples", ips + [x.ip for x in adds if x.ip])
            dels, _ = run.calls(c, "DEL", samples, 1)
            cpu2, ph1 = daemon_probe(c, daemon)
            run.all_ok(f"fill/{c.name}@{level}: sample DEL", dels)
            settle = run.settled(f"fill/{c.name}@{level}: after the sample DELs", c, ips)
            run.holder.close([p for _, p in samples])
            row = {
                "fill": level,
                "veths": veths,
                "routes": routes,
                "loadavg": load,
                "driver_overhead_ms_p50": round(pct(null, 50), 3),
                "fill_add_wall_s": round(wall, 2),
                "add": stats([x.ms for x in adds if x.ok]),
                "del": stats([x.ms for x in dels if x.ok]),
                "add_cpu_ms_mean": round(sum(x.cpu_ms for x in adds) / max(len(adds), 1), 3),
                "del_cpu_ms_mean": round(sum(x.cpu_ms for x in dels) / max(len(dels), 1), 3),
                "del_settle_s": None if settle is None else round(settle, 3),
                "add_ms": [round(x.ms, 3) for x in adds],
                "del_ms": [round(x.ms, 3) for x in dels],
            }
            if cpu0 is not None:
                row["daemon_cpu_ms_per_add"] = round((cpu1 - cpu0) * 1000 / a.samples, 3)
                row["daemon_cpu_ms_per_del"] = round((cpu2 - cpu1) * 1000 / a.samples, 3)
                row["phase_mean_ms"] = phase_means(ph0, ph1)
            rows.append(row)
            log(
                f"fill/{c.name}@{level}: ADD p50 {row['add']['p50_ms'] if row['add'] else '-'} ms"
                f" | DEL p50 {row['del']['p50_ms'] if row['del'] else '-'} ms | load {load[0]}"
            )
    finally:
        pods = [p for p, _ in live]
        calls, wall = run.calls(c, "DEL", pods, a.fill_parallel)
        run.all_ok(f"fill/{c.name}: DEL of the fill", calls)
        settle = run.settled(f"fill/{c.name}: after the DEL of the fill", c, [])
        run.holder.close([p for _, p in pods])
        log(f"fill/{c.name}: DEL of {len(pods)} in {wall:.1f} s, settled {settle} s after")
    return rows


def burst(run, c, n, workers):
    """n ADDs with `workers` at once on fresh sandboxes, then their DELs."""
    pods = run.new_pods(c, "burst", n)
    adds, add_wall = run.calls(c, "ADD", pods, workers)
    run.all_ok(f"burst/{c.name}: ADD", adds)
    run.no_twice(f"burst/{c.name}", [x.ip for x in adds if x.ip])
    dels, del_wall = run.calls(c, "DEL", pods, workers)
    run.all_ok(f"burst/{c.name}: DEL", dels)
    settle = run.settled(f"burst/{c.name}: after DEL", c, [])
    run.holder.close([p for _, p in pods])
    return {
        "add_wall_s": round(add_wall, 4),
        "del_wall_s": round(del_wall, 4),
        "del_settle_s": None if settle is None else round(settle, 3),
        "add": stats([x.ms for x in adds if x.ok]),
        "del": stats([x.ms for x in dels if x.ok]),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def fill(a):
    if os.geteuid() != 0:
        sys.exit("cni_compare: needs root")
    levels = sorted(set(a.levels))
    if levels and levels[0] < 0:
        sys.exit("cni_compare: fill levels are pod counts (0 or more)")
    checks = Checks()
    load_start = [round(x, 2) for x in os.getloadavg()]
    daemon = bench_daemon(a, "podnet-fill", "10.101.0.0/16", 16, "bench-fill")
    hl_dir = os.path.join(a.state_base, "host-local-fill")
    podnet = podnet_plugin(a.podnet, daemon.sock, [])
    ptp = ptp_plugin(a.cni_dir, "bench-ptp-fill", "10.102.0.0/16", hl_dir, [])
    contenders = [podnet, ptp]
    max_fds = (levels[-1] if levels else 0) + a.samples + a.burst + 1024
    holder = NetnsHolder(max_fds)
    log(f"starting the daemon (node range /16), state in {daemon.state}; netns holder pid {holder.proc.pid}")
    daemon.start()
    out = {"mode": "fill", "loadavg_start": load_start, "levels": levels, "samples": a.samples}
    try:
        run = FillRun(holder, FillNode(daemon, hl_dir), checks)
        for c in contenders:  # warm-up, untimed
            burst(run, c, 2, 1)
        if a.burst:
            out["burst"] = {"n": a.burst, "workers": a.burst_parallel, "rounds": {c.name: [] for c in contenders}}
            for r in range(a.burst_rounds):
                for c in contenders[r % 2:] + contenders[: r % 2]:
                    b = burst(run, c, a.burst, a.burst_parallel)
                    out["burst"]["rounds"][c.name].append(b)
                    log(
                        f"burst/{c.name} {a.burst} at {a.burst_parallel}: wall {b['add_wall_s']:.3f} s,"
                        f" ADD p50 {b['add']['p50_ms']} p99 {b['add']['p99_ms']} ms | DEL wall {b['del_wall_s']:.3f} s"
                    )
        if levels:
            out["levels_by"] = {}
            peer_levels = levels if a.peer_levels is None else sorted(set(a.peer_levels))
            for c in contenders:
                out["levels_by"][c.name] = fill_levels(run, c, levels if c is podnet else peer_levels, a, daemon)
        out["daemon_after"] = proc_status(daemon.pid)
    finally:
        daemon.stop()
        holder.stop()
    out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    out["checks"] = checks.items
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    log(f"{len(checks.items)} checks, {len(checks.failed)} failed")
    return 1 if checks.failed else 0


# --------------------------------------------------------------------------- report


def machine():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    cpu = ln.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f.readline().split(":")[1].strip()
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "cpu": cpu,
        "mem": mem,
        "loadavg_at_report": [round(x, 2) for x in os.getloadavg()],
    }


def criterion_estimates(root):
    """Median estimates of every criterion benchmark under `root` (target/criterion)."""
    out = {}
    if not os.path.isdir(root):
        return out
    for dirpath, _, files in os.walk(root):
        if os.path.basename(dirpath) == "new" and "estimates.json" in files and "benchmark.json" in files:
            with open(os.path.join(dirpath, "benchmark.json")) as f:
                b = json.load(f)
            with open(os.path.join(dirpath, "estimates.json")) as f:
                e = json.load(f)
            med = e["median"]
            out[b.get("full_id") or b.get("title")] = {
                "median_ns": med["point_estimate"],
                "ci_ns": [med["confidence_interval"]["lower_bound"], med["confidence_interval"]["upper_bound"]],
                "mtime": os.path.getmtime(os.path.join(dirpath, "estimates.json")),
            }
    return out


def fmt_ns(ns):
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.2f} µs"
    if ns < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def ratio(x, y):
    if x is None or y in (None, 0):
        return "-"
    return f"{x / y:.2f}"


def rss_cell(cmp_, name):
    r = cmp_.get("peak_rss_kb", {}).get(name)
    if not r:
        return "-"
    return f"{r['add_peak_rss_kb_p50'] / 1024:.1f} / {r['del_peak_rss_kb_p50'] / 1024:.1f} MiB"


def median_of(values):
    return pct(values, 50)


def merge_runs(docs):
    """One compare document whose figures are the medians over `docs` (rounds of
    the same run); raw per-call times are concatenated, checks kept from all."""
    if len(docs) == 1:
        return docs[0]
    merged = json.loads(json.dumps(docs[0]))

    def merge(dst, srcs):
        for k, v in dst.items():
            vals = [s.get(k) for s in srcs]
            if isinstance(v, dict):
                merge(v, [x if isinstance(x, dict) else {} for x in vals])
            elif isinstance(v, list) and all(isinstance(x, list) for x in vals):
                dst[k] = [y for x in vals for y in x]
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                nums = [x for x in vals if isinstance(x, (int, float))]
                dst[k] = round(median_of(nums), 3)

    merge(merged["results"], [d["results"] for d in docs])
    merged["driver_overhead_ms_p50"] = round(median_of([d["driver_overhead_ms_p50"] for d in docs]), 3)
    merged["checks"] = [c for d in docs for c in d["checks"]]
    merged["rounds"] = len(docs)
    return merged


def change(x, base):
    if x is None or not base:
        return "-"
    return f"{(x / base - 1) * 100:+.0f}%"


def fill_tables(fl):
    """The fill part's markdown: the burst, then latency per fill level."""
    L = []
    label = {"podnet": "podnet", "ptp": "ptp + host-local"}
    b = fl.get("burst")
    if b:
        rounds = b["rounds"]
        med = lambda name, f: median_of([f(r) for r in rounds.get(name, []) if f(r) is not None])
        L.append("")
        L.append(
            f"Burst: {b['n']} ADDs with {b['workers']} at once on an empty node, then their DELs "
            f"(median over {len(rounds.get('podnet', []))} rounds; per call in ms, walls in s):"
        )
        L.append("")
        L.append("| | ADD wall | ADD p50 | p99 | max | DEL wall | DEL p99 |")
        L.append("|---|---|---|---|---|---|---|")
        for n in rounds:
            L.append(
                f"| {label[n]} | {med(n, lambda r: r['add_wall_s']):.3f} | {med(n, lambda r: r['add']['p50_ms']):.1f} "
                f"| {med(n, lambda r: r['add']['p99_ms']):.1f} | {med(n, lambda r: r['add']['max_ms']):.1f} "
                f"| {med(n, lambda r: r['del_wall_s']):.3f} | {med(n, lambda r: r['del']['p99_ms']):.1f} |"
            )
        if "podnet" in rounds and "ptp" in rounds:
            L.append(
                f"| podnet / ptp | {ratio(med('podnet', lambda r: r['add_wall_s']), med('ptp', lambda r: r['add_wall_s']))} "
                f"| {ratio(med('podnet', lambda r: r['add']['p50_ms']), med('ptp', lambda r: r['add']['p50_ms']))} "
                f"| {ratio(med('podnet', lambda r: r['add']['p99_ms']), med('ptp', lambda r: r['add']['p99_ms']))} | - "
                f"| {ratio(med('podnet', lambda r: r['del_wall_s']), med('ptp', lambda r: r['del_wall_s']))} "
                f"| {ratio(med('podnet', lambda r: r['del']['p99_ms']), med('ptp', lambda r: r['del']['p99_ms']))} |"
            )
    by = fl.get("levels_by")
    if not by:
        return L
    names = [n for n in by if by[n]]
    if not names:
        return L
    L.append("")
    L.append(
        f"Filled node: {fl['samples']} ADDs then their DELs one at a time on fresh sandboxes, with that many "
        "pods (veth, /32 route, address) already on the node; ms per call; change against the empty node:"
    )
    L.append("")
    head = "| pods on the node |"
    for n in names:
        head += f" {label[n]} ADD p50 | p99 | DEL p50 | p99 |"
    head += " ADD ratio | DEL ratio | load (1 min) |"
    L.append(head)
    L.append("|---|" + "---|---|---|---|" * len(names) + "---|---|---|")
    base = {n: by[n][0] for n in names}
    for k, row in enumerate(by[names[0]]):
        cells = f"| {row['fill']:,} |"
        loads = []
        for n in names:
            r = next((x for x in by[n] if x["fill"] == row["fill"]), None)
            if r is None:
                cells += " - | - | - | - |"
                continue
            a, d = r["add"], r["del"]
            ca = change(a["p50_ms"], base[n]["add"]["p50_ms"]) if k else ""
            cd = change(d["p50_ms"], base[n]["del"]["p50_ms"]) if k else ""
            cells += f" {a['p50_ms']}{f' ({ca})' if ca else ''} | {a['p99_ms']} | {d['p50_ms']}{f' ({cd})' if cd else ''} | {d['p99_ms']} |"
            loads.append(f"{r['loadavg'][0]}")
        q = next((x for x in by.get("ptp", []) if x["fill"] == row["fill"]), None)
        if names[0] == "podnet" and q:
            p = row
            cells += f" {ratio(p['add']['p50_ms'], q['add']['p50_ms'])} | {ratio(p['del']['p50_ms'], q['del']['p50_ms'])} |"
        else:
            cells += " - | - |"
        cells += f" {' / '.join(loads)} |"
        L.append(cells)
    ph = [(r["fill"], r.get("phase_mean_ms")) for r in by.get("podnet", [])]
    if any(p for _, p in ph):
        L.append("")
        L.append("podnet per fill level, mean ms per phase (the plugin's timings) and daemon CPU per call:")
        L.append("")
        for (level, p), r in zip(ph, by["podnet"]):
            parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(p.items()))
            L.append(
                f"- {level:,}: {parts}; daemon CPU {r.get('daemon_cpu_ms_per_add')} ms/ADD, "
                f"{r.get('daemon_cpu_ms_per_del')} ms/DEL"
            )
    nfail = sum(1 for c in fl["checks"] if not c["ok"])
    L.append("")
    L.append(f"Fill checks: {len(fl['checks'])} run, {nfail} failed.")
    return L


def report(a):
    doc = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine(),
        "git": a.git,
        "podnet_binary": a.podnet,
    }
    runs = []
    for path in a.inputs:
        with open(path) as f:
            d = json.load(f)
        if "mode" not in d and "machine" in d:
            # A results file of an earlier run: render it again (its rounds, its machine).
            runs.extend(d.get("compare_rounds") or ([d["compare"]] if "compare" in d else []))
            for k in ("resources", "fill", "criterion", "machine", "date", "git", "podnet_binary"):
                if k in d and not (k == "git" and a.git):
                    doc[k] = d[k]
            continue
        if d["mode"] == "compare":
            runs.append(d)
        else:
            doc[d["mode"]] = d
    if runs:
        doc["compare"] = merge_runs(runs)
        if len(runs) > 1:
            doc["compare_rounds"] = runs
    if a.criterion:
        doc["criterion"] = criterion_estimates(a.criterion)
    if a.add_rounds:
        for path in a.add_rounds:
            with open(path) as f:
                runs.extend(json.load(f).get("compare_rounds", []))
        doc["compare"] = merge_runs(runs)
        doc["compare_rounds"] = runs
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)

    m = doc["machine"]
    L = []
    L.append(f"Run {doc['date']} on {m['nproc']} CPUs ({m['cpu']}), kernel {m['kernel']}, {m['mem']} RAM; podnet {doc['git']}.")
    cmp_ = doc.get("compare")
    if cmp_:
        res = cmp_["results"]
        names = [n for n in ("podnet", "ptp", "bridge", "floor") if n in res["serial"]]
        label = {
            "podnet": "podnet",
            "ptp": "ptp + host-local",
            "bridge": "bridge + host-local",
            "floor": "kernel floor (ip -batch)",
        }
        rounds = cmp_.get("rounds", 1)
        if rounds > 1:
            L.append("")
            L.append(f"Every figure is the median over {rounds} rounds (same sandboxes, same binaries).")
        L.append("")
        L.append(
            f"Serial, {cmp_['settings']['serial_n']} sandboxes, per call in ms (driver overhead, spawn of /bin/true: "
            f"{cmp_['driver_overhead_ms_p50']} ms):"
        )
        L.append("")
        L.append("| | ADD p50 | p90 | p99 | max | DEL p50 | p90 | p99 | max | CPU ms/ADD | CPU ms/DEL | peak RSS ADD / DEL |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for n in names:
            r = res["serial"][n]
            ad, de = r["add"] or {}, r["del"] or {}
            cpu_a = f"{r['add_cpu_ms_mean']:.2f}"
            cpu_d = f"{r['del_cpu_ms_mean']:.2f}"
            if "daemon_cpu_ms_per_add" in r:
                cpu_a += f" + {r['daemon_cpu_ms_per_add']:.2f} daemon"
                cpu_d += f" + {r['daemon_cpu_ms_per_del']:.2f} daemon"
            L.append(
                f"| {label[n]} | {ad.get('p50_ms')} | {ad.get('p90_ms')} | {ad.get('p99_ms')} | {ad.get('max_ms')} "
                f"| {de.get('p50_ms')} | {de.get('p90_ms')} | {de.get('p99_ms')} | {de.get('max_ms')} "
                f"| {cpu_a} | {cpu_d} | {rss_cell(cmp_, n)} |"
            )
        if doc.get("compare_rounds"):
            L.append("")
            L.append("Spread over the rounds, serial p50 in ms (ADD / DEL), and the load average at each round's start:")
            L.append("")
            for n in names:
                per = [r["results"]["serial"].get(n) for r in doc["compare_rounds"]]
                cells = [f"{x['add']['p50_ms']:.1f} / {x['del']['p50_ms']:.1f}" for x in per if x and x["add"] and x["del"]]
                L.append(f"- {label[n]}: " + ", ".join(cells))
            loads = [str(r.get("loadavg_start_end", [[None]])[0][0]) for r in doc["compare_rounds"]]
            L.append("- load average (1 min): " + ", ".join(loads))
        ph = res["serial"].get("podnet", {}).get("phase_mean_ms")
        if ph:
            L.append("")
            L.append("podnet serial, mean ms per phase (the plugin's own timings, from the daemon's metrics):")
            L.append("")
            order = [
                "daemon-config", "netlink-setup", "ipam-round-trip", "daemon-allocation", "netlink-host",
                "netlink-pod", "link-wired", "endpoint-registration", "daemon-release", "total",
            ]
            rank = lambda k: order.index(k.split(" ", 1)[1]) if k.split(" ", 1)[1] in order else len(order) - 1
            for verb in ("ADD", "DEL"):
                keys = sorted((k for k in ph if k.startswith(verb + " ")), key=rank)
                parts = [f"{k.split(' ', 1)[1]} {ph[k]:.2f}" for k in keys]
                if parts:
                    L.append(f"- {verb}: " + ", ".join(parts))
        L.append("")
        L.append(
            f"Batches of {cmp_['settings']['batch_n']} sandboxes, wall time in s (throughput per s); "
            "DEL + settle: until no link, address or state file is left:"
        )
        L.append("")
        head = "| |" + "".join(f" ADD ×{w} | DEL ×{w} | DEL + settle ×{w} |" for w in res["batch"])
        L.append(head)
        L.append("|---|" + "---|---|---|" * len(res["batch"]))
        for n in names:
            row = f"| {label[n]} |"
            for w, by in res["batch"].items():
                r = by.get(n)
                if r:
                    row += f" {r['add_wall_s']:.2f} ({r['add_per_s']:.0f}/s) | {r['del_wall_s']:.2f} ({r['del_per_s']:.0f}/s) |"
                    st = r.get("del_settle_s")
                    row += f" {r['del_wall_s'] + st:.2f} |" if st is not None else " - |"
                else:
                    row += " - | - | - |"
            L.append(row)
        settles = [f"{label[n]} {res['serial'][n]['del_settle_s']}" for n in names if res["serial"][n].get("del_settle_s") is not None]
        if settles:
            L.append("")
            L.append(f"Serial DEL: seconds from the last DEL's return until settled: {', '.join(settles)}")
        L.append("")
        L.append("Ratios podnet / peer (serial p50; batch walls):")
        L.append("")
        L.append("| peer | ADD p50 | DEL p50 |" + "".join(f" ADD ×{w} | DEL ×{w} |" for w in res["batch"]))
        L.append("|---|---|---|" + "---|---|" * len(res["batch"]))
        p = res["serial"].get("podnet")
        for n in names:
            if n == "podnet" or not p:
                continue
            r = res["serial"][n]
            row = f"| {label[n]} | {ratio(p['add']['p50_ms'], r['add']['p50_ms'])} | {ratio(p['del']['p50_ms'], r['del']['p50_ms'])} |"
            for w, by in res["batch"].items():
                if "podnet" in by and n in by:
                    row += f" {ratio(by['podnet']['add_wall_s'], by[n]['add_wall_s'])} | {ratio(by['podnet']['del_wall_s'], by[n]['del_wall_s'])} |"
                else:
                    row += " - | - |"
            L.append(row)
        nfail = sum(1 for c in cmp_["checks"] if not c["ok"])
        L.append("")
        L.append(f"Checks: {len(cmp_['checks'])} run, {nfail} failed.")
    rss = doc.get("resources")
    if rss:
        L.append("")
        L.append("| resource | value |")
        L.append("|---|---|")
        L.append(f"| daemon VmRSS idle | {rss['idle']['VmRSS'] / 1024:.1f} MiB |")
        L.append(
            f"| daemon VmRSS with {rss['allocated']} allocations{' (/16 node range full)' if rss.get('range_full') else ''} | {rss['full']['VmRSS'] / 1024:.1f} MiB (HWM {rss['full']['VmHWM'] / 1024:.1f} MiB) |"
        )
        L.append(f"| daemon VmRSS after restart with them | {rss['after_restore']['VmRSS'] / 1024:.1f} MiB |")
        L.append(
            f"| {rss['allocated']} allocations through the API | {rss['allocate_wall_s']} s ({rss['allocate_per_s']:.0f}/s, daemon CPU {rss['daemon_cpu_ms_per_allocate']} ms each) |"
        )
        L.append(
            f"| GET /v1/healthz with them | {rss['healthz_ms_full']} ms, {rss.get('healthz_bytes_full', 0) / 1048576:.1f} MiB |"
        )
        if "cni_status_full" in rss:
            L.append(
                f"| CNI STATUS exec, idle / with them | {rss['cni_status_idle']['p50_ms']} ms / "
                f"{rss['cni_status_full']['p50_ms']} ms (exit {rss['cni_status_full']['exit']}) |"
            )
        L.append(f"| restart to ready with them | {rss['restart_with_allocations_ms']} ms |")
        if "journal_bytes" in rss:
            L.append(f"| journal size with them | {rss['journal_bytes'] / 1048576:.1f} MiB |")
        if cmp_:
            for k, v in cmp_["binary_sizes"].items():
                L.append(f"| {k} binary | {v / 1048576:.1f} MiB |")
    if doc.get("fill"):
        L += fill_tables(doc["fill"])
    crit = doc.get("criterion")
    if crit:
        L.append("")
        L.append("| micro-benchmark (criterion median) | time |")
        L.append("|---|---|")
        for k in sorted(crit):
            L.append(f"| {k} | {fmt_ns(crit[k]['median_ns'])} |")
    text = "\n".join(L) + "\n"
    with open(a.md, "w") as f:
        f.write(text)
    print(text)
    return 0


# --------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--podnet", required=True)
    c.add_argument("--cni-dir", default="/usr/lib/cni")
    c.add_argument("--sandbox-prefix", required=True)
    c.add_argument("--sandboxes", type=int, default=200)
    c.add_argument("--serial", type=int, default=100)
    c.add_argument("--batch", type=int, default=200)
    c.add_argument("--parallel", type=int, nargs="+", default=[8, 32])
    c.add_argument("--workdir", required=True)
    c.add_argument("--state-base", required=True)
    c.add_argument("--pidfile", required=True)
    c.add_argument("--out", required=True)
    r = sub.add_parser("resources")
    r.add_argument("--podnet", required=True)
    r.add_argument("--state-base", required=True)
    r.add_argument("--pidfile", required=True)
    r.add_argument("--allocations", type=int, default=65536)
    r.add_argument("--rss-workers", type=int, default=4)
    r.add_argument("--out", required=True)
    f = sub.add_parser("fill")
    f.add_argument("--podnet", required=True)
    f.add_argument("--cni-dir", default="/usr/lib/cni")
    f.add_argument("--state-base", required=True)
    f.add_argument("--pidfile", required=True)
    f.add_argument("--levels", type=int, nargs="*", default=[0, 1000])
    f.add_argument("--peer-levels", type=int, nargs="*", default=None, help="ptp's fill levels (default: --levels)")
    f.add_argument("--samples", type=int, default=100)
    f.add_argument("--fill-parallel", type=int, default=32)
    f.add_argument("--burst", type=int, default=100)
    f.add_argument("--burst-parallel", type=int, default=32)
    f.add_argument("--burst-rounds", type=int, default=3)
    f.add_argument("--out", required=True)
    h = sub.add_parser("netns-holder")
    h.add_argument("--max-fds", type=int, required=True)
    p = sub.add_parser("report")
    p.add_argument("--out", required=True)
    p.add_argument("--md", required=True)
    p.add_argument("--git", default="")
    p.add_argument("--podnet", default="")
    p.add_argument("--criterion", default="")
    p.add_argument("--add-rounds", nargs="*", default=[], help="results files whose rounds are pooled in")
    p.add_argument("inputs", nargs="*")
    a = ap.parse_args()
    if a.mode == "compare":
        if max(a.serial, a.batch) > a.sandboxes:
            sys.exit("cni_compare: more calls per round than sandboxes")
        return compare(a)
    if a.mode == "resources":
        return resources(a)
    if a.mode == "fill":
        if a.samples < 1 or a.fill_parallel < 1 or a.burst < 0 or a.burst_parallel < 1 or a.burst_rounds < 1:
            sys.exit("cni_compare: --samples, --fill-parallel, --burst-parallel and --burst-rounds need 1 or more, --burst 0 or more")
        return fill(a)
    if a.mode == "netns-holder":
        return netns_holder(a)
    return report(a)


if __name__ == "__main__":
    sys.exit(main())
