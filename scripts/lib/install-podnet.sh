# shellcheck shell=bash
# install_podnet tunnel|native [ipv4|dual|ipv6 [KEY=VALUE...]]: `kubectl apply -f deploy/` on the
# cluster of scripts/cluster, with the ConfigMap changes docs/kubernetes.md
# documents for the routing mode and the cluster's IP family (default: the
# running cluster's, `scripts/cluster ip-family`):
#   native  routing-mode native, auto-direct-node-routes, the native routing CIDR
#           of each family;
#   dual    enable-ipv6 and the IPv6 cluster pool (CIDR and mask size);
#   ipv6    ... and enable-ipv4 "false" without the IPv4 cluster pool (its CIDR
#           and mask size removed: Cilium refuses an IPv4 pool with IPv4 off),
#           the IPv6 underlay (underlay-protocol).
# Each KEY=VALUE after the family is one more ConfigMap change (an empty family
# is the running cluster's).
# The edited manifests are applied as a user who changed the ConfigMap's values
# would apply them. Sourced by scripts/conformance, scripts/soak and
# scripts/bench-peers; the caller defines REPO, POD_CIDR, die and kubectl.
POD_CIDR6=fd00:10:244::/104

install_podnet() {
    local routing=$1 family=${2:-} lines set=()
    shift
    [ "$#" = 0 ] || shift
    [ -n "$family" ] || family=$(bash "$REPO/scripts/cluster" ip-family)
    lines=$(podnet_settings "$routing" "$family") || die "install_podnet: no settings for $routing $family"
    [ -z "$lines" ] || mapfile -t set <<< "$lines"
    set+=("$@")
    podnet_manifests "${set[@]}" | kubectl apply -f - > /dev/null ||
        die "kubectl apply -f deploy/ (with ${set[*]:-no change}) failed"
}

# podnet_settings tunnel|native ipv4|dual|ipv6: the ConfigMap changes of that
# routing mode and IP family, one KEY=VALUE a line (integration/cluster uses them
# too).
podnet_settings() {
    local routing=$1 family=$2 set=()
    if [ "$routing" = native ]; then
        set+=(routing-mode=native auto-direct-node-routes=true)
        [ "$family" = ipv6 ] || set+=(ipv4-native-routing-cidr="${POD_CIDR:-10.244.0.0/16}")
        [ "$family" = ipv4 ] || set+=(ipv6-native-routing-cidr="$POD_CIDR6")
    fi
    case "$family" in
        ipv4) ;;
        dual) set+=(enable-ipv6=true cluster-pool-ipv6-cidr="$POD_CIDR6" cluster-pool-ipv6-mask-size=120) ;;
        ipv6)
            set+=(enable-ipv4=false -cluster-pool-ipv4-cidr -cluster-pool-ipv4-mask-size
                enable-ipv6=true cluster-pool-ipv6-cidr="$POD_CIDR6"
                cluster-pool-ipv6-mask-size=120 underlay-protocol=ipv6)
            ;;
        *)
            printf 'podnet_settings: IP family %s is not ipv4, dual or ipv6\n' "$family" >&2
            return 1
            ;;
    esac
    [ "${#set[@]}" = 0 ] || printf '%s\n' "${set[@]}"
}

# podnet_manifests KEY=VALUE|-KEY...: deploy/'s manifests with the keys set in
# the data of the ConfigMap podnet-config (deploy/podnet.yaml's first document):
# replaced where it has them, added where not; a -KEY removed.
podnet_manifests() {
    local f
    for f in "$REPO"/deploy/*.yaml; do
        [ -f "$f" ] || continue
        if [ "$(basename "$f")" = podnet.yaml ]; then
            awk -v sets="$(printf '%s\n' "$@")" '
                BEGIN { n = split(sets, kv, "\n"); for (i = 1; i <= n; i++) if (kv[i] ~ /^-/) {
                    gone[substr(kv[i], 2)] = 1 } else if (kv[i] != "") {
                    k = substr(kv[i], 1, index(kv[i], "=") - 1); v[k] = substr(kv[i], index(kv[i], "=") + 1); order[++m] = k } }
                /^data:/ && !done { indata = 1; print; next }
                indata && /^---/ { for (i = 1; i <= m; i++) if (!(order[i] in seen)) printf "  %s: \"%s\"\n", order[i], v[order[i]]
                                   indata = 0; done = 1 }
                indata && match($0, /^  [a-z0-9-]+:/) { k = substr($0, 3, RLENGTH - 3)
                    if (k in gone) next
                    if (k in v) { printf "  %s: \"%s\"\n", k, v[k]; seen[k] = 1; next } }
                { print }' "$f"
        else
            cat "$f"
        fi
        printf '\n---\n'
    done
}
