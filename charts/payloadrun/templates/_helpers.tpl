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

