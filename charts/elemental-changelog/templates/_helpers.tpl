{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "elemental-changelog.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's resources; also the Service name, so the certificate SAN. */}}
{{- define "elemental-changelog.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "elemental-changelog.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "elemental-changelog.selectorLabels" -}}
app.kubernetes.io/name: {{ include "elemental-changelog.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "elemental-changelog.labels" -}}
helm.sh/chart: {{ include "elemental-changelog.chart" . }}
{{ include "elemental-changelog.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: aggregated-apiserver
{{- end }}

{{- define "elemental-changelog.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "elemental-changelog.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the serving certificate (tls.crt, tls.key). */}}
{{- define "elemental-changelog.tlsSecretName" -}}
{{- if .Values.tls.existingSecret }}
{{- .Values.tls.existingSecret }}
{{- else }}
{{- printf "%s-tls" (include "elemental-changelog.fullname" .) }}
{{- end }}
{{- end }}

{{/* The DNS name kube-apiserver dials: <service>.<namespace>.svc */}}
{{- define "elemental-changelog.serviceDNS" -}}
{{- printf "%s.%s.svc" (include "elemental-changelog.fullname" .) .Release.Namespace }}
{{- end }}

{{- define "elemental-changelog.apiGroup" -}}changelog.elemental.cattle.io{{- end }}
{{- define "elemental-changelog.apiVersion" -}}v1beta1{{- end }}

{{/* The server image: Rancher's system default registry, when set, replaces image.registry. */}}
{{- define "elemental-changelog.image" -}}
{{- $registry := .Values.image.registry }}
{{- with .Values.global }}{{ with .cattle }}{{ with .systemDefaultRegistry }}{{ $registry = . }}{{ end }}{{ end }}{{ end }}
{{- $repository := printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- if $registry }}
{{- printf "%s/%s" (trimSuffix "/" $registry) $repository }}
{{- else }}
{{- $repository }}
{{- end }}
{{- end }}

{{/* server.namespaces as a list: a list, or a comma-separated string (Rancher's questions). */}}
{{- define "elemental-changelog.namespaces" -}}
{{- $namespaces := .Values.server.namespaces }}
{{- if kindIs "string" $namespaces }}
{{- $namespaces = splitList "," $namespaces }}
{{- end }}
{{- range $namespaces }}
{{- with trim . }}
- {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* The rules that let a user read changelogs and summaries: for the viewer ClusterRole and Rancher's roles. */}}
{{- define "elemental-changelog.readerRules" -}}
- apiGroups: [{{ include "elemental-changelog.apiGroup" . | quote }}]
  resources: ["managedosversions"]
  verbs: ["get", "list"]
- apiGroups: [{{ include "elemental-changelog.apiGroup" . | quote }}]
  resources: ["managedosversions/changelog"]
  verbs: ["get"]
{{- end }}
