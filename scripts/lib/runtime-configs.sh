# shellcheck shell=bash
# Config files for the container runtimes of scripts/node and scripts/cluster:
# Debian's containerd 1.6 and those scripts/k8s-binaries builds with its
# `runtimes` argument, containerd v2.4.2 and CRI-O v1.34.0. Source it; each
# function prints one file to stdout, so the caller picks where it goes:
#
#   containerd1_config ROOT STATE SOCKET PAUSE_IMAGE
#       containerd 1.6's config.toml (version 2), CNI from /opt/cni/bin and
#       /etc/cni/net.d.
#   containerd2_config ROOT STATE SOCKET SHIM PAUSE_IMAGE [CNI_BIN_DIR] [CNI_CONF_DIR]
#       containerd 2's config.toml (version 3). ROOT and STATE are containerd's
#       root (persistent) and state (/run-like) dirs; SOCKET its gRPC socket;
#       SHIM the containerd-shim-runc-v2 to run (containerd 2 looks a shim up on
#       PATH first, where Debian's 1.6 shim is: the path is given explicitly).
#   crio_config CONF LIB RUN SOCKET PINNS PAUSE_IMAGE [CNI_BIN_DIR] [CNI_CONF_DIR] [LOG_DIR]
#       CRI-O's crio.conf: what it keeps across a reboot is under LIB (storage
#       root LIB/containers/storage, the persistent version and clean-shutdown
#       files in LIB/crio), what a reboot wipes under RUN (runroot, version
#       file, exits, attach sockets, namespaces: a /run-like dir, so CRI-O
#       sees a boot as one); the policy is CONF/policy.json; runtime runc,
#       monitor conmon, both from Debian 12.
#       With CRIO_RUNTIME_PATH set, that file is run instead of /usr/bin/runc
#       (scripts/cluster's nodes: scripts/lib/runc-restricted).
#   crio_storage LIB RUN  storage.conf (for CONTAINERS_STORAGE_CONF): crio.conf's
#                         storage root, runroot and driver, so no other
#                         containers/storage user of the node reads /etc/containers
#   crio_policy           policy.json: accept anything (images are imported)
#   crio_registries       registries.conf: no registries, no short-name search
#
# And for a script that runs one (REPO and BIN set; BIN holds what
# `scripts/k8s-binaries runtimes` built):
#
#   check_runtime WORD  what the runtime WORD (containerd1, containerd2, crio)
#                       and its node's loopback and portmap need is installed
#                       (else die, saying what installs it)
#   runtime_cni_plugins WORD
#                       the dir of the loopback and portmap a node of WORD has
#   runtime_configs WORD CONF ROOT RUN SOCKET PAUSE_IMAGE [LOG_DIR]
#       every config file of the runtime WORD (containerd1, containerd2, crio)
#       written into the dir CONF; ROOT and RUN are its persistent and /run-like
#       dirs. CRI-O runs runc through scripts/lib/runc-restricted: what
#       containerd's restrict_oom_score_adj and disable_hugetlb_controller do,
#       for this host (docs/runtimes.md).
#   runtime_argv WORD CONF   sets RUNTIME_ARGV to the command that runs it
#   crio_copy_argv CONF SRC DST
#                            sets CRIO_COPY_ARGV to a skopeo copy with the
#                            storage and policy of CONF (SRC and DST are skopeo
#                            image references; run it where the store's paths are)
#   crio_store ROOT RUN      the containers-storage reference prefix of that store
#   archive_name ARCHIVE     the image name an OCI archive of scripts/oci-image
#                            holds (what an import into CRI-O must name)
#   runtime_import_argv WORD CONF SOCKET STORE ARCHIVE
#                            sets IMPORT_ARGV to the command that imports the OCI
#                            archive ARCHIVE into the runtime WORD's images under
#                            the name it holds: ctr on SOCKET (namespace k8s.io)
#                            for containerd, skopeo into STORE (crio_store's
#                            prefix) with CONF's storage and policy for CRI-O
#   run_quiet ARGV...        runs ARGV, its output shown only if it fails
#                            (containerd 2's ctr warns on every call that
#                            cgroup v1 is deprecated)
#
# CRI-O reads registries.conf from a flag, not from crio.conf: start it as
#   crio --config CONF/crio.conf --config-dir CONF/crio.conf.d \
#        --registries-conf CONF/registries.conf --registries-conf-dir CONF/registries.conf.d
# (the dirs may be empty, they replace /etc/crio/crio.conf.d and
# /etc/containers/registries.conf.d) and CONTAINERS_STORAGE_CONF=CONF/storage.conf.
#
# CNI_BIN_DIR and CNI_CONF_DIR default to /opt/cni/bin and /etc/cni/net.d, the
# paths scripts/cluster binds per node. PAUSE_IMAGE must be an image the node has
# imported (make image's is registry.k8s.io/pause:3.10; containerd 2.4.2's own
# default is pause:3.10.2, which it would try to pull). Both runtimes use the
# cgroupfs driver, as the kubelets of scripts/cluster do (cgroupDriver: cgroupfs
# on the host's cgroup v1).

