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
