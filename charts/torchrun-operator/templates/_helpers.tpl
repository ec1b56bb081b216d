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
Exactly the calls the operator makes (controller/, kube/), and no more: docs/security.md has
the table. No patch or update of children, no list but of pods: the operator creates each
child once, reads one back by name only to check who owns it, and deletes only pods.
*/}}
{{- define "torchrun-operator.namespacedRules" -}}
# The pod watch (list, watch, by label); creates; deletes for gang restarts and cleanup; get:
# after a create's 409, whether the pod holding the name is the job's (list reveals as much).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
# Created once per job; get: an existing object of that name must be owned by the job.
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, create]
# The per-job NetworkPolicy. Granted whatever jobNetworkPolicy.enabled says: a job's own
# spec.networkPolicy.enabled=true asks for one even when the operator's default is off.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create]
# kopf's list and watch; get by name; delete: spec.runPolicy.ttlSecondsAfterFinished.
- apiGroups: [torchrun.dev]
  resources: [distributedtrainingjobs]
  verbs: [get, list, watch, delete]
- apiGroups: [torchrun.dev]
  resources: [distributedtrainingjobs/status]
  verbs: [patch]
# The DistributedTrainingRuntime a job names, read by name until the job records it
# (kube/runtimes.py); never written.
- apiGroups: [torchrun.dev]
  resources: [distributedtrainingruntimes]
  verbs: [get]
# Children carry ownerReferences with blockOwnerDeletion; clusters running the
# OwnerReferencesPermissionEnforcement admission plugin (OpenShift) require this to set them.
# The operator never calls it.
- apiGroups: [torchrun.dev]
  resources: [distributedtrainingjobs/finalizers]
  verbs: [update]
# Our events (kube/events.py) and kopf's: core/v1 only, created and never patched.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.kueue.enabled }}
# Kueue (docs/scheduling.md): the job's Workload is watched by label, created, deleted when
# the job changed while it waited, patched to (de)activate it with runPolicy.suspend; get:
# after a create's 409, whether the Workload holding the name is the job's.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, delete, patch]
# Released after an eviction once the job's pods are gone, and marked Finished.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
{{- end }}
{{- include "torchrun-operator.gangRules" . }}
{{- end }}

{{/* The gang objects of each attempt (kube/gangobjects.py, spec.scheduling.gang): created;
get: after a create's 409, whether the object holding the name is the job's; list (by label)
and delete: an earlier attempt's, by uid. Each gang scheduler's only when enabled. */}}
{{- define "torchrun-operator.gangRules" -}}
{{- if .Values.gangScheduling.native }}
- apiGroups: [scheduling.k8s.io]
  resources: [workloads, podgroups]
  verbs: [get, list, create, delete]
{{- end }}
{{- if .Values.gangScheduling.coscheduling }}
- apiGroups: [scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [get, list, create, delete]
{{- end }}
{{- if .Values.gangScheduling.volcano }}
- apiGroups: [scheduling.volcano.sh]
  resources: [podgroups]
  verbs: [get, list, create, delete]
{{- end }}
{{- end }}

{{/* kopf's own cluster-scoped reads: it discovers CRDs and namespaces at runtime; and the
cluster runtimes jobs name. */}}
{{- define "torchrun-operator.clusterReadRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
# The ClusterDistributedTrainingRuntime a job names, read by name until the job records it
# (kube/runtimes.py); never written.
- apiGroups: [torchrun.dev]
  resources: [clusterdistributedtrainingruntimes]
  verbs: [get]
{{- if .Values.kueue.enabled }}
# Kueue: the ResourceFlavors a Workload was admitted on, for their node labels and
# tolerations (read by name when a job is admitted), and the WorkloadPriorityClass a job
# names (read by name when its Workload is created).
- apiGroups: [kueue.x-k8s.io]
  resources: [resourceflavors, workloadpriorityclasses]
  verbs: [get]
{{- end }}
{{- end }}
