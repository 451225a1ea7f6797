#!/usr/bin/env bash
# Builds the mock GPU plugin's image from examples/mock-gpu/Dockerfile and loads it into the
# kind cluster's nodes. Rebuilding reuses the engine's layer cache; loading again replaces the
# image on the nodes.
#
# docker needs BuildKit (the buildx plugin): the Dockerfile uses `RUN --mount` cache mounts.
# The image is built without provenance attestations: Docker 29+ and Docker Desktop keep
# images in the containerd image store and attach one, `docker save` leaves it out, and the
# nodes' `ctr images import --all-platforms` (what `kind load` runs) then fails with
# "ctr: content digest sha256:...: not found". If a load fails all the same, the image is
# streamed into each node's containerd with `docker save | ctr images import -`.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
need "$KIND" "$CONTAINER_ENGINE"

image=$IMAGE_REPOSITORY:$IMAGE_TAG
if [[ $CONTAINER_ENGINE == podman ]]; then
  say "building $image with podman"
  podman build -f "$REPO_ROOT/examples/mock-gpu/Dockerfile" -t "$image" "$REPO_ROOT"
else
  if ! "$CONTAINER_ENGINE" buildx version >/dev/null 2>&1; then
    echo "$CONTAINER_ENGINE buildx (BuildKit) is required: the Dockerfile uses RUN --mount" >&2
    echo "  install the buildx plugin (Docker Desktop and docker-ce packages ship it)" >&2
    exit 1
  fi
  say "building $image with $CONTAINER_ENGINE (BuildKit, no provenance attestation)"
  "$CONTAINER_ENGINE" buildx build --load --provenance=false \
    -f "$REPO_ROOT/examples/mock-gpu/Dockerfile" -t "$image" "$REPO_ROOT"
fi

if ! cluster_exists; then
  echo "kind cluster $CLUSTER_NAME does not exist: run create-cluster.sh first" >&2
  exit 1
fi
say "loading $image into kind cluster $CLUSTER_NAME"
if [[ $CONTAINER_ENGINE == podman ]]; then
  # kind loads podman images from an archive. mktemp with a template only: macOS's has no
  # --suffix.
  archive=$(mktemp "${TMPDIR:-/tmp}/mock-gpu-image.XXXXXX")
  trap 'rm -f "$archive"' EXIT
  podman save "$image" -o "$archive"
  "$KIND" load image-archive "$archive" --name "$CLUSTER_NAME"
elif ! "$KIND" load docker-image "$image" --name "$CLUSTER_NAME"; then
  say "kind load failed; importing $image into each node's containerd instead"
  for node in $("$KIND" get nodes --name "$CLUSTER_NAME"); do
    "$CONTAINER_ENGINE" save "$image" |
      "$CONTAINER_ENGINE" exec -i "$node" \
        ctr --namespace=k8s.io images import --digests --snapshotter=overlayfs -
  done
fi
