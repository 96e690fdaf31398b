{{/*
Names, labels and the small lookups the component template shares.
*/}}

{{- define "tollgate.name" -}}
{{- default "tollgate" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The base name of every resource: the release name, plus "-tollgate" when it lacks it. */}}
{{- define "tollgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "tollgate.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's resource name; 54 characters at most so that "-headless" still fits in 63. (dict "root" $ "name" "api-edge") */}}
{{- define "tollgate.componentName" -}}
{{- printf "%s-%s" (include "tollgate.fullname" .root) .name | trunc 54 | trimSuffix "-" -}}
{{- end -}}

{{- define "tollgate.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag -}}
{{- end -}}

{{/* Labels every object carries. (dict "root" $ "name" "api-edge") */}}
{{- define "tollgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tollgate.selectorLabels" . }}
app.kubernetes.io/version: {{ include "tollgate.imageTag" .root | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: tollgate
{{- end -}}

{{/* The labels a component's Services, PodDisruptionBudget and ReplicaSets select on. */}}
{{- define "tollgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tollgate.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{/* The image reference: [registry/]repository, then @digest or :tag. (dict "root" $ "c" $component) */}}
{{- define "tollgate.image" -}}
{{- $repo := .c.image.repository -}}
{{- with .root.Values.image.registry -}}{{- $repo = printf "%s/%s" (trimSuffix "/" .) $repo -}}{{- end -}}
{{- if .c.image.digest -}}
{{- printf "%s@%s" $repo .c.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default (include "tollgate.imageTag" .root) .c.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The number of the port called .port in component .c (named .name). */}}
{{- define "tollgate.portNumber" -}}
{{- $found := 0 -}}
{{- range .c.ports -}}{{- if eq .name $.port -}}{{- $found = .port -}}{{- end -}}{{- end -}}
{{- if not $found -}}{{- fail (printf "components.%s: no port named %q in its ports" .name .port) -}}{{- end -}}
{{- $found -}}
{{- end -}}

{{/* Whether any enabled component mounts the Tollgate configuration file: "true" or "". */}}
{{- define "tollgate.needsConfig" -}}
{{- range $name, $c := .Values.components -}}{{- if and $c.enabled $c.configFile -}}true{{- end -}}{{- end -}}
{{- end -}}

{{- define "tollgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tollgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An env var read from a key of an existing Secret: (dict "env" "NAME" "ref" $ref) */}}
{{- define "tollgate.secretKeyRef" -}}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ .ref.secretName }}
      key: {{ .ref.key }}
      {{- if .ref.optional }}
      optional: true
      {{- end }}
{{- end -}}

{{/*
The Secret holding a component's gRPC certificate (tls.crt, tls.key, ca.crt):
internalAuth.tls.secretNames.<component>, else <fullname>-<component>-grpc-tls.
*/}}
{{- define "tollgate.grpcTlsSecret" -}}
{{- $names := .root.Values.internalAuth.tls.secretNames | default dict -}}
{{- get $names .name | default (printf "%s-grpc-tls" (include "tollgate.componentName" .)) -}}
{{- end }}

{{/*
The env of internal gRPC authentication (docs/kubernetes.md, "Internal authentication"): the files mounted
at /var/run/secrets/tollgate-internal, or INTERNAL_AUTH=off.
*/}}
{{- define "tollgate.internalAuthEnv" -}}
{{- if eq .auth.mode "off" -}}
- name: INTERNAL_AUTH
  value: "off"
{{- else if eq .auth.mode "tls" -}}
- name: INTERNAL_AUTH
  value: tls
- name: GRPC_TLS_CERT_FILE
  value: /var/run/secrets/tollgate-internal/tls.crt
- name: GRPC_TLS_KEY_FILE
  value: /var/run/secrets/tollgate-internal/tls.key
- name: GRPC_TLS_CA_FILE
  value: /var/run/secrets/tollgate-internal/ca.crt
{{- else -}}
- name: INTERNAL_AUTH
  value: token
{{- if .role.client }}
- name: INTERNAL_TOKEN_FILE
  value: /var/run/secrets/tollgate-internal/token
{{- end }}
{{- if .role.server }}
- name: INTERNAL_PEER_TOKENS_FILE
  value: /var/run/secrets/tollgate-internal/peers
{{- end }}
{{- end }}
{{- end }}
