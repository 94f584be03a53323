# shellcheck shell=bash
# The container runtime of a node of scripts/cluster (sourced by it; uses its
# DIR, BIN, RUNTIMES, PAUSE_IMAGE, spawn, in_node, wait_for, say and die). One
# word per runtime:
#
#   containerd1  Debian 12's containerd 1.6.20 + runc 1.1.5; Debian's CNI plugins
#                (containernetworking-plugins 1.1.1: CNI up to 1.0.0)
#   containerd2  containerd v2.4.2 with its own runc shim + Debian's runc; the CNI
#                plugins v1.10.0 (CNI 1.1.0)
#   crio         CRI-O v1.34.0 + conmon + runc (Debian's, through
#                scripts/lib/runc-restricted); the CNI plugins v1.10.0
#
# Each node's word is in STATE/nodes/node-I/runtime (written with its configs,
# read by every later command: a reboot or a joining node keeps the choice). The
# runtime's process is the node component "runtime" (pids/node-I/runtime,
# logs/node-I/runtime.log). Configs: scripts/lib/runtime-configs.sh; what each
# runtime asks of the CNI plugin: docs/runtimes.md.

# shellcheck source=scripts/lib/runtime-configs.sh
. "$REPO/scripts/lib/runtime-configs.sh"

# runtime_for I: node-I's runtime from RUNTIMES (repeated when there are more
# nodes than words).
runtime_for() {
    local words
    read -r -a words <<< "$RUNTIMES"
    [ "${#words[@]}" -gt 0 ] || die "PODNET_CLUSTER_RUNTIMES is empty: give words of containerd1, containerd2, crio"
    printf '%s\n' "${words[$((($1 - 1) % ${#words[@]}))]}"
}

runtime_of() {
    cat "$DIR/nodes/$1/runtime" 2> /dev/null || die "no runtime recorded for $1 (in $DIR/nodes/$1/runtime)"
}

# runtime_socket NODE: the CRI socket, a path in the node's mount namespace.
# CRI-O's is not its default /run/crio/crio.sock: the kubelet's cAdvisor finds
# CRI-O there and then asks it about every crio-<id> cgroup it sees, and on this
# host it sees the whole cgroup tree, other CRI-O nodes' containers (scripts/node's,
# run beside the cluster tests) among them. CRI-O answers 404 for those and
# cAdvisor retries each for 3.1 s before the kubelet registers the node (40 such
# containers kept node-2 unregistered past 90 s). Off the default path cAdvisor
# leaves CRI-O alone, and the kubelet takes the pods' stats from the CRI instead
# (its choice for a socket not named crio.sock).
runtime_socket() {
    case "$(runtime_of "$1")" in
        crio) printf '/run/crio/cri.sock' ;;
        *) printf '/run/containerd/containerd.sock' ;;
    esac
}

# node_cni_plugins NODE: the dir holding the loopback and portmap the node's
# base install has.
node_cni_plugins() { runtime_cni_plugins "$(runtime_of "$1")"; }

# check_runtimes: every runtime RUNTIMES names is installed, and crictl.
check_runtimes() {
    local word
    # (crictl: wait_for_runtime asks each runtime's CRI socket for its version.)
    [ -x "$BIN/crictl" ] || die "$BIN/crictl is missing: run scripts/k8s-binaries runtimes"
    for word in $RUNTIMES; do check_runtime "$word"; done
}

# The node's runtime configs (runtime_configs), in its state dir.
runtime_conf() { printf '%s/nodes/%s/runtime-config' "$DIR" "$1"; }

# write_runtime_config NODE: the runtime's config files, paths in its mount
# namespace.
write_runtime_config() {
    local node=$1 word root=/var/lib/containerd run=/run/containerd
    word=$(runtime_of "$node")
    [ "$word" != crio ] || { root=/var/lib; run=/run; }
    runtime_configs "$word" "$(runtime_conf "$node")" "$root" "$run" "$(runtime_socket "$node")" "$PAUSE_IMAGE"
}

start_runtime() {
    runtime_argv "$(runtime_of "$1")" "$(runtime_conf "$1")"
    spawn "$1" runtime "${RUNTIME_ARGV[@]}"
}

