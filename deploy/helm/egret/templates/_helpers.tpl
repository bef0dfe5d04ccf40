{{/*
The name of every object: the release's name if it says egret ("egret"
gives the kustomize base's names), else RELEASE-egret; fullnameOverride
wins.
*/}}
{{- define "egret.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "egret" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-egret" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
Labels of every object: the kustomize base's, and Helm's own.
app.kubernetes.io/name stays "egret": the scrape job, the dashboard and
the PodMonitor select the agents by it.
*/}}
{{- define "egret.labels" -}}
app.kubernetes.io/name: egret
app.kubernetes.io/part-of: egret
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The agent's pods: the DaemonSet's selector (as the kustomize base's, so
that a cluster can move from one to the other) and its pods' labels.
*/}}
{{- define "egret.selectorLabels" -}}
app.kubernetes.io/name: egret
app.kubernetes.io/component: agent
{{- end -}}

{{/* The image reference: repository, then @digest or :tag (appVersion by default). */}}
{{- define "egret.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}
