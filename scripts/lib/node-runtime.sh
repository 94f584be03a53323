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
runtime_socket() {
    case "$(runtime_of "$1")" in
        crio) printf '/run/crio/crio.sock' ;;
        *) printf '/run/containerd/containerd.sock' ;;
    esac
}

# node_cni_plugins NODE: the dir holding the loopback and portmap the node's
# base install has.
node_cni_plugins() {
    case "$(runtime_of "$1")" in
        containerd1) printf '/usr/lib/cni' ;;
        *) printf '%s/cni-plugins' "$BIN" ;;
    esac
}

# check_runtimes: every runtime RUNTIMES names is installed.
check_runtimes() {
    local word b
    for word in $RUNTIMES; do
        case "$word" in
            containerd1)
                for b in containerd ctr runc containerd-shim-runc-v2; do
                    command -v "$b" > /dev/null || die "$b is missing (containerd1): apt-get install containerd runc (scripts/setup does)"
                done
                for b in loopback portmap; do
                    [ -x "/usr/lib/cni/$b" ] ||
                        die "/usr/lib/cni/$b is missing: apt-get install containernetworking-plugins (scripts/setup does)"
                done
                ;;
            containerd2 | crio)
                local need=(cni-plugins/loopback cni-plugins/portmap)
                if [ "$word" = containerd2 ]; then
                    need+=(containerd2/containerd containerd2/ctr containerd2/containerd-shim-runc-v2)
                else
                    need+=(crio/crio crio/pinns)
                fi
                for b in "${need[@]}"; do
                    [ -x "$BIN/$b" ] || die "$BIN/$b is missing ($word): run scripts/k8s-binaries runtimes"
                done
                for b in runc conmon skopeo; do
                    [ "$word" = crio ] || [ "$b" = runc ] || continue
                    command -v "$b" > /dev/null || die "$b is missing ($word): run scripts/k8s-binaries runtimes (it installs Debian's)"
                done
                ;;
            *) die "PODNET_CLUSTER_RUNTIMES: '$word' is not containerd1, containerd2 or crio" ;;
        esac
    done
}

# write_runtime_config NODE: the runtime's config files in STATE/nodes/NODE/.
write_runtime_config() {
    local node=$1 c="$DIR/nodes/$1"
    case "$(runtime_of "$node")" in
        containerd1)
            cat > "$c/containerd.toml" << EOF
version = 2
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No process here may lower oom_score_adj (CAP_SYS_RESOURCE is outside every
  # bounding set): without this every sandbox fails in runc.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
EOF
            ;;
        containerd2)
            containerd2_config /var/lib/containerd /run/containerd /run/containerd/containerd.sock \
                "$BIN/containerd2/containerd-shim-runc-v2" "$PAUSE_IMAGE" > "$c/containerd.toml"
            ;;
        crio)
            mkdir -p "$c/crio/crio.conf.d" "$c/crio/registries.conf.d" "$c/crio/policies"
            # runc through scripts/lib/runc-restricted: what containerd's
            # restrict_oom_score_adj and disable_hugetlb_controller do, for this host.
            CRIO_RUNTIME_PATH="$REPO/scripts/lib/runc-restricted" \
                crio_config "$c/crio" /var/lib /run /run/crio/crio.sock "$BIN/crio/pinns" "$PAUSE_IMAGE" > "$c/crio/crio.conf"
            crio_storage /var/lib /run > "$c/crio/storage.conf"
            crio_policy > "$c/crio/policy.json"
            crio_registries > "$c/crio/registries.conf"
            ;;
    esac
}

start_runtime() {
    local node=$1 c="$DIR/nodes/$1"
    case "$(runtime_of "$node")" in
        containerd1) spawn "$node" runtime /usr/bin/containerd --config "$c/containerd.toml" ;;
        containerd2) spawn "$node" runtime "$BIN/containerd2/containerd" --config "$c/containerd.toml" ;;
        crio)
            spawn "$node" runtime env CONTAINERS_STORAGE_CONF="$c/crio/storage.conf" "$BIN/crio/crio" \
                --config "$c/crio/crio.conf" --config-dir "$c/crio/crio.conf.d" \
                --registries-conf "$c/crio/registries.conf" --registries-conf-dir "$c/crio/registries.conf.d"
            ;;
    esac
}

wait_for_runtime() {
    local node=$1
    wait_for "the $(runtime_of "$node") socket on $node" 60 "$node" runtime \
        test -S "$DIR/nodes/$node/fs$(runtime_socket "$node")"
}

# archive_name ARCHIVE: the image name an OCI archive of scripts/oci-image holds
# (its one manifest's org.opencontainers.image.ref.name).
archive_name() {
    tar -xOf "$1" index.json | python3 -c '
import json, sys
m = json.load(sys.stdin)["manifests"]
if len(m) != 1:
    sys.exit("want one manifest, found %d" % len(m))
print(m[0]["annotations"]["org.opencontainers.image.ref.name"])'
}

# CRI-O's storage as skopeo names it (the node's paths: run in its mount namespace).
CRIO_STORE="containers-storage:[overlay@/var/lib/containers/storage+/run/containers/storage]"

# ctr2 NODE ARGS...: containerd 2's ctr in the k8s.io namespace; quiet unless it
# fails (every call warns that cgroup v1 support is deprecated).
ctr2() {
    local node=$1 out
    shift
    out=$(in_node "$node" "$BIN/containerd2/ctr" --address /run/containerd/containerd.sock -n k8s.io "$@" 2>&1) ||
        { printf '%s\n' "$out" >&2; return 1; }
}

# import_image NODE ARCHIVE: the image in the node's runtime, under its name.
import_image() {
    local node=$1 archive=$2 name
    case "$(runtime_of "$node")" in
        containerd1)
            in_node "$node" ctr --address /run/containerd/containerd.sock -n k8s.io images import "$archive" > /dev/null
            ;;
        containerd2) ctr2 "$node" images import "$archive" ;;
        crio)
            name=$(archive_name "$archive") || die "no image name in $archive"
            in_node "$node" env CONTAINERS_STORAGE_CONF="$DIR/nodes/$node/crio/storage.conf" \
                skopeo --policy "$DIR/nodes/$node/crio/policy.json" copy --quiet \
                "oci-archive:$archive" "$CRIO_STORE$name" > /dev/null
            ;;
    esac || die "importing $archive into $node ($(runtime_of "$node")) failed"
}

# tag_image NODE SRC DST: the node's image SRC also named DST.
tag_image() {
    local node=$1 src=$2 dst=$3
    case "$(runtime_of "$node")" in
        containerd1) in_node "$node" ctr --address /run/containerd/containerd.sock -n k8s.io images tag "$src" "$dst" > /dev/null ;;
        containerd2) ctr2 "$node" images tag "$src" "$dst" ;;
        crio)
            in_node "$node" env CONTAINERS_STORAGE_CONF="$DIR/nodes/$node/crio/storage.conf" \
                skopeo --policy "$DIR/nodes/$node/crio/policy.json" copy --quiet \
                "$CRIO_STORE$src" "$CRIO_STORE$dst" > /dev/null
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
    [ -n "$1" ] && [ -n "$2" ] || die "usage: scripts/cluster tag SRC DST"
    [ -f "$MARKER" ] || die "no cluster is running (scripts/cluster start)"
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
