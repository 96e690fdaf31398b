{{/*
Helpers of the operations objects (networkpolicies.yaml, podmonitors.yaml, prometheusrule.yaml,
dashboard.yaml): labels of objects that belong to the release rather than to one component, and
the selector of one component's pods.
*/}}

{{/* Labels of a release-wide object. (dict "root" $ "part" "network-policy") */}}
{{- define "tollgate.opsLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "tollgate.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ include "tollgate.imageTag" .root | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: tollgate
tollgate.io/ops: {{ .part }}
{{- end -}}

{{/* Every pod of the release. */}}
{{- define "tollgate.releaseSelector" -}}
app.kubernetes.io/name: {{ include "tollgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* TCP ports of a NetworkPolicy rule from a list of numbers. (list 4222) */}}
{{- define "tollgate.tcpPorts" -}}
{{- range . }}
- port: {{ . }}
  protocol: TCP
{{- end }}
{{- end -}}
