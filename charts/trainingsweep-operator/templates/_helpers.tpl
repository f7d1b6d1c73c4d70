{{/*
Names, labels and small derived facts shared by every template.
*/}}

{{/* The chart name (nameOverride wins). */}}
{{- define "tso.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every resource name: <release>-<chart>, or the release when it already names the chart. */}}
{{- define "tso.fullname" -}}
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

{{/* Labels that select the operator pods (never change them: Deployment selectors are immutable). */}}
{{- define "tso.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tso.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object the chart creates. */}}
{{- define "tso.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tso.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: trainingsweep-operator
{{- end -}}

{{/* The operator's ServiceAccount name. */}}
{{- define "tso.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tso.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator image reference. */}}
{{- define "tso.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the operator watches the whole cluster (no watchNamespaces). */}}
{{- define "tso.clusterWide" -}}
{{- if empty .Values.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/* The kopf peering name, or "" when running standalone (one replica). */}}
{{- define "tso.peeringName" -}}
{{- if .Values.ha.enabled -}}{{ .Values.ha.peeringName }}{{- end -}}
{{- end -}}

{{/* Names of the webhook Service, its TLS Secret and the cert-manager Certificate. */}}
{{- define "tso.webhookServiceName" -}}
{{- printf "%s-webhook" (include "tso.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tso.webhookCertificateName" -}}
{{- printf "%s-webhook" (include "tso.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tso.webhookSecretName" -}}
{{- if eq (include "tso.webhookCertProvider" .) "secret" -}}
{{- required "webhook.tls.secretName is required when webhook.certProvider is secret" .Values.webhook.tls.secretName -}}
{{- else -}}
{{- printf "%s-webhook-tls" (include "tso.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
Who issues the webhook's serving certificate: operator, cert-manager or secret. `auto` picks cert-manager when
the cluster serves cert-manager.io/v1 (.Capabilities: `helm template` and Argo CD without --api-versions see
none, and get the operator's own certificate).
*/}}
{{- define "tso.webhookCertProvider" -}}
{{- if eq .Values.webhook.certProvider "auto" -}}
{{- ternary "cert-manager" "operator" (.Capabilities.APIVersions.Has "cert-manager.io/v1") -}}
{{- else -}}
{{- .Values.webhook.certProvider -}}
{{- end -}}
{{- end -}}

{{/* Namespaces that get the sweep-runner ServiceAccount, as a list. */}}
{{- define "tso.runnerNamespaces" -}}
{{- $ns := .Values.runner.serviceAccount.namespaces | default .Values.watchNamespaces | default (list .Release.Namespace) -}}
{{- if .Values.runner.serviceAccount.perNamespace -}}
{{- $ns = concat (.Values.runner.serviceAccount.namespaces | default .Values.watchNamespaces | default list) (keys .Values.runner.serviceAccount.perNamespace) -}}
{{- end -}}
{{- toJson ($ns | uniq | sortAlpha) -}}
{{- end -}}

{{/*
A ServiceAccount's `annotations:` block: its extra annotations plus the IRSA role
(eks.amazonaws.com/role-arn) when roleArn is set; nothing when both are empty.
Takes a dict with `annotations` and `roleArn` (serviceAccount or runner.serviceAccount).
*/}}
{{- define "tso.irsaAnnotations" -}}
{{- $annotations := deepCopy (.annotations | default dict) -}}
{{- if .roleArn -}}
{{- $_ := set $annotations "eks.amazonaws.com/role-arn" .roleArn -}}
{{- end -}}
{{- with $annotations -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/*
Cross-field checks values.schema.json cannot express; fails the render with a message naming the values.
*/}}
{{- define "tso.validateValues" -}}
{{- if gt (int64 .Values.limits.defaultActiveSeconds) (int64 .Values.limits.maxActiveSeconds) -}}
{{- fail (printf "limits.defaultActiveSeconds (%d) must not exceed limits.maxActiveSeconds (%d)" (int64 .Values.limits.defaultActiveSeconds) (int64 .Values.limits.maxActiveSeconds)) -}}
{{- end -}}
{{- $ports := dict (toString (int64 .Values.liveness.port)) "liveness.port" -}}
{{- if .Values.metrics.enabled -}}
{{- $key := toString (int64 .Values.metrics.port) -}}
{{- if hasKey $ports $key -}}{{- fail (printf "metrics.port %s is already used by %s" $key (get $ports $key)) -}}{{- end -}}
{{- $_ := set $ports $key "metrics.port" -}}
{{- end -}}
{{- if ge (int64 .Values.webhook.operatorCertificate.renewBeforeDays) (int64 .Values.webhook.operatorCertificate.validityDays) -}}
{{- fail (printf "webhook.operatorCertificate.renewBeforeDays (%d) must be less than webhook.operatorCertificate.validityDays (%d)" (int64 .Values.webhook.operatorCertificate.renewBeforeDays) (int64 .Values.webhook.operatorCertificate.validityDays)) -}}
{{- end -}}
{{- if .Values.webhook.enabled -}}
{{- $key := toString (int64 .Values.webhook.port) -}}
{{- if hasKey $ports $key -}}{{- fail (printf "webhook.port %s is already used by %s" $key (get $ports $key)) -}}{{- end -}}
{{- end -}}
{{- end -}}

{{/* KubeRay's identity in admission requests (it creates our RayClusters and writes RayJob/RayCluster status). */}}
{{- define "tso.kuberayUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Values.kuberay.namespace .Values.kuberay.serviceAccountName -}}
{{- end -}}
