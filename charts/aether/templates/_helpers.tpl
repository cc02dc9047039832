{{/*
Names and labels shared by every template.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "aether.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' base name: fullnameOverride, else the release name when it already says "aether",
else `<release>-aether`.
*/}}
{{- define "aether.fullname" -}}
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

{{/* The labels that select the daemon's pods (never change them on upgrade). */}}
{{- define "aether.selectorLabels" -}}
app.kubernetes.io/name: {{ include "aether.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object's labels. */}}
{{- define "aether.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "aether.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: aether
{{- end }}

{{/* The daemon's ServiceAccount. */}}
{{- define "aether.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "aether.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The CA Secret: the one named, or the one the chart creates. */}}
{{- define "aether.caSecretName" -}}
{{- default (printf "%s-ca" (include "aether.fullname" .)) .Values.ca.existingSecret }}
{{- end }}

{{/* The image reference. */}}
{{- define "aether.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The ignored namespaces: cni.ignoredNamespaces and the release namespace, once each. */}}
{{- define "aether.ignoredNamespaces" -}}
{{- $all := concat .Values.cni.ignoredNamespaces (list .Release.Namespace) | uniq }}
{{- toJson $all }}
{{- end }}
