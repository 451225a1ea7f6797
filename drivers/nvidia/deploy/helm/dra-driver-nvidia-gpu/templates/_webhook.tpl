{{/* The admission webhook's object names and labels. Its pods carry their own name label
(`<name>-webhook`) and `app.kubernetes.io/component: webhook`, so that neither the plugin's
DaemonSet selector nor the metrics Service selects them. */}}

{{- define "dra-driver-nvidia-gpu.webhook.fullname" -}}
{{- printf "%s-webhook" (include "dra-driver-nvidia-gpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dra-driver-nvidia-gpu.webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-webhook" (include "dra-driver-nvidia-gpu.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end }}

{{- define "dra-driver-nvidia-gpu.webhook.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dra-driver-nvidia-gpu.webhook.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The webhook's ServiceAccount: its own, with no RBAC (the webhook makes no API calls). */}}
{{- define "dra-driver-nvidia-gpu.webhook.serviceAccountName" -}}
{{- if .Values.webhook.serviceAccount.create }}
{{- default (include "dra-driver-nvidia-gpu.webhook.fullname" .) .Values.webhook.serviceAccount.name }}
{{- else }}
{{- required "webhook.serviceAccount.name is required when webhook.serviceAccount.create is false" .Values.webhook.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the serving certificate (tls.crt, tls.key): the user's in `secret`
mode, else the chart's (Helm-generated, or written by cert-manager). */}}
{{- define "dra-driver-nvidia-gpu.webhook.tlsSecretName" -}}
{{- if eq .Values.webhook.tls.mode "secret" }}
{{- required "webhook.tls.secret.name is required when webhook.tls.mode is secret" .Values.webhook.tls.secret.name }}
{{- else }}
{{- printf "%s-tls" (include "dra-driver-nvidia-gpu.webhook.fullname" .) }}
{{- end }}
{{- end }}

{{/* The DNS names the API server may use for the webhook's Service (it calls
`<service>.<namespace>.svc`), plus webhook.tls.certManager.dnsNames. */}}
{{- define "dra-driver-nvidia-gpu.webhook.dnsNames" -}}
{{- $service := include "dra-driver-nvidia-gpu.webhook.fullname" . }}
{{- $names := list $service (printf "%s.%s" $service (include "dra-driver-nvidia-gpu.namespace" .)) (printf "%s.%s.svc" $service (include "dra-driver-nvidia-gpu.namespace" .)) (printf "%s.%s.svc.cluster.local" $service (include "dra-driver-nvidia-gpu.namespace" .)) }}
{{- concat $names .Values.webhook.tls.certManager.dnsNames | uniq | toJson }}
{{- end }}

{{/* The webhook's log filter when webhook.logLevel is empty: the level upstream's klog
verbosity (logVerbosity) maps to, as for the plugin. */}}
{{- define "dra-driver-nvidia-gpu.webhook.logLevel" -}}
{{- $v := int .Values.logVerbosity }}
{{- if ge $v 7 }}trace{{ else if ge $v 5 }}debug{{ else }}info{{ end }}
{{- end }}
