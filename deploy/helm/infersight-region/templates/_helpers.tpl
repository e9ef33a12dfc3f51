{{- define "infersight-region.name" -}}infersight-{{ .Values.region }}{{- end -}}
{{- define "infersight-region.kafka" -}}infersight-{{ .Values.region }}-kafka{{- end -}}
{{- define "infersight-region.labels" -}}
app.kubernetes.io/part-of: infersight
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
infersight.io/region: {{ .Values.region }}
{{- end -}}
{{- define "infersight-region.gatewaySelector" -}}
app.kubernetes.io/name: infersight-gateway
infersight.io/region: {{ .Values.region }}
{{- end -}}
