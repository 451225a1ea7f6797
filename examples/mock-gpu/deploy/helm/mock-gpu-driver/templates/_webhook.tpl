{{/* The admission webhook's object names and labels. Its pods carry their own name label
(`<name>-webhook`) and `app.kubernetes.io/component: webhook`, so that neither the plugin's
DaemonSet selector nor the metrics Service selects them. */}}

{{- define "mock-gpu-driver.webhook.fullname" -}}
{{- printf "%s-webhook" (include "mock-gpu-driver.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "mock-gpu-driver.webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-webhook" (include "mock-gpu-driver.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end }}

{{- define "mock-gpu-driver.webhook.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "mock-gpu-driver.webhook.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The webhook's ServiceAccount: its own, with no RBAC (the webhook makes no API calls). */}}
{{- define "mock-gpu-driver.webhook.serviceAccountName" -}}
{{- if .Values.webhook.serviceAccount.create }}
{{- default (include "mock-gpu-driver.webhook.fullname" .) .Values.webhook.serviceAccount.name }}
{{- else }}
{{- required "webhook.serviceAccount.name is required when webhook.serviceAccount.create is false" .Values.webhook.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the serving certificate (tls.crt, tls.key): the user's in `secret`
mode, else the chart's (Helm-generated, or written by cert-manager). */}}
{{- define "mock-gpu-driver.webhook.tlsSecretName" -}}
{{- if eq .Values.webhook.tls.mode "secret" }}
{{- required "webhook.tls.secret.name is required when webhook.tls.mode is secret" .Values.webhook.tls.secret.name }}
{{- else }}
{{- printf "%s-tls" (include "mock-gpu-driver.webhook.fullname" .) }}
{{- end }}
{{- end }}

{{/* The DNS names the API server may use for the webhook's Service (it calls
`<service>.<namespace>.svc`), plus webhook.tls.certManager.dnsNames. */}}
{{- define "mock-gpu-driver.webhook.dnsNames" -}}
{{- $service := include "mock-gpu-driver.webhook.fullname" . }}
{{- $names := list $service (printf "%s.%s" $service .Release.Namespace) (printf "%s.%s.svc" $service .Release.Namespace) (printf "%s.%s.svc.cluster.local" $service .Release.Namespace) }}
{{- concat $names .Values.webhook.tls.certManager.dnsNames | uniq | toJson }}
{{- end }}
