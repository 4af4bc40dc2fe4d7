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