# wait_for_runtime NODE: the runtime answers a CRI Version call on its socket. (A
# socket file alone is not enough: one left by the stopped runtime stays until
# the new one removes it and listens again, and a kubelet dialing in between
# gets "no such file or directory".)
wait_for_runtime() {
    local node=$1
    wait_for "the $(runtime_of "$node") CRI socket on $node" 60 "$node" runtime \
        in_node "$node" "$BIN/crictl" --runtime-endpoint "unix://$(runtime_socket "$node")" --timeout 2s version
}

# CRI-O's storage as skopeo names it (the node's paths: run in its mount namespace).
CRIO_STORE=$(crio_store /var/lib /run)

# ctr2 NODE ARGS...: containerd 2's ctr in the k8s.io namespace, quiet unless it
# fails.
ctr2() {
    local node=$1
    shift
    run_quiet in_node "$node" "$BIN/containerd2/ctr" --address /run/containerd/containerd.sock -n k8s.io "$@"
}

# import_image NODE ARCHIVE: the image in the node's runtime, under its name.
import_image() {
    local node=$1 archive=$2
    runtime_import_argv "$(runtime_of "$node")" "$(runtime_conf "$node")" /run/containerd/containerd.sock "$CRIO_STORE" "$archive"
    run_quiet in_node "$node" "${IMPORT_ARGV[@]}" || die "importing $archive into $node ($(runtime_of "$node")) failed"
}

# tag_image NODE SRC DST: the node's image SRC also named DST.
tag_image() {
    local node=$1 src=$2 dst=$3
    case "$(runtime_of "$node")" in
        containerd1) in_node "$node" ctr --address /run/containerd/containerd.sock -n k8s.io images tag "$src" "$dst" > /dev/null ;;
        containerd2) ctr2 "$node" images tag "$src" "$dst" ;;
        crio)
            crio_copy_argv "$(runtime_conf "$node")" "$CRIO_STORE$src" "$CRIO_STORE$dst"
            in_node "$node" "${CRIO_COPY_ARGV[@]}" > /dev/null
            ;;
    esac || die "tagging $src as $dst on $node ($(runtime_of "$node")) failed"
}

# The nodes that are up (their network namespace exists).
running_nodes() {
    local node
    for node in $(node_names); do
        [ ! -e "/run/netns/pnc-$node" ] || printf '%s\n' "$node"
    done
}

cmd_runtime() {
    [ -f "$MARKER" ] || die "no cluster is running (scripts/cluster start)"
    NODES=$(cat "$DIR/nodes-count")
    node_index runtime "$1" > /dev/null
    runtime_of "$1"
}

cmd_import() {
    local node archive
    [ "$#" -gt 0 ] || die "usage: scripts/cluster import ARCHIVE..."
    [ -f "$MARKER" ] || die "no cluster is running (scripts/cluster start)"
    NODES=$(cat "$DIR/nodes-count")
    for archive in "$@"; do
        [ -f "$archive" ] || die "import: no file $archive"
    done
    for node in $(running_nodes); do
        for archive in "$@"; do import_image "$node" "$(realpath "$archive")"; done
    done
}

cmd_tag() {
    local node
    { [ -n "$1" ] && [ -n "$2" ]; } || die "usage: scripts/cluster tag SRC DST"
    [ -f "$MARKER" ] || die "no cluster is running (scripts/cluster start)"
    # shellcheck disable=SC2034  # read by running_nodes in scripts/cluster
    NODES=$(cat "$DIR/nodes-count")
    for node in $(running_nodes); do tag_image "$node" "$1" "$2"; done
}

# restart-runtime node-I: the node's runtime stopped (SIGTERM, as a service
# manager does; SIGKILL after 5 s) and started again, its pods left running
# (containerd's shims and CRI-O's conmons outlive it).
cmd_restart_runtime() {
    local node=$1 t0=$SECONDS
    locked restart-runtime
    node_index restart-runtime "$node" > /dev/null
    [ -e "/run/netns/pnc-$node" ] || die "$node is off (scripts/cluster boot $node)"
    say "$node: restarting its runtime ($(runtime_of "$node"))"
    stop_pid "$node runtime" "$(component_pid "$node" runtime)"
    start_runtime "$node"
    wait_for_runtime "$node"
    say "$node: $(runtime_of "$node") restarted in $((SECONDS - t0)) s"
}
