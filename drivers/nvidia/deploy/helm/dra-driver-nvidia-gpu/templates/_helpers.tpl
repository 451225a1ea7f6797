{{/* Chart name, overridable. */}}
{{- define "dra-driver-nvidia-gpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name of every object. */}}
{{- define "dra-driver-nvidia-gpu.fullname" -}}
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

{{/* Labels on every object. */}}
{{- define "dra-driver-nvidia-gpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dra-driver-nvidia-gpu.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the plugin's pods. */}}
{{- define "dra-driver-nvidia-gpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-driver-nvidia-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The plugin's ServiceAccount. */}}
{{- define "dra-driver-nvidia-gpu.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dra-driver-nvidia-gpu.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The plugin image. */}}
{{- define "dra-driver-nvidia-gpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The plugin's log filter: kubeletPlugin.logLevel, else the level upstream's klog
verbosity maps to. */}}
{{- define "dra-driver-nvidia-gpu.logLevel" -}}
{{- if .Values.kubeletPlugin.logLevel }}
{{- .Values.kubeletPlugin.logLevel }}
{{- else }}
{{- $v := int .Values.logVerbosity }}
{{- if ge $v 7 }}trace{{ else if ge $v 5 }}debug{{ else }}info{{ end }}
{{- end }}
{{- end }}

{{/* featureGates as the plugin's --feature-gates: Name=true|false, sorted, comma separated. */}}
{{- define "dra-driver-nvidia-gpu.featureGates" -}}
{{- $gates := list }}
{{- range $name, $on := .Values.featureGates }}
{{- $gates = append $gates (printf "%s=%t" $name $on) }}
{{- end }}
{{- $gates | sortAlpha | join "," }}
{{- end }}
