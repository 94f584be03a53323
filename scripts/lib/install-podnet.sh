# install_podnet tunnel|native: `kubectl apply -f deploy/` on the cluster of
# scripts/cluster, as it is (tunnel) or with native routing (the ConfigMap is
# created first with routing-mode native, auto-direct-node-routes and the native
# routing CIDR; `apply` keeps those keys because the ConfigMap has no
# last-applied annotation: with `create --save-config` apply would delete them,
# so kubectl's warning about the missing annotation is expected). Sourced by scripts/conformance and
# scripts/bench-peers; the caller defines REPO, POD_CIDR, die and kubectl.
install_podnet() {
    if [ "$1" = native ]; then
        kubectl -n kube-system create configmap podnet-config \
            --from-literal=routing-mode=native \
            --from-literal=auto-direct-node-routes=true \
            --from-literal=ipv4-native-routing-cidr="$POD_CIDR" > /dev/null
    fi
    kubectl apply -f "$REPO/deploy/" > /dev/null
    if [ "$1" = native ]; then
        [ "$(kubectl -n kube-system get configmap podnet-config -o jsonpath='{.data.routing-mode}')" = native ] ||
            die "the podnet ConfigMap lost routing-mode native"
    fi
}
