{{/* Labels on every object the chart writes (metadata only: selectors keep the kustomize ones). */}}
{{- define "kvroute.labels" -}}
app.kubernetes.io/name: kvroute
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
The pool Service (NAME.NAMESPACE.svc.DOMAIN) and its port: pool.service and pool.port, or with
inferencePool.name set, the ClusterIP Service the chart makes for that InferencePool
(templates/inference-pool.yaml) and the pool's target port.
*/}}
{{- define "kvroute.poolService" -}}
{{- $ip := .Values.inferencePool -}}
{{- if $ip.name -}}
{{- printf "%s.%s.svc.%s" (include "kvroute.inferencePoolService" .) $ip.namespace $ip.clusterDomain -}}
{{- else -}}
{{- .Values.pool.service -}}
{{- end -}}
{{- end -}}
{{- define "kvroute.poolPort" -}}
{{- if .Values.inferencePool.name -}}
{{- (index .Values.inferencePool.targetPorts 0).number | int -}}
{{- else -}}
{{- .Values.pool.port | int -}}
{{- end -}}
{{- end -}}
{{- define "kvroute.inferencePoolService" -}}
{{- .Values.inferencePool.serviceName | default (printf "%s-kvroute" .Values.inferencePool.name) -}}
{{- end -}}
{{- define "kvroute.poolName" -}}
{{- index (splitList "." (include "kvroute.poolService" .)) 0 -}}
{{- end -}}
{{- define "kvroute.poolNamespace" -}}
{{- index (splitList "." (include "kvroute.poolService" .)) 1 -}}
{{- end -}}

{{/*
kvroute's configuration: config, or with inferencePool.name set, config with its pools replaced by
the InferencePool's (its Service's cluster) and, for failureMode FailOpen, on_no_endpoint
passthrough unless config sets it (tools/inferencepool.py writes the same).
*/}}
{{- define "kvroute.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- $ip := .Values.inferencePool -}}
{{- if $ip.name -}}
{{- $cluster := printf "outbound|%s||%s" (include "kvroute.poolPort" .) (include "kvroute.poolService" .) -}}
{{- $_ := set $config "pools" (list (dict "name" $ip.name "cluster" $cluster)) -}}
{{- if and (eq $ip.failureMode "FailOpen") (not (hasKey $config "on_no_endpoint")) -}}
{{- $_ := set $config "on_no_endpoint" "passthrough" -}}
{{- end -}}
{{- end -}}
{{- toJson $config -}}
{{- end -}}

{{/*
The Envoy routes kvroute runs on (gateway.scoped), as a JSON list: gateway.modelRoutes, else the
name Istio gives the route this chart renders: the VirtualService's http route `inference` (api
istio), or the HTTPRoute's rule 0, NAMESPACE.NAME.0 (gatewayApi). api none and gatewayRef route
with the user's own routes, whose names the chart cannot know: there the value is required.
*/}}
{{- define "kvroute.modelRoutes" -}}
{{- $g := .Values.gateway -}}
{{- if $g.modelRoutes -}}
{{- toJson $g.modelRoutes -}}
{{- else if eq $g.api "istio" -}}
{{- toJson (list "inference") -}}
{{- else if eq $g.api "gatewayApi" -}}
{{- toJson (list (printf "%s.%s.0" $g.namespace $g.routeName)) -}}
{{- else -}}
{{- fail (printf "gateway.modelRoutes: with gateway.api %s name the Envoy routes of your model routes (a VirtualService http route's name; an HTTPRoute rule's name, else NAMESPACE.HTTPROUTE.RULE-INDEX), or set gateway.scoped false to run kvroute on the whole listener" $g.api) -}}
{{- end -}}
{{- end -}}

{{/* The gateway listener port the HTTP_FILTER, LISTENER and NETWORK_FILTER patches match. */}}
{{- define "kvroute.listenerPort" -}}
{{- if not (kindIs "invalid" .Values.gateway.listenerPort) -}}
{{- .Values.gateway.listenerPort | int -}}
{{- else if has .Values.gateway.api (list "gatewayApi" "gatewayRef") -}}
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
{{- if $v.inferencePool.name -}}
{{- if ne $v.modelServers.layout "none" -}}
{{- fail (printf "inferencePool.name %s: modelServers.layout must be none (the InferencePool's pods are the pool)" $v.inferencePool.name) -}}
{{- end -}}
{{- else if not (has $cluster $clusters) -}}
{{- fail (printf "config.pools: no pool has cluster %q, the Istio cluster of pool.service %s port %d (clusters: %s)" $cluster $v.pool.service ($v.pool.port | int) (join ", " $clusters)) -}}
{{- end -}}
{{- $poolName := include "kvroute.poolName" . -}}
{{- $poolNs := include "kvroute.poolNamespace" . -}}
{{- if ne $v.modelServers.layout "none" -}}
{{- $n := $v.modelServers.name -}}
{{- $want := get (dict "aggregated" $n "pd" (printf "%s-decode" $n) "lws" (printf "%s-leader" $n)) $v.modelServers.layout -}}
{{- if or (ne $poolName $want) (ne $poolNs $v.modelServers.namespace) (ne ($v.pool.port | int) 8000) -}}
{{- fail (printf "pool.service %s is not the example pool's Service: modelServers.layout %s writes %s.%s port 8000 (pd: the decode Service; lws: the groups' leaders)" $v.pool.service $v.modelServers.layout $want $v.modelServers.namespace) -}}
{{- end -}}
{{- end -}}
{{- if and (eq $v.gateway.api "gatewayApi") (ne $poolNs $v.gateway.namespace) -}}
{{- fail (printf "gateway.api gatewayApi: pool Service %s is not in gateway.namespace %s (the HTTPRoute reaches another namespace's Service only with a ReferenceGrant)" (include "kvroute.poolService" .) $v.gateway.namespace) -}}
{{- end -}}
{{- end -}}
