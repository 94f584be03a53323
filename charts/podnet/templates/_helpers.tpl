{{/*
podnet's chart helpers: the image, the multi-pool auto-create option, the
refusal of Cilium values whose silent absence would be unsafe, and the list of
Cilium values that are set but that podnet ignores (NOTES.txt). The rule:
docs/helm.md, "Cilium values podnet does not implement".
*/}}

{{/* The image of every podnet container. */}}
{{- define "podnet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{/* An imagePullPolicy line under a container's image, when the value is set. */}}
{{- define "podnet.pullPolicy" -}}
{{- with .Values.image.pullPolicy }}
          imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/*
A cluster pool's CIDRs, space-separated: Cilium's chart takes a list or a
string (written as it is).
*/}}
{{- define "podnet.cidrList" -}}
{{- if kindIs "string" . }}{{ . }}{{ else }}{{ join " " . }}{{ end }}
{{- end }}

{{/*
underlay-protocol: ipv4 or ipv6 as set; Cilium's "" and "auto" (its default)
become the family the pods use, IPv4 when they use both.
*/}}
{{- define "podnet.underlay" -}}
{{- if has .Values.underlayProtocol (list "ipv4" "ipv6") }}{{ .Values.underlayProtocol }}
{{- else if .Values.ipv4.enabled }}ipv4{{ else }}ipv6{{ end }}
{{- end }}

{{/*
auto-create-cilium-pod-ip-pools in Cilium's grammar, one pool a word:
`<pool>=ipv4-cidrs:<cidr>,<cidr>;ipv4-mask-size:<n>;ipv6-cidrs:...;ipv6-mask-size:<n>`.
*/}}
{{- define "podnet.autoCreatePools" -}}
{{- $pools := list }}
{{- range $name, $pool := . }}
{{- $fields := list }}
{{- range $family := list "ipv4" "ipv6" }}
{{- with index $pool $family }}
{{- $fields = append $fields (printf "%s-cidrs:%s" $family (join "," .cidrs)) }}
{{- $fields = append $fields (printf "%s-mask-size:%v" $family .maskSize) }}
{{- end }}
{{- end }}
{{- $pools = append $pools (printf "%s=%s" $name (join ";" $fields)) }}
{{- end }}
{{- join " " $pools }}
{{- end }}

{{/*
The value at a dotted path of the values (any level may be missing: then
""), as JSON {"v": value} (a template returns text).
*/}}
{{- define "podnet.lookupValue" -}}
{{- $v := .values }}
{{- range $key := splitList "." .path }}
{{- if kindIs "map" $v }}{{ $v = get $v $key }}{{ else }}{{ $v = "" }}{{ end }}
{{- end }}
{{- toJson (dict "v" $v) }}
{{- end }}

{{/*
Cilium values podnet refuses: set, their feature would silently be missing,
and that missing is unsafe (traffic in clear, no Service datapath, no host
policy, a chained CNI replaced). Each fails with what to do.
*/}}
{{- define "podnet.validate" -}}
{{- $values := .Values | toJson | fromJson }}
{{- $refused := dict
  "encryption.enabled" "podnet does not encrypt pod traffic between nodes (no WireGuard or IPsec): with it left out, traffic you asked to encrypt would cross the network in clear"
  "kubeProxyReplacement" "podnet does not implement Services: keep kube-proxy running and leave this unset or false"
  "hostFirewall.enabled" "podnet enforces no host policies: the host firewall you asked for would not exist"
  "cni.chainingMode" "podnet is the primary CNI, not a chained plugin (it chains portmap itself): it would replace the CNI config of the plugin you chain after (cni-exclusive)"
}}
{{- range $path := keys $refused | sortAlpha }}
{{- $v := (include "podnet.lookupValue" (dict "values" $values "path" $path) | fromJson).v }}
{{- if not (has (toString $v) (list "" "false" "<nil>" "none" "disabled" "portmap")) }}
{{- fail (printf "%s=%v is refused: %s (docs/helm.md)" $path $v (get $refused $path)) }}
{{- end }}
{{- end }}
{{- if not (or .Values.ipv4.enabled .Values.ipv6.enabled) }}
{{- fail "ipv4.enabled and ipv6.enabled are both false: pods need at least one family" }}
{{- end }}
{{- if regexMatch "(^|/)cilium(-[a-z]+)?$" .Values.image.repository }}
{{- fail (printf "image.repository=%s is a Cilium image: podnet's chart runs podnet's image (leave image.* out of a Cilium values file)" .Values.image.repository) }}
{{- end }}
{{- end }}

{{/*
Cilium values that podnet accepts and ignores, as "path=value" for the ones
set to something other than off (NOTES.txt lists them).
*/}}
{{- define "podnet.ignored" -}}
{{- $values := .Values | toJson | fromJson }}
{{- $found := list }}
{{- range $path := list "bandwidthManager.bbr" "hubble.enabled" "hubble.relay.enabled" "hubble.ui.enabled" "l7Proxy" "envoy.enabled" "ipMasqAgent.enabled" "bpf.masquerade" "bpf.datapathMode" "egressGateway.enabled" "bgpControlPlane.enabled" "gatewayAPI.enabled" "l2podAnnouncements.enabled" "localRedirectPolicy" "localRedirectPolicies.enabled" "clustermesh.useAPIServer" "authentication.mutual.spire.enabled" "nodePort.enabled" "socketLB.enabled" "externalIPs.enabled" "hostPort.enabled" "image.useDigest" "k8sServiceHost" "prometheus.serviceMonitor.enabled" "operator.prometheus.serviceMonitor.enabled" }}
{{- $v := (include "podnet.lookupValue" (dict "values" $values "path" $path) | fromJson).v }}
{{- if not (has (toString $v) (list "" "false" "<nil>" "veth" "disabled" "0")) }}
{{- $found = append $found (printf "%s=%v" $path $v) }}
{{- end }}
{{- end }}
{{- join "\n" $found }}
{{- end }}