# toml_str S: S as a TOML basic string (paths and image names: no control chars).
toml_str() {
    local s=${1//\\/\\\\}
    printf '"%s"' "${s//\"/\\\"}"
}

containerd1_config() {
    local root=$1 state=$2 socket=$3 pause=$4
    cat << EOF
version = 2
root = $(toml_str "$root")
state = $(toml_str "$state")
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = $(toml_str "$socket")

# /opt/containerd is the default: keep every path of the daemon under ROOT.
[plugins."io.containerd.internal.v1.opt"]
  path = $(toml_str "$root/opt")

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = $(toml_str "$pause")
  # No process here may lower oom_score_adj (CAP_SYS_RESOURCE is outside every
  # bounding set): without this every sandbox fails in runc.
  restrict_oom_score_adj = true
  # The pods' netns bind mounts under the state dir.
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
}

containerd2_config() {
    local root=$1 state=$2 socket=$3 shim=$4 pause=$5
    local cni_bin=${6:-/opt/cni/bin} cni_conf=${7:-/etc/cni/net.d}
    cat << EOF
# containerd v2.4.2 (scripts/lib/runtime-configs.sh). Version 3: containerd 2's
# own format (2.4 migrates it to its current version 4 in memory).
version = 3
root = $(toml_str "$root")
state = $(toml_str "$state")

[grpc]
  address = $(toml_str "$socket")

[plugins]
  # /opt/containerd is the default: keep every path of the daemon under ROOT.
  [plugins.'io.containerd.internal.v1.opt']
    path = $(toml_str "$root/opt")

  # No NRI plugins here; its socket would be /var/run/nri/nri.sock.
  [plugins.'io.containerd.nri.v1.nri']
    disable = true

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    # Never pulled: the node imports it (ctr -n k8s.io images import).
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = $(toml_str "$pause")
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = ''

  [plugins.'io.containerd.cri.v1.runtime']
    # No process here may lower oom_score_adj (CAP_SYS_RESOURCE is outside every
    # bounding set): without this every sandbox fails in runc.
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        runtime_path = $(toml_str "$shim")
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [$(toml_str "$cni_bin")]
      conf_dir = $(toml_str "$cni_conf")
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
EOF
}

crio_config() {
    local conf=$1 lib=$2 run=$3 socket=$4 pinns=$5 pause=$6
    local cni_bin=${7:-/opt/cni/bin} cni_conf=${8:-/etc/cni/net.d} log_dir=${9:-/var/log/pods}
    cat << EOF
# CRI-O v1.34.0 (scripts/lib/runtime-configs.sh): every path it writes is under
# $lib (kept across a reboot) or $run (wiped by one).
[crio]
root = $(toml_str "$lib/containers/storage")
runroot = $(toml_str "$run/containers/storage")
storage_driver = "overlay"
log_dir = $(toml_str "$log_dir")
version_file = $(toml_str "$run/crio/version")
version_file_persist = $(toml_str "$lib/crio/version")
clean_shutdown_file = $(toml_str "$lib/crio/clean.shutdown")

[crio.api]
listen = $(toml_str "$socket")
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
cgroup_manager = "cgroupfs"
# Debian's runc 1.1.5: Debian's crun 1.8.1 refuses the runtime-spec version
# CRI-O 1.34 writes ("unknown version specified" for every container).
default_runtime = "runc"
namespaces_dir = $(toml_str "$run/ns")
pinns_path = $(toml_str "$pinns")
container_exits_dir = $(toml_str "$run/crio/exits")
container_attach_socket_dir = $(toml_str "$run/crio")
# Nothing from /usr/share/containers/oci/hooks.d or /etc/containers/oci/hooks.d.
hooks_dir = []
# CRI-O's defaults plus NET_RAW, which containerd grants by default: the test
# pods ping (a pod on CRI-O's defaults would need it in its securityContext).
default_capabilities = ["CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "SETGID", "SETUID", "SETPCAP",
  "NET_BIND_SERVICE", "KILL", "NET_RAW"]
log_to_journald = false

$(crio_runtime runc "$run")

[crio.image]
# Never pulled: the node imports it.
pause_image = $(toml_str "$pause")
signature_policy = $(toml_str "$conf/policy.json")
signature_policy_dir = $(toml_str "$conf/policies")

[crio.network]
network_dir = $(toml_str "$cni_conf")
plugin_dirs = [$(toml_str "$cni_bin")]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
EOF
}

# crio_runtime NAME RUN: the runtime handler NAME, Debian's /usr/bin/NAME (or
# CRIO_RUNTIME_PATH, e.g. a wrapper) with conmon, its state under RUN/NAME.
crio_runtime() {
    cat << EOF
[crio.runtime.runtimes.$1]
runtime_path = $(toml_str "${CRIO_RUNTIME_PATH:-/usr/bin/$1}")
runtime_type = "oci"
runtime_root = $(toml_str "$2/$1")
monitor_path = "/usr/bin/conmon"
# With cgroupfs, conmon goes into the pod's cgroup.
monitor_cgroup = "pod"
EOF
}

crio_storage() {
    local lib=$1 run=$2
    cat << EOF
[storage]
driver = "overlay"
graphroot = $(toml_str "$lib/containers/storage")
runroot = $(toml_str "$run/containers/storage")
EOF
}

crio_policy() {
    cat << 'EOF'
{
    "default": [{"type": "insecureAcceptAnything"}]
}
EOF
}

crio_registries() {
    cat << 'EOF'
# No registry: images are imported. A short name is not expanded, and there is
# no mirror or search list (a fully qualified name still names its registry, and
# a pull of it fails here: no registry is reachable).
unqualified-search-registries = []
short-name-mode = "enforcing"
EOF
}

archive_name() {
    tar -xOf "$1" index.json | python3 -c '
import json, sys
m = json.load(sys.stdin)["manifests"]
if len(m) != 1:
    sys.exit("want one manifest, found %d" % len(m))
print(m[0]["annotations"]["org.opencontainers.image.ref.name"])'
}

check_runtime() {
    local b need=() tools=()
    case "$1" in
        containerd1)
            for b in containerd ctr runc containerd-shim-runc-v2; do
                command -v "$b" > /dev/null || die "$b is missing (containerd1): apt-get install containerd runc (scripts/setup does)"
            done
            for b in loopback portmap; do
                [ -x "/usr/lib/cni/$b" ] ||
                    die "/usr/lib/cni/$b is missing: apt-get install containernetworking-plugins (scripts/setup does)"
            done
            return 0
            ;;
        containerd2) need=(containerd2/containerd containerd2/ctr containerd2/containerd-shim-runc-v2) tools=(runc) ;;
        crio) need=(crio/crio crio/pinns) tools=(runc conmon skopeo) ;;
        *) die "'$1' is not a runtime: give containerd1, containerd2 or crio" ;;
    esac
    for b in "${need[@]}" cni-plugins/loopback cni-plugins/portmap; do
        [ -x "$BIN/$b" ] || die "$BIN/$b is missing ($1): run scripts/k8s-binaries runtimes"
    done
    for b in "${tools[@]}"; do
        command -v "$b" > /dev/null || die "$b is missing ($1): run scripts/k8s-binaries runtimes (it installs Debian's)"
    done
}

