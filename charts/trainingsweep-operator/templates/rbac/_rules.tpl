{{/*
RBAC rules, one source for both modes. Resources and verbs are enumerated (no wildcards; a test checks).
*/}}

{{/*
Rules on namespaced resources: a ClusterRole in cluster-wide mode, a Role in each watched
namespace otherwise.
*/}}
{{- define "tso.rbac.namespacedRules" -}}
# TrainingSweeps: kopf watches them and patches its finalizer and bookkeeping annotations.
- apiGroups: ["sweeps.dev"]
  resources: ["trainingsweeps"]
  verbs: ["get", "list", "watch", "patch", "update"]
# The status the operator reports (phase, trials, conditions, checkpoints).
- apiGroups: ["sweeps.dev"]
  resources: ["trainingsweeps/status"]
  verbs: ["get", "patch", "update"]
# The namespaces' GPU-hour ledgers (docs/budgets.md): created, then replaced with the resourceVersion
# precondition (a reservation is one such write); never deleted, since a ledger outlives the sweeps it counts.
- apiGroups: ["sweeps.dev"]
  resources: ["gpuhourledgers"]
  verbs: ["get", "list", "watch", "create", "update"]
# Owner references with blockOwnerDeletion on the RayJobs need update on the owner's finalizers.
- apiGroups: ["sweeps.dev"]
  resources: ["trainingsweeps/finalizers"]
  verbs: ["update"]
# RayJobs the operator renders, and the RayClusters KubeRay creates from them: created, adopted,
# finalized by the checkpoint guard, set back when edited above their caps, stopped at deadlines;
# a stopping run's worker groups suspended before its RayJob is deleted (KubeRay then deletes the pods).
- apiGroups: ["ray.io"]
  resources: ["rayjobs", "rayclusters"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["ray.io"]
  resources: ["rayjobs/status", "rayclusters/status"]
  verbs: ["get"]
- apiGroups: ["ray.io"]
  resources: ["rayjobs/finalizers", "rayclusters/finalizers"]
  verbs: ["update"]
# Kueue mode: the Workloads Kueue makes for the operator's RayJobs (queued, admitted, evicted); read only.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch"]
# Events on sweeps (transitions, guard decisions, the audited escape hatch); kopf uses the core API.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# Startup diagnosis: why a RayCluster's pods are pending (FailedScheduling, image pulls, quota);
# GPU-hour accounting: the RayClusters' GPU pods, scheduled to gone (label ray.io/cluster).
- apiGroups: [""]
  resources: ["pods", "events"]
  verbs: ["get", "list", "watch"]
# The graceful stop asks a RayJob's head through its status.dashboardURL only while the head Service it names is the
# one KubeRay made for the RayJob's cluster (type, owner, selector, dashboard port): read, never changed.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get"]
# Hold the data, not the GPUs: the worker pods of a RayCluster the checkpoint guard holds (KubeRay no longer
# reconciles a deleting cluster, so nothing else frees them). RBAC cannot narrow a verb by label; the operator
# deletes only pods labelled ray.io/node-type=worker and owned by a cluster it holds (docs/security.md).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["delete"]
{{- if and .Values.ha.enabled (not (include "tso.clusterWide" .)) }}
# kopf peering between replicas, namespaced mode: a KopfPeering in each watched namespace.
- apiGroups: ["kopf.dev", "zalando.org"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end -}}

{{/* Rules on cluster-scoped resources: always a ClusterRole. */}}
{{- define "tso.rbac.clusterRules" -}}
# kopf scans CRDs to find the resources it serves (and the peering kinds).
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
# The startup check that KubeRay's ServiceAccount (kuberay.namespace/serviceAccountName) exists: that name only.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get"]
  resourceNames: [{{ .Values.kuberay.serviceAccountName | quote }}]
{{- if and .Values.webhook.enabled (eq (include "tso.webhookCertProvider" .) "operator") }}
# webhook.certProvider=operator: the operator injects its CA into this chart's webhook configurations only.
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingwebhookconfigurations"{{ if .Values.webhook.guardFinalizer.enabled }}, "mutatingwebhookconfigurations"{{ end }}]
  verbs: ["get", "patch"]
  resourceNames: [{{ include "tso.fullname" . | quote }}]
{{- end }}
{{- if include "tso.clusterWide" . }}
# Cluster-wide mode: kopf follows namespaces as they come and go.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
{{- if .Values.ha.enabled }}
# kopf peering between replicas, cluster-wide mode: one ClusterKopfPeering.
- apiGroups: ["kopf.dev", "zalando.org"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}
{{- end -}}
