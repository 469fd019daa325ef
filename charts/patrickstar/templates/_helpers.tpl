{{/*
Names, labels and images shared by the templates.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "patrickstar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of object names: <release>-<name>, or the release name when it holds the name. */}}
{{- define "patrickstar.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "patrickstar.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart-version, for the helm.sh/chart label. */}}
{{- define "patrickstar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object of the release. */}}
{{- define "patrickstar.labels" -}}
helm.sh/chart: {{ include "patrickstar.chart" . }}
{{ include "patrickstar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: patrickstar
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels selecting the operator pods. */}}
{{- define "patrickstar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "patrickstar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "patrickstar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "patrickstar.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image: repository@digest, or repository:tag (tag defaults to appVersion). */}}
{{- define "patrickstar.operatorImage" -}}
{{- $image := .Values.operator.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* The default worker image of jobs (tag defaults to appVersion). */}}
{{- define "patrickstar.workerImage" -}}
{{- printf "%s:%s" .Values.worker.image.repository (default .Chart.AppVersion .Values.worker.image.tag) }}
{{- end }}

{{/* The default image of device: cpu jobs (tag defaults to appVersion). */}}
{{- define "patrickstar.cpuWorkerImage" -}}
{{- printf "%s:%s" .Values.worker.cpuImage.repository (default .Chart.AppVersion .Values.worker.cpuImage.tag) }}
{{- end }}

{{/* Whether the cluster serves the prometheus-operator API. */}}
{{- define "patrickstar.hasMonitoringApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}
