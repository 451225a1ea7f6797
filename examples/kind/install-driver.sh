#!/usr/bin/env bash
# Installs (or upgrades) the mock GPU driver's Helm chart with the image build-image.sh
# loaded and the demos' settings (driver-values.yaml), waits for the admission webhook's
# Deployment, and waits until every node the plugin's DaemonSet runs on publishes its GPUs. That is the worker only: the chart has no toleration
# for the control plane's NoSchedule taint, so waiting for every node would never end.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
need "$HELM" "$KUBECTL"

say "helm upgrade --install $RELEASE_NAME into namespace $DRIVER_NAMESPACE"
"$HELM" upgrade --install "$RELEASE_NAME" "$CHART_DIR" \
  --kube-context "$KUBE_CONTEXT" \
  --namespace "$DRIVER_NAMESPACE" --create-namespace \
  --values "$DRIVER_VALUES" \
  --set image.repository="$IMAGE_REPOSITORY" \
  --set image.tag="$IMAGE_TAG" \
  --set image.pullPolicy=Never \
  --wait --timeout 180s

# The admission webhook (driver-values.yaml enables it): its Deployment must be ready before a
# demo is applied, or its failurePolicy (Ignore) would let bad-config-denied's claim in.
webhooks=$(kubectl_ -n "$DRIVER_NAMESPACE" get deployments \
  -l app.kubernetes.io/instance="$RELEASE_NAME",app.kubernetes.io/component=webhook -o name)
for webhook in $webhooks; do
  say "waiting for the admission webhook ($webhook)"
  if ! kubectl_ -n "$DRIVER_NAMESPACE" rollout status "$webhook" --timeout 120s; then
    echo "the admission webhook $webhook is not ready; its pods say why:" >&2
    kubectl_ -n "$DRIVER_NAMESPACE" logs -l app.kubernetes.io/component=webhook --tail 30 >&2 || true
    exit 1
  fi
done

# The nodes the DaemonSet runs its plugin on (its status, written by the DaemonSet controller).
desired=$(kubectl_ -n "$DRIVER_NAMESPACE" get daemonsets \
  -l app.kubernetes.io/instance="$RELEASE_NAME" \
  -o jsonpath='{range .items[*]}{.status.desiredNumberScheduled}{"\n"}{end}' | head -n1)
if [[ -z $desired || $desired -eq 0 ]]; then
  echo "the plugin's DaemonSet (release $RELEASE_NAME in $DRIVER_NAMESPACE) runs on no node:" >&2
  echo "  every node is tainted or excluded; see kubectl get nodes -o wide and the chart's" >&2
  echo "  kubeletPlugin.nodeSelector, affinity and tolerations" >&2
  exit 1
fi

say "waiting until the $desired node(s) the plugin runs on publish their GPUs"
published=0
for ((attempt = 1; attempt <= WAIT_ATTEMPTS; attempt++)); do
  published=$(kubectl_ get resourceslices --field-selector spec.driver=gpu.example.com \
    -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u | grep -c . || true)
  if [[ $published -ge $desired ]]; then
    kubectl_ get resourceslices --field-selector spec.driver=gpu.example.com
    exit 0
  fi
  sleep "$WAIT_INTERVAL"
done
echo "only $published of the $desired nodes the plugin runs on publish mock GPUs; plugin logs:" >&2
kubectl_ -n "$DRIVER_NAMESPACE" logs -l app.kubernetes.io/instance="$RELEASE_NAME" --tail 30 >&2 || true
exit 1
