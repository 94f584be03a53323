# shellcheck shell=bash
# Config files for the container runtimes scripts/k8s-binaries builds with its
# `runtimes` argument (issue 28): containerd v2.4.2 and CRI-O v1.34.0. Source it;
# each function prints one file to stdout, so the caller picks where it goes:
#
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