runtime_cni_plugins() {
    case "$1" in
        containerd1) printf '/usr/lib/cni' ;;
        *) printf '%s/cni-plugins' "$BIN" ;;
    esac
}

runtime_configs() {
    local word=$1 conf=$2 root=$3 run=$4 socket=$5 pause=$6 log_dir=${7:-/var/log/pods}
    mkdir -p "$conf"
    case "$word" in
        containerd1) containerd1_config "$root" "$run" "$socket" "$pause" > "$conf/containerd.toml" ;;
        containerd2)
            containerd2_config "$root" "$run" "$socket" "$BIN/containerd2/containerd-shim-runc-v2" \
                "$pause" > "$conf/containerd.toml"
            ;;
        crio)
            mkdir -p "$conf/crio.conf.d" "$conf/registries.conf.d" "$conf/policies"
            CRIO_RUNTIME_PATH="$REPO/scripts/lib/runc-restricted" crio_config "$conf" "$root" "$run" \
                "$socket" "$BIN/crio/pinns" "$pause" /opt/cni/bin /etc/cni/net.d "$log_dir" > "$conf/crio.conf"
            crio_storage "$root" "$run" > "$conf/storage.conf"
            crio_policy > "$conf/policy.json"
            crio_registries > "$conf/registries.conf"
            ;;
    esac
}

