{{/* Chart name, overridable. */}}
{{- define "torchrun-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name alone when it already contains the chart name. */}}
{{- define "torchrun-operator.fullname" -}}
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

{{- define "torchrun-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "torchrun-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "torchrun-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "torchrun-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: torchrun-operator
{{- end }}

{{- define "torchrun-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "torchrun-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "torchrun-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "torchrun-operator.leaseName" -}}
{{- default (include "torchrun-operator.fullname" .) .Values.leaderElection.id }}
{{- end }}

{{/*
Rules on the job's children and the job itself: granted cluster-wide or per watched namespace.
*/}}
{{- define "torchrun-operator.namespacedRules" -}}
# The job's children. delete: gang restarts replace pods; patch: labels and graceful deletion.
- apiGroups: [""]
  resources: [pods, services, configmaps]
  verbs: [get, list, watch, create, patch, delete]
# delete: spec.runPolicy.ttlSecondsAfterFinished removes finished jobs.
- apiGroups: [torchrun.dev]
  resources: [distributedtrainingjobs]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [torchrun.dev]
  resources: [distributedtrainingjobs/status]
  verbs: [get, patch]
# Children carry ownerReferences with blockOwnerDeletion; clusters running the
# OwnerReferencesPermissionEnforcement admission plugin (OpenShift) require this to set them.
- apiGroups: [torchrun.dev]
  resources: [distributedtrainingjobs/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}

{{/* kopf's own cluster-scoped reads: it discovers CRDs and namespaces at runtime. */}}
{{- define "torchrun-operator.clusterReadRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
