# shellcheck shell=bash
# Shared by scripts/bench-operator and scripts/bench-cluster (sourced, not run):
# a network namespace $NS with a bridge (10.250.0.1/24) for node namespaces,
# certificates and an admin kubeconfig in $T, a fresh etcd + kube-apiserver per
# call of start_control_plane, `podnet operator`, node namespaces on the bridge,
# and /proc figures. The caller sets ROOT, T, NS, K8S_BIN, PODNET_BIN and the
# arrays PIDS and NODE_NS (its cleanup kills those PIDs and deletes those
# namespaces).

# (Long-lived processes are started with `ip netns exec` itself, not through this
# function, so that $! is their PID: ip execs the command.)
in_ns() { ip netns exec "$NS" "$@"; }

bench_netns() {
    ip netns add "$NS"
    in_ns ip link set lo up
    # Node namespaces hang off this bridge; the API server listens on 10.250.0.1 too.
    in_ns ip link add br0 type bridge
    in_ns ip addr add 10.250.0.1/24 dev br0
    in_ns ip link set br0 up
}

# Certificates: a CA, the API server's serving cert, an admin client cert, the
# service-account key pair (scripts/k8s-testenv.md); $K is the admin kubeconfig,
# $T/node.kubeconfig the same for node namespaces (the server at 10.250.0.1).
bench_certs() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$T/ca.key" -out "$T/ca.crt" -days 1 -subj "/CN=podnet-bench-ca" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    leaf apiserver "/CN=kube-apiserver" \
        'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:10.250.0.1,DNS:localhost\n'
    leaf admin "/O=system:masters/CN=podnet-bench-admin" \
        'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n'
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$T/sa.key" 2>/dev/null
    openssl pkey -in "$T/sa.key" -pubout -out "$T/sa.pub" 2>/dev/null
    K=$T/kubeconfig
    cat > "$K" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: bench, cluster: {server: "https://127.0.0.1:6443", certificate-authority: "$T/ca.crt"}}]
