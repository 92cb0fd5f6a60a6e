{{- define "carve.name" -}}carve{{- end -}}
{{- define "carve.labels" -}}
app.kubernetes.io/name: carve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}
{{- define "carve.selectorLabels" -}}
app.kubernetes.io/name: carve
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The names of the node config's address pools, as a JSON list.
*/}}
{{- define "carve.nodeConfigPools" -}}
{{- $names := list }}
{{- range (dig "netdev" "pools" list (fromYaml (default "{}" .Values.nodeConfig))) }}
{{- $names = append $names .name }}
{{- end }}
{{- toJson $names }}
{{- end }}

{{/*
The pools the nic DeviceClass lets its claims name, as a JSON list:
nicClassAllowedPools where set; else the node config's one pool where it
has exactly one; else none. Closed by default: with several pools, one class
for every tenant would let each take the others' subnets.
*/}}
{{- define "carve.nicClassPools" -}}
{{- if kindIs "invalid" .Values.nicClassAllowedPools }}
{{- $names := include "carve.nodeConfigPools" . | fromJsonArray }}
{{- if eq (len $names) 1 }}{{ toJson $names }}{{ else }}[]{{ end }}
{{- else }}
{{- toJson .Values.nicClassAllowedPools }}
{{- end }}
{{- end }}
