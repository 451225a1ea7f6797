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

{{/* Labels that select the plugin's pods: selectorLabelsOverride when set, as upstream. */}}
{{- define "dra-driver-nvidia-gpu.selectorLabels" -}}
{{- if .Values.selectorLabelsOverride -}}
{{ toYaml .Values.selectorLabelsOverride }}
{{- else -}}
app.kubernetes.io/name: {{ include "dra-driver-nvidia-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
{{- end }}

{{/* The namespace of every namespaced object: namespaceOverride, else the release's, as
upstream. */}}
{{- define "dra-driver-nvidia-gpu.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{/* The resource.k8s.io version of the DeviceClasses: resourceApiVersion when set (as
upstream, for clusters whose discovery misreports what they serve), else v1. */}}
{{- define "dra-driver-nvidia-gpu.resourceApiVersion" -}}
{{- default "resource.k8s.io/v1" .Values.resourceApiVersion }}
{{- end }}

{{/* The metrics port: the one of kubeletPlugin.metrics.gpuHttpEndpoint (upstream's
`[host]:port`) when set, else kubeletPlugin.containers.gpus.metricsPort. */}}
{{- define "dra-driver-nvidia-gpu.metricsPort" -}}
{{- with .Values.kubeletPlugin.metrics.gpuHttpEndpoint }}
{{- regexFind "[0-9]+$" . }}
{{- else }}
{{- .Values.kubeletPlugin.containers.gpus.metricsPort }}
{{- end }}
{{- end }}

{{/* HTTP_ENDPOINT: kubeletPlugin.metrics.gpuHttpEndpoint as given, else `:<metricsPort>`. */}}
{{- define "dra-driver-nvidia-gpu.httpEndpoint" -}}
{{- with .Values.kubeletPlugin.metrics.gpuHttpEndpoint }}
{{- . }}
{{- else }}
{{- printf ":%v" .Values.kubeletPlugin.containers.gpus.metricsPort }}
{{- end }}
{{- end }}

{{/* The host directory mounted for the driver root: its parent, as upstream, so that a
driver container that mounts the root after the plugin started is seen (HostToContainer
propagates new mounts below the mounted directory). `/` is its own parent. */}}
{{- define "dra-driver-nvidia-gpu.driverRootParent" -}}
{{- $root := trimSuffix "/" .Values.nvidiaDriverRoot }}
{{- if $root }}{{ dir $root }}{{ else }}/{{ end }}
{{- end }}

{{/* DRIVER_ROOT_CTR_PATH: where the driver root is inside the container, below the parent's
mount at /driver-root-parent. */}}
{{- define "dra-driver-nvidia-gpu.containerDriverRoot" -}}
{{- $root := trimSuffix "/" .Values.nvidiaDriverRoot }}
{{- if $root }}/driver-root-parent/{{ base $root }}{{ else }}/driver-root-parent{{ end }}
{{- end }}

{{/* Whether the plugin may start MPS control daemons: their /dev/shm tmpfs is mounted under
the plugins directory, which must then propagate to the host (Bidirectional). */}}
{{- define "dra-driver-nvidia-gpu.mps" -}}
{{- if index .Values.featureGates "MPSSupport" }}true{{ end }}
{{- end }}

{{/* The plugin's ServiceAccount. */}}
{{- define "dra-driver-nvidia-gpu.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dra-driver-nvidia-gpu.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The names of imagePullSecrets, comma-separated, for the plugin's --image-pull-secrets. */}}
{{- define "dra-driver-nvidia-gpu.imagePullSecretNames" -}}
{{- $names := list }}
{{- range .Values.imagePullSecrets }}
{{- $names = append $names .name }}
{{- end }}
{{- join "," $names }}
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

{{/* Upstream gates that configure Kubernetes' logging library (klog), not the driver: left
out of --feature-gates (the plugin would refuse them), with a warning in NOTES.txt. */}}
{{- define "dra-driver-nvidia-gpu.loggingGates" -}}
ContextualLogging,LoggingAlphaOptions,LoggingBetaOptions
{{- end }}

{{/* featureGates as the plugin's --feature-gates: Name=true|false, sorted, comma separated.
Upstream's older name DeviceHealthCheck is passed as NVMLDeviceHealthCheck (unless that is
set too); the logging gates are left out. */}}
{{- define "dra-driver-nvidia-gpu.featureGates" -}}
{{- $gates := list }}
{{- $logging := splitList "," (include "dra-driver-nvidia-gpu.loggingGates" .) }}
{{- range $name, $on := .Values.featureGates }}
{{- if has $name $logging }}
{{- else if eq $name "DeviceHealthCheck" }}
{{- if not (hasKey $.Values.featureGates "NVMLDeviceHealthCheck") }}
{{- $gates = append $gates (printf "NVMLDeviceHealthCheck=%t" $on) }}
{{- end }}
{{- else }}
{{- $gates = append $gates (printf "%s=%t" $name $on) }}
{{- end }}
{{- end }}
{{- $gates | sortAlpha | join "," }}
{{- end }}

{{/* Whether device health checking is on, under either of upstream's gate names. */}}
{{- define "dra-driver-nvidia-gpu.health" -}}
{{- if or (index .Values.featureGates "NVMLDeviceHealthCheck") (and (not (hasKey .Values.featureGates "NVMLDeviceHealthCheck")) (index .Values.featureGates "DeviceHealthCheck")) }}true{{ end }}
{{- end }}

{{/* ADDITIONAL_XIDS_TO_IGNORE: kubeletPlugin.health.additionalXidsToIgnore and upstream's
older kubeletPlugin.containers.gpus.additionalXidsToIgnore (a comma-separated string). */}}
{{- define "dra-driver-nvidia-gpu.additionalXids" -}}
{{- $xids := list }}
{{- range .Values.kubeletPlugin.health.additionalXidsToIgnore }}
{{- $xids = append $xids (toString .) }}
{{- end }}
{{- with .Values.kubeletPlugin.containers.gpus.additionalXidsToIgnore }}
{{- range splitList "," (toString .) }}
{{- if trim . }}{{ $xids = append $xids (trim .) }}{{ end }}
{{- end }}
{{- end }}
{{- $xids | join "," }}
{{- end }}

{{/* Upstream values this chart accepts but that have no effect here, one
`<value>: <why>` per line, for the warnings of NOTES.txt (see the README). A value counts
as set when it is present and not empty (or false): upstream's own defaults of its
ComputeDomain section warn too, since they do nothing here either. The webhook section is
honoured (templates/webhook*.yaml). */}}
{{- define "dra-driver-nvidia-gpu.noEffect" -}}
{{- $v := .Values }}
{{- $out := list }}
{{- if $v.altProcDevices }}
{{- $out = append $out "altProcDevices: upstream's replacement /proc/devices for the mock NVML of its ComputeDomain plugin; for a cluster without GPUs use mock.profile" }}
{{- end }}
{{- if $v.maskNvidiaDriverParams }}
{{- $out = append $out "maskNvidiaDriverParams: upstream's nvkind workaround (a bind mount over /proc/driver/nvidia/params) is not made by this chart" }}
{{- end }}
{{- if $v.gpuDriverConfig }}
{{- $out = append $out "gpuDriverConfig: upstream's per-node GPU driver config (PerNodeGPUConfig) is not implemented" }}
{{- end }}
{{- with $v.resources.computeDomains }}
{{- if .imex }}
{{- $out = append $out "resources.computeDomains.imex: ComputeDomains (IMEX) are not supported" }}
{{- end }}
{{- end }}
{{- if $v.controller }}
{{- $out = append $out "controller: no ComputeDomain controller is installed" }}
{{- end }}
{{- with $v.kubeletPlugin.containers.computeDomains }}
{{- $out = append $out "kubeletPlugin.containers.computeDomains: no ComputeDomain plugin container is installed" }}
{{- end }}
{{- if $v.kubeletPlugin.metrics.computeDomainHttpEndpoint }}
{{- $out = append $out "kubeletPlugin.metrics.computeDomainHttpEndpoint: no ComputeDomain plugin is installed" }}
{{- end }}
{{- if and $v.kubeletPlugin.containers.gpus.additionalXidsToIgnore (not (include "dra-driver-nvidia-gpu.health" .)) }}
{{- $out = append $out "kubeletPlugin.containers.gpus.additionalXidsToIgnore: used only with featureGates.NVMLDeviceHealthCheck (or upstream's DeviceHealthCheck)" }}
{{- end }}
{{- $logging := splitList "," (include "dra-driver-nvidia-gpu.loggingGates" .) }}
{{- range $name, $on := $v.featureGates }}
{{- if has $name $logging }}
{{- $out = append $out (printf "featureGates.%s: a gate of Kubernetes' logging library, which the plugin does not use (logVerbosity and kubeletPlugin.logLevel set its logs); not passed to it" $name) }}
{{- end }}
{{- end }}
{{- if and (hasKey $v.featureGates "DeviceHealthCheck") (hasKey $v.featureGates "NVMLDeviceHealthCheck") }}
{{- $out = append $out "featureGates.DeviceHealthCheck: upstream's older name of NVMLDeviceHealthCheck, which is set too and wins" }}
{{- end }}
{{- $out | join "\n" }}
{{- end }}
