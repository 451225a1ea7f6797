#!/usr/bin/env bash
# Installs (or upgrades) the mock GPU driver's Helm chart with the image build-image.sh
# loaded and the demos' settings (driver-values.yaml), and waits until the plugin runs on
# every node and each node publishes its GPUs.
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

say "waiting for every node's ResourceSlices"
nodes=$(kubectl_ get nodes -o name | wc -l)
for _ in $(seq 1 60); do
  published=$(kubectl_ get resourceslices --field-selector spec.driver=gpu.example.com \
    -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u | grep -c . || true)
  if [[ $published -ge $nodes ]]; then
    kubectl_ get resourceslices --field-selector spec.driver=gpu.example.com
    exit 0
  fi
  sleep 2
done
echo "only $published of $nodes nodes publish mock GPUs; plugin logs:" >&2
kubectl_ -n "$DRIVER_NAMESPACE" logs -l app.kubernetes.io/instance="$RELEASE_NAME" --tail 30 >&2 || true
exit 1
