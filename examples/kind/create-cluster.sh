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
  # kind supports a node image only with the release that built it (its release notes list
  # the images by digest): the default image needs that release.
  kind_version=$("$KIND" version | awk '{print $2}')
  if [[ $KIND_NODE_IMAGE == "$KIND_RELEASE_NODE_IMAGE" && $kind_version != "$KIND_RELEASE" ]]; then
    echo "kind $KIND_RELEASE is required for $KIND_NODE_IMAGE; this is kind $kind_version" >&2
    echo "  install kind $KIND_RELEASE, or set KIND_NODE_IMAGE to an image (tag@sha256:digest)" >&2
    echo "  that the release notes of kind $kind_version list" >&2
    exit 1
  fi
  say "creating kind cluster $CLUSTER_NAME ($KIND_NODE_IMAGE, kind $kind_version)"
  "$KIND" create cluster --name "$CLUSTER_NAME" --image "$KIND_NODE_IMAGE" \
    --config "$KIND_DIR/kind-config.yaml" --wait 120s
fi
kubectl_ get nodes -o wide
