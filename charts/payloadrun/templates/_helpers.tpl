{{/*
Names follow `helm create`: nameOverride replaces the chart's name, fullnameOverride the whole
prefix of every object's name (a release named like the chart is not repeated); both cut to 63
characters, the longest name a Service or a label value may have.
*/}}
{{- define "payloadrun.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "payloadrun.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The full name and a suffix, within 63 characters: the full name is cut, never the suffix, so the
objects of one release keep distinct names however long the full name is.
Call with (list $ "suffix").
*/}}
{{- define "payloadrun.suffixedName" -}}
{{- $ctx := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- $prefix := include "payloadrun.fullname" $ctx | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $prefix $suffix -}}
{{- end -}}

{{/*
The operator's app.kubernetes.io/name, <name>-operator: the pods of runs are labelled
app.kubernetes.io/name: payloadrun by the operator (the PodMonitor selects those), never these.
*/}}
{{- define "payloadrun.operatorName" -}}
{{- printf "%s-operator" (include "payloadrun.name" . | trunc 54 | trimSuffix "-") -}}
{{- end -}}

{{- define "payloadrun.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "payloadrun.operatorName" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "payloadrun.selectorLabels" -}}
app.kubernetes.io/name: {{ include "payloadrun.operatorName" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "payloadrun.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "payloadrun.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "payloadrun.operatorImage" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "payloadrun.sidecarImage" -}}
{{- printf "%s:%s" .Values.sidecars.image.repository (default .Chart.AppVersion .Values.sidecars.image.tag) -}}
{{- end -}}

{{/* The operator's settings the chart sets from its values (docs/operator.md lists them all). */}}
{{- define "payloadrun.operatorEnv" -}}
- name: PAYLOADRUN_SIDECAR_IMAGE
  value: {{ include "payloadrun.sidecarImage" . | quote }}
- name: PAYLOADRUN_SIDECAR_IMAGE_PULL_POLICY
  value: {{ .Values.sidecars.image.pullPolicy | quote }}
- name: PAYLOADRUN_SIDECAR_UID
  value: {{ .Values.sidecars.uid | quote }}
- name: PAYLOADRUN_SIDECAR_LOG_FORMAT
  value: {{ .Values.sidecars.logFormat | quote }}
- name: PAYLOADRUN_WRITER_RESOURCES
  value: {{ .Values.sidecars.writer.resources | toJson | quote }}
- name: PAYLOADRUN_RETENTION_RESOURCES
  value: {{ .Values.sidecars.retention.resources | toJson | quote }}
- name: PAYLOADRUN_NAMESPACES
  value: {{ join "," .Values.operator.watchNamespaces | quote }}
- name: PAYLOADRUN_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: PAYLOADRUN_HEALTH_PORT
  value: {{ .Values.health.port | quote }}
- name: PAYLOADRUN_RESYNC_SECONDS
  value: {{ .Values.operator.resyncSeconds | quote }}
- name: PAYLOADRUN_NETWORK_POLICIES
  value: {{ .Values.operator.networkPolicy.enabled | quote }}
- name: PAYLOADRUN_METRICS_SCRAPERS
  value: {{ .Values.operator.networkPolicy.metricsFrom | toJson | quote }}
- name: PAYLOADRUN_INFERENCE_CLIENTS
  value: {{ .Values.operator.networkPolicy.inferenceFrom | toJson | quote }}
- name: PAYLOADRUN_LEADER_ELECTION
  value: {{ .Values.operator.leaderElection.enabled | quote }}
- name: PAYLOADRUN_LEASE_NAME
  value: {{ include "payloadrun.fullname" . | quote }}
- name: PAYLOADRUN_LEASE_NAMESPACE
  value: {{ .Release.Namespace | quote }}
- name: PAYLOADRUN_LEASE_DURATION_SECONDS
  value: {{ .Values.operator.leaderElection.leaseDuration | quote }}
- name: PAYLOADRUN_LEASE_RENEW_DEADLINE_SECONDS
  value: {{ .Values.operator.leaderElection.renewDeadline | quote }}
- name: PAYLOADRUN_LEASE_RETRY_SECONDS
  value: {{ .Values.operator.leaderElection.retryPeriod | quote }}
- name: PAYLOADRUN_WATCH_SERVER_TIMEOUT
  value: {{ .Values.operator.watch.serverTimeout | quote }}
- name: PAYLOADRUN_WATCH_CLIENT_TIMEOUT
  value: {{ .Values.operator.watch.clientTimeout | quote }}
- name: PAYLOADRUN_WATCH_INACTIVITY_TIMEOUT
  value: {{ .Values.operator.watch.inactivityTimeout | quote }}
- name: PAYLOADRUN_LOG_FORMAT
  value: {{ .Values.operator.logFormat | quote }}
{{- end -}}

{{/*
The chart's env, then extraEnv. A name set twice would be two entries under one key: Kubernetes
keeps the last one and Helm's upgrade patch may drop either, so it is refused with the fix.
*/}}
{{- define "payloadrun.env" -}}
{{- $chart := include "payloadrun.operatorEnv" . | fromYamlArray -}}
{{- $seen := dict -}}
{{- range $chart }}{{ $_ := set $seen .name "" }}{{ end -}}
{{- range $i, $e := .Values.extraEnv -}}
{{- if hasKey $seen $e.name -}}
{{- with get $seen $e.name -}}
{{- fail (printf "extraEnv[%d] sets %s, as %s does: keep one of them" $i $e.name .) -}}
{{- else -}}
{{- fail (printf "extraEnv[%d] sets %s, which the chart sets from its values: remove it from extraEnv and set the chart's value instead (docs/operator.md, Settings, lists the variables)" $i $e.name) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $seen $e.name (printf "extraEnv[%d]" $i) -}}
{{- end -}}
{{- concat $chart .Values.extraEnv | toYaml -}}
{{- end -}}