users: [{name: admin, user: {client-certificate: "$T/admin.crt", client-key: "$T/admin.key"}}]
contexts: [{name: bench, context: {cluster: bench, user: admin, namespace: kube-system}}]
current-context: bench
EOF
    sed 's|https://127.0.0.1:6443|https://10.250.0.1:6443|' "$K" > "$T/node.kubeconfig"
    CURL=(curl -fsS --cacert "$T/ca.crt" --cert "$T/admin.crt" --key "$T/admin.key")
    # The drivers' API arguments, from the control plane's namespace and from a node's.
    # shellcheck disable=SC2034  # read by the scripts that source this file
    API_ARGS=(--server https://127.0.0.1:6443 --ca "$T/ca.crt" --cert "$T/admin.crt" --key "$T/admin.key")
    # shellcheck disable=SC2034  # read by the scripts that source this file
    NODE_API_ARGS=(--server https://10.250.0.1:6443 --ca "$T/ca.crt" --cert "$T/admin.crt" --key "$T/admin.key")
}
leaf() {
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$T/$1.key" -out "$T/$1.csr" -subj "$2" 2>/dev/null
    printf '%b' "$3" > "$T/$1.ext"
    openssl x509 -req -in "$T/$1.csr" -CA "$T/ca.crt" -CAkey "$T/ca.key" -CAcreateserial \
        -out "$T/$1.crt" -days 1 -extfile "$T/$1.ext" 2>/dev/null
}
kc() { in_ns "$K8S_BIN/kubectl" --kubeconfig "$K" --cache-dir "$T/kube-cache" "$@"; }

ETCD_PID='' API_PID=''
start_control_plane() {
    rm -rf "$T/etcd"
    ip netns exec "$NS" "$K8S_BIN/etcd" --name bench --data-dir "$T/etcd" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster bench=http://127.0.0.1:2380 --quota-backend-bytes=8589934592 \
        --unsafe-no-fsync --log-level warn > "$T/etcd.log" 2>&1 &
    ETCD_PID=$!; PIDS+=("$ETCD_PID")
    ip netns exec "$NS" "$K8S_BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
        --bind-address=0.0.0.0 --advertise-address=127.0.0.1 --secure-port=6443 \
        --tls-cert-file="$T/apiserver.crt" --tls-private-key-file="$T/apiserver.key" \
        --client-ca-file="$T/ca.crt" \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-account-key-file="$T/sa.pub" --service-account-signing-key-file="$T/sa.key" \
        --service-cluster-ip-range=10.96.0.0/16 --authorization-mode=Node,RBAC \
        --disable-admission-plugins=ServiceAccount --endpoint-reconciler-type=none \
        > "$T/apiserver.log" 2>&1 &
    API_PID=$!; PIDS+=("$API_PID")
    for _ in $(seq 1 600); do
        in_ns "${CURL[@]}" https://127.0.0.1:6443/readyz >/dev/null 2>&1 && break
        kill -0 "$API_PID" 2>/dev/null || { tail -n 30 "$T/apiserver.log" >&2; exit 1; }
        sleep 0.1
    done
    kc get namespace kube-system >/dev/null 2>&1 || kc create namespace kube-system >/dev/null 2>&1 || true
}
stop_control_plane() {
    stop_pid "$API_PID"
    stop_pid "$ETCD_PID"
}
# SIGTERM, up to 15 s to exit, then SIGKILL: an operator releasing its Lease or
# an API server draining requests against a stopped etcd can hang (a cleanup after
# a failure stops everything at once).
stop_pid() {
    kill "$1" 2>/dev/null || return 0
    local i
    for ((i = 0; i < 150; i++)); do
        kill -0 "$1" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

# /proc figures of a process: CPU seconds (user+system), peak and current RSS in MiB.
cpu_seconds() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"; }
peak_rss_mib() { awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
rss_mib() { awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }

start_operator() { # LOG [ARGS...] -> $OPERATOR_PID, holding the Lease (default: cluster-pool, a /10 in /24s)
    local log=$1; shift
    [ $# -gt 0 ] || set -- --ipam cluster-pool --cluster-pool-ipv4-cidr 10.0.0.0/10 --cluster-pool-ipv4-mask-size 24
    kc apply -f "$ROOT/deploy/crds/" >/dev/null
    ip netns exec "$NS" "$PODNET_BIN" operator --k8s-kubeconfig-path "$K" --leader-election-namespace kube-system \
        --skip-crd-creation "$@" > "$log" 2>&1 &
    OPERATOR_PID=$!; PIDS+=("$OPERATOR_PID")
    for _ in $(seq 1 1200); do
        [ -n "$(kc get lease -n kube-system -o name 2>/dev/null | grep podnet-operator || true)" ] && return
        kill -0 "$OPERATOR_PID" 2>/dev/null || { tail -n 30 "$log" >&2; exit 1; }
        sleep 0.1
    done
    echo "$0: the operator did not take the Lease" >&2
    exit 1
}

add_node_ns() { # NAMESPACE NODE_NAME IP [POD_CIDR]: a namespace on the bridge and its Node object
    local ns=$1 name=$2 ip=$3 cidr=${4:-} i=$((${#NODE_NS[@]} + 1))
    ip netns add "$ns"; NODE_NS+=("$ns")
    ip -n "$ns" link set lo up
    ip -n "$NS" link add "n$i" type veth peer name eth0 netns "$ns"
    ip -n "$NS" link set "n$i" master br0 up
    ip -n "$ns" addr add "$ip/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [ -n "$cidr" ]; then
        printf 'apiVersion: v1\nkind: Node\nmetadata: {name: %s}\nspec: {podCIDR: "%s", podCIDRs: ["%s"]}\n' "$name" "$cidr" "$cidr" | kc apply -f - >/dev/null
    else
        printf 'apiVersion: v1\nkind: Node\nmetadata: {name: %s}\n' "$name" | kc apply -f - >/dev/null
    fi
    kc patch node "$name" --subresource=status --type=merge \
        -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"$ip\"}]}}" >/dev/null
}
