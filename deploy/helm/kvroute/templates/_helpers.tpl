{{/* Labels on every object the chart writes (metadata only: selectors keep the kustomize ones). */}}
{{- define "kvroute.labels" -}}
app.kubernetes.io/name: kvroute
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The pool Service's name and namespace, from pool.service (NAME.NAMESPACE.svc.DOMAIN). */}}
{{- define "kvroute.poolName" -}}
{{- index (splitList "." .Values.pool.service) 0 -}}
{{- end -}}
{{- define "kvroute.poolNamespace" -}}
{{- index (splitList "." .Values.pool.service) 1 -}}
{{- end -}}

{{/* The gateway listener port the HTTP_FILTER, LISTENER and NETWORK_FILTER patches match. */}}
{{- define "kvroute.listenerPort" -}}
{{- if not (kindIs "invalid" .Values.gateway.listenerPort) -}}
{{- .Values.gateway.listenerPort | int -}}
{{- else if eq .Values.gateway.api "gatewayApi" -}}
{{- .Values.gateway.port | int -}}
{{- else -}}
8080
{{- end -}}
{{- end -}}

{{/*
What the schema cannot say, refused with the value named: kvroute's configuration must route in
the pool Service's cluster, the example pools must be that Service, and a Gateway API route
reaches only its own namespace's Services.
*/}}
{{- define "kvroute.validate" -}}
{{- $v := .Values -}}
{{- $cluster := printf "outbound|%d||%s" ($v.pool.port | int) $v.pool.service -}}
{{- $clusters := list -}}
{{- range $v.config.pools -}}
{{- $clusters = append $clusters (.cluster | default "") -}}
{{- end -}}
{{- if not (has $cluster $clusters) -}}
{{- fail (printf "config.pools: no pool has cluster %q, the Istio cluster of pool.service %s port %d (clusters: %s)" $cluster $v.pool.service ($v.pool.port | int) (join ", " $clusters)) -}}
{{- end -}}
{{- $poolName := include "kvroute.poolName" . -}}
{{- $poolNs := include "kvroute.poolNamespace" . -}}
{{- if ne $v.modelServers.layout "none" -}}
{{- $want := ternary $v.modelServers.name (printf "%s-decode" $v.modelServers.name) (eq $v.modelServers.layout "aggregated") -}}
{{- if or (ne $poolName $want) (ne $poolNs $v.modelServers.namespace) (ne ($v.pool.port | int) 8000) -}}
{{- fail (printf "pool.service %s is not the example pool's Service: modelServers.layout %s writes %s.%s port 8000 (the decode Service for pd)" $v.pool.service $v.modelServers.layout $want $v.modelServers.namespace) -}}
{{- end -}}
{{- end -}}
{{- if and (eq $v.gateway.api "gatewayApi") (ne $poolNs $v.gateway.namespace) -}}
{{- fail (printf "gateway.api gatewayApi: pool.service %s is not in gateway.namespace %s (the HTTPRoute reaches another namespace's Service only with a ReferenceGrant)" $v.pool.service $v.gateway.namespace) -}}
{{- end -}}
{{- end -}}
