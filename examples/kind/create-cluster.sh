#!/usr/bin/env bash
# Creates the kind cluster (a control plane and a worker, CDI on, the DRA feature gates of
# kind-config.yaml). Does nothing if it exists already.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
need "$KIND" "$KUBECTL" "$CONTAINER_ENGINE"

if cluster_exists; then
  say "kind cluster $CLUSTER_NAME exists already"
else
  say "creating kind cluster $CLUSTER_NAME ($KIND_NODE_IMAGE)"
  "$KIND" create cluster --name "$CLUSTER_NAME" --image "$KIND_NODE_IMAGE" \
    --config "$KIND_DIR/kind-config.yaml" --wait 120s
fi
kubectl_ get nodes -o wide
