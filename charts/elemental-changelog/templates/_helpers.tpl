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

{{/* The extension server's pods: a name of their own, so the server's selectors never match them. */}}
{{- define "elemental-changelog.extensionSelectorLabels" -}}
app.kubernetes.io/name: {{ include "elemental-changelog.name" . }}-extension
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "elemental-changelog.extensionLabels" -}}
helm.sh/chart: {{ include "elemental-changelog.chart" . }}
{{ include "elemental-changelog.extensionSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: ui-extension
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
  verbs: ["get", "list", "watch"]
- apiGroups: [{{ include "elemental-changelog.apiGroup" . | quote }}]
  resources: ["managedosversions/changelog"]
  verbs: ["get"]
{{- end }}

{{/*
The fleet view's machine reader: each MachineInventory's name, uid, labels (SMBIOS
machineUUID, serial numbers) and the OS it reports, and a machine's pending changelog. The
elemental-operator grants its MachineInventories to no built-in role, so neither is this
aggregated unless rbac.fleetView.aggregateTo says so.
*/}}
{{- define "elemental-changelog.machineReaderRules" -}}
- apiGroups: [{{ include "elemental-changelog.apiGroup" . | quote }}]
  resources: ["machineinventories"]
  verbs: ["get", "list", "watch"]
- apiGroups: [{{ include "elemental-changelog.apiGroup" . | quote }}]
  resources: ["machineinventories/changelog"]
  verbs: ["get"]
{{- end }}

{{/*
The fleet view's plan reader: a ManagedOSImage's upgrade plan, its machines grouped by the
version they run.
*/}}
{{- define "elemental-changelog.planReaderRules" -}}
- apiGroups: [{{ include "elemental-changelog.apiGroup" . | quote }}]
  resources: ["managedosimages/changelog"]
  verbs: ["get"]
{{- end }}

{{/*
Bytes of a memory quantity: an integer with an optional binary (Ki, Mi, Gi, Ti; also
KiB, MiB, GiB) or decimal (k, K, M, G, T) suffix. Anything else fails the install with a
message, not the pod at start.
*/}}
{{- define "elemental-changelog.bytes" -}}
{{- $q := toString . | trim }}
{{- $units := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "KiB" 1024 "MiB" 1048576 "GiB" 1073741824 "k" 1000 "K" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 }}
{{- $number := regexFind "^[0-9]+" $q }}
{{- $unit := trimPrefix $number $q }}
{{- if or (not $number) (not (hasKey $units $unit)) }}
{{- fail (printf "memory quantity %q: write a whole number with Ki, Mi or Gi (such as 256Mi)" $q) }}
{{- end }}
{{- mul (atoi $number) (get $units $unit) }}
{{- end }}

{{/*
A number of bytes as the server's size flags read it, exactly: in the largest of Gi, Mi
and Ki that divides it, else in bytes (512Ki stays 512Ki; 1G is 1000000000).
*/}}
{{- define "elemental-changelog.size" -}}
{{- $n := int64 . }}
{{- if and $n (eq (mod $n 1073741824) 0) }}{{ div $n 1073741824 }}Gi
{{- else if and $n (eq (mod $n 1048576) 0) }}{{ div $n 1048576 }}Mi
{{- else if and $n (eq (mod $n 1024) 0) }}{{ div $n 1024 }}Ki
{{- else }}{{ $n }}
{{- end }}
{{- end }}

{{/*
The server's three memory settings, moved together with the container's memory limit
(docs/operations.md, memory budget): the answer cache (`--answer-cache-size`) is an eighth
of the limit, the parsed channel data kept (`--max-kept-total`) a sixteenth, and the image
budget (`--memory-budget`) what is left after them and the 64Mi the process needs, plus
3Ki for each of `fleet.expectedMachines` (the bytes a watched MachineInventory adds to the
resident memory, measured in `make bench`'s fleet phase, docs/performance.md). An
explicit `server.answerCacheSize`, `server.maxKeptTotal` or `server.memoryBudget` is used
as given; every value is rendered exactly (`elemental-changelog.size`). The server refuses
to start with a budget under 128Mi (max(40MiB, 4 x the default --max-kept-size of 24MiB),
plus a quarter of the budget), so such a budget, or settings that do not fit in the limit,
fail the install here instead, naming the smallest limit that works.
Returns YAML: {budget, answerCache, keptTotal}, each a size the flags parse.
*/}}
{{- define "elemental-changelog.memory" -}}
{{- $mi := 1048576 }}
{{- $perMachine := 3072 }}
{{- $machines := mul (int64 (.Values.fleet.expectedMachines | default 0)) $perMachine }}
{{- $overhead := add (mul 64 $mi) $machines }}
{{- $minBudget := mul 128 $mi }}
{{- $limitValue := "" }}
{{- if .Values.resources }}{{ if .Values.resources.limits }}{{ $limitValue = .Values.resources.limits.memory | default "" }}{{ end }}{{ end }}
{{- $limit := 0 }}
{{- if $limitValue }}{{ $limit = include "elemental-changelog.bytes" $limitValue | atoi }}{{ end }}
{{- /* Sixteenths of the limit left to the budget, and bytes given explicitly: for the smallest limit. */}}
{{- $share := 16 }}
{{- $explicit := 0 }}
{{- $answer := 0 }}
{{- if ne (toString .Values.server.answerCacheSize) "" }}
{{- $answer = include "elemental-changelog.bytes" .Values.server.answerCacheSize | atoi }}
{{- $explicit = add $explicit $answer }}
{{- else if $limit }}
{{- $answer = div $limit 8 }}
{{- $share = sub $share 2 }}
{{- else }}
{{- $answer = mul 32 $mi }}
{{- end }}
{{- $kept := 0 }}
{{- if ne (toString .Values.server.maxKeptTotal) "" }}
{{- $kept = include "elemental-changelog.bytes" .Values.server.maxKeptTotal | atoi }}
{{- $explicit = add $explicit $kept }}
{{- else if $limit }}
{{- $kept = div $limit 16 }}
{{- $share = sub $share 1 }}
{{- else }}
{{- $kept = mul 16 $mi }}
{{- end }}
{{- $budget := 0 }}
{{- if .Values.server.memoryBudget }}
{{- $budget = include "elemental-changelog.bytes" .Values.server.memoryBudget | atoi }}
{{- else if $limit }}
{{- $budget = sub (sub (sub $limit $overhead) $answer) $kept }}
{{- else }}
{{- $budget = mul 144 $mi }}
{{- end }}
{{- if lt $budget $minBudget }}
{{- if .Values.server.memoryBudget }}
{{- fail (printf "server.memoryBudget %s is below the 128Mi the server needs to start (max(40MiB, 4 x --max-kept-size 24MiB), plus a quarter of the budget)" (toString .Values.server.memoryBudget)) }}
{{- else }}
{{- $least := div (sub (add (mul (add $minBudget $overhead $explicit) 16) (mul $share $mi)) 1) (mul $share $mi) }}
{{- fail (printf "resources.limits.memory %s leaves a memory budget of %s (limit - 64Mi - %s for %d expected machines - the answer cache of %s - the kept channel data of %s), below the 128Mi the server needs to start: use a limit of at least %dMi" $limitValue (include "elemental-changelog.size" $budget) (include "elemental-changelog.size" $machines) (int64 (.Values.fleet.expectedMachines | default 0)) (include "elemental-changelog.size" $answer) (include "elemental-changelog.size" $kept) $least) }}
{{- end }}
{{- end }}
{{- if and $limit (gt (add $budget $answer $kept $overhead) $limit) }}
{{- fail (printf "server.memoryBudget (%s) + server.answerCacheSize (%s) + server.maxKeptTotal (%s) + 64Mi for the process + %s for %d expected machines do not fit in resources.limits.memory %s: raise the limit, or leave them empty to derive them from it" (include "elemental-changelog.size" $budget) (include "elemental-changelog.size" $answer) (include "elemental-changelog.size" $kept) (include "elemental-changelog.size" $machines) (int64 (.Values.fleet.expectedMachines | default 0)) $limitValue) }}
{{- end }}
budget: {{ include "elemental-changelog.size" $budget | quote }}
answerCache: {{ include "elemental-changelog.size" $answer | quote }}
keptTotal: {{ include "elemental-changelog.size" $kept | quote }}
{{- end }}

{{/*
The Rancher version the cluster runs, from Rancher's `server-version` Setting (empty without
Rancher's Setting API, and with `helm template`, which looks nothing up; lookup fails on an
API the cluster does not serve, hence the capability check first).
*/}}
{{- define "elemental-changelog.rancherVersion" -}}
{{- if .Capabilities.APIVersions.Has "management.cattle.io/v3/Setting" }}
{{- $setting := lookup "management.cattle.io/v3" "Setting" "" "server-version" }}
{{- if $setting }}{{ $setting.value | default $setting.default | default "" }}{{ end }}
{{- end }}
{{- end }}

{{/*
"true" where the UI extension is served and registered: `uiExtension.enabled`, Rancher's
UIPlugin API, and a Rancher the extension loads in (its package.json's
`catalog.cattle.io/rancher-version`, the same as Chart.yaml's). An unknown Rancher version
(`helm template`, a development build such as `dev`) counts as one it loads in.
*/}}
{{- define "elemental-changelog.uiExtension" -}}
{{- if and .Values.uiExtension.enabled (.Capabilities.APIVersions.Has "catalog.cattle.io/v1/UIPlugin") }}
{{- $extension := .Files.Get "files/ui-extension-package.json" | fromJson }}
{{- $needs := get $extension.rancher.annotations "catalog.cattle.io/rancher-version" }}
{{- $version := regexFind "^v?[0-9]+\\.[0-9]+(\\.[0-9]+)?" (include "elemental-changelog.rancherVersion" .) | trimPrefix "v" }}
{{- if or (not $version) (semverCompare $needs $version) }}true{{ end }}
{{- end }}
{{- end }}
