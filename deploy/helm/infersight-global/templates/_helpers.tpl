{{- define "infersight-global.kafka" -}}infersight-global-kafka{{- end -}}
{{- define "infersight-global.bootstrap" -}}{{ include "infersight-global.kafka" . }}-kafka-bootstrap:9092{{- end -}}
{{- define "infersight-global.labels" -}}
app.kubernetes.io/part-of: infersight
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{/* Refuse a region without a bootstrap address, naming it (values.schema.json checks names and duplicates). */}}
{{- define "infersight-global.checkRegions" -}}
{{- range .Values.regions }}
{{- if not (hasKey $.Values.regionBootstrapServers .) }}
{{- fail (printf "regionBootstrapServers has no entry for region %q" .) }}
{{- end }}
{{- end }}
{{- end -}}
{{/* A region's regional Kafka as MM2 and the region status service reach it (its "mirror" listener). */}}
{{- define "infersight-global.regionBootstrap" -}}{{ index .root.Values.regionBootstrapServers .region }}{{- end -}}
{{/* The Secret holding a region's cluster CA (ca.crt), which the deployer copies from the region (values.yaml). */}}
{{- define "infersight-global.regionCaSecret" -}}{{ printf "%s%s" .root.Values.regionTls.caSecretPrefix .region }}{{- end -}}
