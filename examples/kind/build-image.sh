#!/usr/bin/env bash
# Builds the mock GPU plugin's image from examples/mock-gpu/Dockerfile and loads it into the
# kind cluster's nodes. Rebuilding reuses the engine's layer cache; loading again replaces the
# image on the nodes.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
need "$KIND" "$CONTAINER_ENGINE"

image=$IMAGE_REPOSITORY:$IMAGE_TAG
say "building $image with $CONTAINER_ENGINE"
"$CONTAINER_ENGINE" build -f "$REPO_ROOT/examples/mock-gpu/Dockerfile" -t "$image" "$REPO_ROOT"

if ! cluster_exists; then
  echo "kind cluster $CLUSTER_NAME does not exist: run create-cluster.sh first" >&2
  exit 1
fi
say "loading $image into kind cluster $CLUSTER_NAME"
if [[ $CONTAINER_ENGINE == podman ]]; then
  # kind loads podman images from an archive.
  archive=$(mktemp --suffix=.tar)
  trap 'rm -f "$archive"' EXIT
  podman save "$image" -o "$archive"
  "$KIND" load image-archive "$archive" --name "$CLUSTER_NAME"
else
  "$KIND" load docker-image "$image" --name "$CLUSTER_NAME"
fi
