# shellcheck shell=bash
# Faults a soak (scripts/soak) or a person injects into the cluster of
# scripts/cluster, beside reboot, poweroff and restart-runtime. Sourced by
# scripts/cluster, which defines DIR, BIN, CP_NS, FABRIC_NS, spawn, stop_pid,
# locked, node_index, component_pid, pid_alive and wait_for.
#
#   cp-stop NAME                    a control-plane component stopped (SIGTERM): etcd,
#                                   kube-apiserver, kube-controller-manager, kube-scheduler
#   cp-start NAME                   ... and started again with its own arguments (also
#                                   after it exited by itself: a real control plane's
#                                   supervisor restarts it; the kube-scheduler exits
#                                   when it finds its cache corrupted)
#   partition node-I                node-I cut off from the fabric (the fabric's
#                                   port of its link set down: no carrier on its eth0)
#   heal node-I                     ... and joined to it again
#   kill node-I daemon|operator     SIGKILL to node-I's podnet agent (`podnet daemon`)
#                                   or operator processes, found in its cgroups
#   fill-run node-I                 node-I's /run/podnet filled up (ENOSPC)
#   free-run node-I                 ... and what fill-run wrote removed
#
# /run/podnet of every node is a tmpfs of RUN_PODNET_SIZE (a node's /run is one),
# so that filling it ends in ENOSPC as on a real node, and a power cut wipes it.

RUN_PODNET_SIZE=64m

# start_etcd, start_apiserver: the control plane's store and API server, the
# same arguments at start and at cp-start.
start_etcd() {
    spawn cp etcd "$BIN/etcd" --name=podnet-cluster --data-dir="$DIR/etcd" \
        --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
        --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
        --initial-cluster=podnet-cluster=http://127.0.0.1:2380 --unsafe-no-fsync --log-level=warn
}

start_apiserver() {
    local p="$DIR/pki" audit=()
    # PODNET_CLUSTER_AUDIT=1 at start wrote the policy (write_audit_policy).
    [ ! -f "$DIR/audit-policy.yaml" ] ||
        audit=(--audit-policy-file="$DIR/audit-policy.yaml" --audit-log-path="$DIR/logs/cp/audit.log")
    spawn cp kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
        --bind-address="$(if has_v4 && ! has_v6; then echo 0.0.0.0; else echo ::; fi)" --advertise-address="$(cp_addr)" --secure-port=6443 \
        --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
        --client-ca-file="$p/ca.crt" --allow-privileged=true \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
        --service-cluster-ip-range="$(family_list "$SERVICE_CIDR" "$SERVICE_CIDR6")" --authorization-mode=Node,RBAC \
        --enable-admission-plugins=NodeRestriction \
        --kubelet-client-certificate="$p/admin.crt" --kubelet-client-key="$p/admin.key" \
        --kubelet-preferred-address-types=InternalIP \
        --cert-dir="$DIR/kube-apiserver" "${audit[@]}"
}

# cp_component COMMAND NAME: NAME if it is a component cp-stop and cp-start take.
cp_component() {
    case "${2:-}" in
        etcd | kube-apiserver | kube-controller-manager | kube-scheduler) printf '%s' "$2" ;;
        *) die "usage: scripts/cluster $1 etcd|kube-apiserver|kube-controller-manager|kube-scheduler" ;;
    esac
}

cmd_cp_stop() {
    local name
    locked cp-stop
    name=$(cp_component cp-stop "${1:-}")
    pid_alive "$(component_pid cp "$name")" || die "$name is not running (scripts/cluster cp-start $name)"
    say "stopping $name"
    stop_pid "$name" "$(component_pid cp "$name")"
}

cmd_cp_start() {
    local name
    locked cp-start
    name=$(cp_component cp-start "${1:-}")
    ! pid_alive "$(component_pid cp "$name")" || die "$name is running (PID $(component_pid cp "$name"))"
    say "starting $name"
    case "$name" in
        etcd)
            start_etcd
            wait_for "etcd to answer" 60 cp etcd in_cp curl -fsS http://127.0.0.1:2379/health
            ;;
        kube-apiserver)
            start_apiserver
            wait_for "the API server's /readyz" 90 cp kube-apiserver kubectl_admin get --raw=/readyz
            ;;
        kube-controller-manager) start_controller_manager ;;
        kube-scheduler) start_scheduler ;;
    esac
}

