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

{{/* The names of extraEnv, as a YAML list. */}}
{{- define "egret.extraEnvNames" -}}
{{- $names := list -}}
{{- range .Values.extraEnv -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- toYaml $names -}}
{{- end -}}

{{/*
What the schema cannot say, refused with a message naming the value:
values that would take over what the chart sets itself, and values that
contradict each other. Renders nothing.
*/}}
{{- define "egret.validate" -}}
{{- range .Values.extraArgs -}}
{{- $flag := regexReplaceAll "=.*$" . "" -}}
{{- if has $flag (list "--log-level" "--log-format") -}}
{{- fail (printf "extraArgs: %s is set by the value %s, not extraArgs" $flag (ternary "logLevel" "logFormat" (eq $flag "--log-level"))) -}}
{{- end -}}
{{- end -}}
{{- range .Values.extraEnv -}}
{{- if has .name (list "NODE_NAME" "POD_NAME" "POD_NAMESPACE") -}}
{{- fail (printf "extraEnv: %s is the chart's (the agent's node and own pod, from the downward API); only GOMEMLIMIT may be replaced" .name) -}}
{{- end -}}
{{- end -}}
{{- $own := list "host-cgroup" "bpffs" "netns" "policy" "run" "tmp" "keeper" -}}
{{- $extra := list -}}
{{- range .Values.extraVolumes -}}
{{- if has .name $own -}}
{{- fail (printf "extraVolumes: %q is a volume of the chart's (%s): name it otherwise" .name (join ", " $own)) -}}
{{- end -}}
{{- if has .name $extra -}}
{{- fail (printf "extraVolumes: %q is named twice" .name) -}}
{{- end -}}
{{- $extra = append $extra .name -}}
{{- end -}}
{{- $paths := list "/sys/fs/cgroup" "/sys/fs/bpf" "/run/netns" "/etc/egret" "/run/egret" "/tmp" "/run/egret-keeper" -}}
{{- range .Values.extraVolumeMounts -}}
{{- if not (has .name $extra) -}}
{{- fail (printf "extraVolumeMounts: %s mounts %q, which is not one of extraVolumes (%s)" .mountPath .name (join ", " $extra | default "none")) -}}
{{- end -}}
{{- if has (clean .mountPath) $paths -}}
{{- fail (printf "extraVolumeMounts: %s is where the chart mounts one of its own volumes (%s)" .mountPath (join ", " $paths)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.structuredPolicy (ne .Values.policy (.Files.Get "files/default-policy.yaml")) -}}
{{- fail "structuredPolicy and policy are both set: the node policy is one or the other (leave policy at its default to use structuredPolicy)" -}}
{{- end -}}
{{- if and .Values.metrics.networkPolicy.enabled (not .Values.metrics.networkPolicy.from) -}}
{{- fail "metrics.networkPolicy.enabled: metrics.networkPolicy.from must name who may reach the metrics port (a NetworkPolicy rule without sources would admit everyone)" -}}
{{- end -}}
{{- end -}}
