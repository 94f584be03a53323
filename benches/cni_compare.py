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
        return {
            "PATH": BASE_PATH,
            "CNI_COMMAND": cmd,
            "CNI_CONTAINERID": self.cid(i),
            "CNI_NETNS": f"/run/netns/{sb}",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": self.cni_path,
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={sb}",
        }

    def call(self, cmd, i):
        rc, out, err, secs, cpu, rss = spawn(self.wrap([self.binary]), self.env(cmd, i), self.conf)
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

    daemon = Daemon(
        a.podnet,
        os.path.join(a.state_base, "podnet"),
        [
            "--cluster-pool-ipv4-cidr", "10.99.0.0/16",
            "--cluster-pool-ipv4-mask-size", "20",
            "--ipam-release-cooldown", "0s",
            "--k8s-node-name", "bench-node",
        ],
        a.pidfile,
    )
    log(f"starting the daemon ({a.podnet}), state in {daemon.state}")
    ready_s = daemon.start()
    try:
        baseline_allocs = healthz(daemon.sock)["ipam"]["allocations"]
        log(f"daemon pid {daemon.pid} ready in {ready_s * 1000:.0f} ms; infra addresses: {sorted(baseline_allocs)}")
        hl = {
            "ptp": os.path.join(a.state_base, "host-local-ptp"),
            "bridge": os.path.join(a.state_base, "host-local-bridge"),
        }
        podnet = CniPlugin(
            "podnet",
            a.podnet,
            {"cniVersion": "1.0.0", "name": "bench-podnet", "type": "podnet", "socket-path": daemon.sock},
            os.path.dirname(a.podnet),
            sandboxes,
        )
        ptp = CniPlugin(
            "ptp",
            os.path.join(a.cni_dir, "ptp"),
            {
                "cniVersion": "1.0.0",
                "name": "bench-ptp",
                "type": "ptp",
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.98.0.0/20"}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": hl["ptp"],
                },
            },
            a.cni_dir,
            sandboxes,
        )
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
    daemon = Daemon(
        a.podnet,
        os.path.join(a.state_base, "podnet-rss"),
        [
            "--cluster-pool-ipv4-cidr", "10.100.0.0/16",
            "--cluster-pool-ipv4-mask-size", "16",
            "--ipam-release-cooldown", "0s",
            "--k8s-node-name", "bench-rss",
        ],
        a.pidfile,
    )
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
            for k in ("resources", "criterion", "machine", "date", "git", "podnet_binary"):
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
    return report(a)


if __name__ == "__main__":
    sys.exit(main())
