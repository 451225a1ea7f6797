# Settings shared by the kind walkthrough's scripts; sourced, not run. Override any of them
# from the environment, e.g.
#   KIND_NODE_IMAGE=kindest/node:v1.34.8@sha256:02722c2dedddcfc00febf5d27fbeb9b7b2c14294c82109ff4a85d89ac9ba3256 ./create-cluster.sh
# shellcheck shell=bash
# shellcheck disable=SC2034 # the variables are for the scripts that source this file

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KIND_DIR=$REPO_ROOT/examples/kind
CHART_DIR=$REPO_ROOT/examples/mock-gpu/deploy/helm/mock-gpu-driver
# The chart values the demos need (GPU count, partitionable and consumable-capacity modes);
# examples/mock-gpu/tests/kind_demos.rs runs the demos with the same file.
DRIVER_VALUES=$KIND_DIR/driver-values.yaml

: "${CLUSTER_NAME:=dra-mock-gpu}"
# kind supports a node image only with the kind release that built it, and only by digest:
# these are the v1.36.1 image and the release that lists it
# (https://github.com/kubernetes-sigs/kind/releases/tag/v0.32.0, which also lists
# v1.35.5@sha256:ce977ae6d65918d0b58a5f8b5e940429c2ce42fa3a5619ec2bbc60b949c0ac95 and
# v1.34.8@sha256:02722c2dedddcfc00febf5d27fbeb9b7b2c14294c82109ff4a85d89ac9ba3256).
# create-cluster.sh refuses another kind version with this image.
KIND_RELEASE=v0.32.0
KIND_RELEASE_NODE_IMAGE=kindest/node:v1.36.1@sha256:3489c7674813ba5d8b1a9977baea8a6e553784dab7b84759d1014dbd78f7ebd5
: "${KIND_NODE_IMAGE:=$KIND_RELEASE_NODE_IMAGE}"
: "${DRIVER_NAMESPACE:=dra-mock-gpu}"
: "${RELEASE_NAME:=mock-gpu}"
: "${IMAGE_REPOSITORY:=ghcr.io/dra-sdk/mock-gpu-kubelet-plugin}"
: "${IMAGE_TAG:=dev}"
: "${KIND:=kind}"
: "${KUBECTL:=kubectl}"
: "${HELM:=helm}"
# How long install-driver.sh waits for the ResourceSlices: WAIT_ATTEMPTS polls WAIT_INTERVAL
# seconds apart.
: "${WAIT_ATTEMPTS:=60}"
: "${WAIT_INTERVAL:=2}"
# docker or podman, whichever is installed (kind supports both).
if [[ -z ${CONTAINER_ENGINE:-} ]]; then
  if command -v docker >/dev/null 2>&1; then
    CONTAINER_ENGINE=docker
  else
    CONTAINER_ENGINE=podman
  fi
fi
export KIND_EXPERIMENTAL_PROVIDER=${KIND_EXPERIMENTAL_PROVIDER:-$CONTAINER_ENGINE}
KUBE_CONTEXT=kind-$CLUSTER_NAME

say() { printf '==> %s\n' "$*"; }

# need <command>...: fail early, naming what is missing.
need() {
  local missing=()
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "missing: ${missing[*]} (see examples/kind/README.md)" >&2
    exit 1
  fi
}

cluster_exists() {
  "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"
}

kubectl_() {
  "$KUBECTL" --context "$KUBE_CONTEXT" "$@"
}

# The demos, in the order run-demos.sh applies and checks them, one at a time: one directory
# each under demos/. admin-access comes first: its `allocationMode: All` request gets the GPUs
# that have capacity left, which is all 14 only while no other demo holds one.
# gpus-on-one-nvlink-group comes last: the free GPUs are then 10, 12 and 13, so only its
# constraint gets it the NVLink pair 12 and 13 rather than 10 and 12.
DEMOS=(admin-access two-pods-one-gpu-each containers-share-a-gpu pods-share-a-claim cel-selector
  opaque-configs bad-config-denied prioritized-list partitionable-devices consumable-capacity
  gpus-on-one-nvlink-group)
# The demos whose manifest the API server must refuse (the driver's admission webhook denies
# them): run-demos.sh runs no pods for them; check-demos.sh applies them and expects the
# denial.
DENIED_DEMOS=(bad-config-denied)

# denied <demo>: whether the demo is one of DENIED_DEMOS.
denied() {
  local demo
  for demo in "${DENIED_DEMOS[@]}"; do
    [[ $demo == "$1" ]] && return 0
  done
  return 1
}