# fabric_port COMMAND NODE up|down: the fabric's side of NODE's link (which must
# exist: the node is on) set up or down.
fabric_port() {
    node_index "$1" "$2" > /dev/null
    [ -e "/run/netns/pnc-$2" ] || die "$2 is off (scripts/cluster boot $2)"
    ip -n "$FABRIC_NS" link set "$2" "$3" || die "cannot set $2 $3 in $FABRIC_NS"
}

cmd_partition() {
    fabric_port partition "${1:-}" down
    say "$1: cut off from the fabric (scripts/cluster heal $1 joins it again)"
}

cmd_heal() {
    fabric_port heal "${1:-}" up
    say "$1: on the fabric again"
}

# run_podnet_tmpfs NODE: a fresh tmpfs at the node's /run/podnet (its state dir's
# fs/run/podnet, which the node binds; the host sees it there too).
run_podnet_tmpfs() {
    local at="$DIR/nodes/$1/fs/run/podnet"
    mkdir -p "$at"
    mount -t tmpfs -o "size=$RUN_PODNET_SIZE,mode=0755" "podnet-run-$1" "$at" ||
        die "cannot mount a tmpfs at $at"
}

# drop_run_podnet_tmpfs NODE: what a power cut does to it (its contents go).
drop_run_podnet_tmpfs() {
    local at="$DIR/nodes/$1/fs/run/podnet"
    ! mountpoint -q "$at" || umount "$at" || umount -l "$at" || die "cannot unmount $at"
}

# running_node COMMAND NODE: NODE's index in the running cluster (no lock:
# kill, fill-run and free-run change no process or namespace of the cluster's).
running_node() {
    [ "$(id -u)" = 0 ] || die "needs root"
    [ -f "$MARKER" ] || die "no cluster is running (scripts/cluster start)"
    # shellcheck disable=SC2034 # node_index (scripts/cluster) reads it
    NODES=$(cat "$DIR/nodes-count")
    node_index "$1" "$2"
}

# node_podnet_pids NODE ROLE: the PIDs of NODE's processes (its cgroups) whose
# argv begins `/usr/local/bin/podnet ROLE`.
node_podnet_pids() {
    local pid argv
    while read -r pid; do
        mapfile -d '' -t argv 2> /dev/null < "/proc/$pid/cmdline" || continue
        [ "${argv[0]:-}" != /usr/local/bin/podnet ] || [ "${argv[1]:-}" != "$2" ] || printf '%s\n' "$pid"
    done < <(find "/sys/fs/cgroup/pids/$CGROUP/$1" -name cgroup.procs -exec cat {} + 2> /dev/null)
}

cmd_kill() {
    local node=${1:-} role=${2:-} pids pid
    running_node kill "$node" > /dev/null
    case "$role" in
        daemon | operator) ;;
        *) die "usage: scripts/cluster kill node-I daemon|operator" ;;
    esac
    pids="$(node_podnet_pids "$node" "$role" | tr '\n' ' ')"
    [ -n "$pids" ] || { say "$node: no podnet $role runs"; return 0; }
    for pid in $pids; do kill -KILL "$pid" 2> /dev/null || true; done
    say "$node: SIGKILL to podnet $role (PID ${pids% })"
}

# run_fill NODE: the file fill-run writes into NODE's /run/podnet (which must be
# mounted: on a node that is off, the path is the bare directory on the host's disk).
run_fill() {
    local at="$DIR/nodes/$1/fs/run/podnet"
    mountpoint -q "$at" || die "$1 is off: its /run/podnet is not mounted (scripts/cluster boot $1)"
    printf '%s' "$at/filled-by-scripts-cluster"
}

cmd_fill_run() {
    local node=${1:-} file err
    running_node fill-run "$node" > /dev/null
    file="$(run_fill "$node")"
    if err="$(dd if=/dev/zero of="$file" bs=1M 2>&1)"; then
        die "$node: /run/podnet took $(du -h "$file" | cut -f1) without filling up"
    fi
    case "$err" in
        *"No space left"*) say "$node: /run/podnet full (ENOSPC; scripts/cluster free-run $node frees it)" ;;
        *) die "$node: filling /run/podnet failed: ${err##*$'\n'}" ;;
    esac
}

cmd_free_run() {
    local node=${1:-}
    running_node free-run "$node" > /dev/null
    rm -f "$(run_fill "$node")"
    say "$node: /run/podnet freed"
}