runtime_argv() {
    local conf=$2
    # shellcheck disable=SC2034  # RUNTIME_ARGV is read by the scripts that source this file
    case "$1" in
        containerd1) RUNTIME_ARGV=(/usr/bin/containerd --config "$conf/containerd.toml") ;;
        containerd2) RUNTIME_ARGV=("$BIN/containerd2/containerd" --config "$conf/containerd.toml") ;;
        crio)
            RUNTIME_ARGV=(env CONTAINERS_STORAGE_CONF="$conf/storage.conf" "$BIN/crio/crio"
                --config "$conf/crio.conf" --config-dir "$conf/crio.conf.d"
                --registries-conf "$conf/registries.conf" --registries-conf-dir "$conf/registries.conf.d")
            ;;
    esac
}

crio_copy_argv() {
    CRIO_COPY_ARGV=(env CONTAINERS_STORAGE_CONF="$1/storage.conf" skopeo --policy "$1/policy.json" copy --quiet "$2" "$3")
}

crio_store() {
    printf 'containers-storage:[overlay@%s/containers/storage+%s/containers/storage]' "$1" "$2"
}

runtime_import_argv() {
    local word=$1 conf=$2 socket=$3 store=$4 archive=$5 name
    # shellcheck disable=SC2034  # IMPORT_ARGV is read by the scripts that source this file
    case "$word" in
        containerd1) IMPORT_ARGV=(ctr --address "$socket" -n k8s.io images import "$archive") ;;
        containerd2) IMPORT_ARGV=("$BIN/containerd2/ctr" --address "$socket" -n k8s.io images import "$archive") ;;
        crio)
            name=$(archive_name "$archive") || die "no image name in $archive"
            crio_copy_argv "$conf" "oci-archive:$archive" "$store$name"
            IMPORT_ARGV=("${CRIO_COPY_ARGV[@]}")
            ;;
    esac
}

run_quiet() {
    local out
    out=$("$@" 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
}
