# Settings shared by the kind walkthrough's scripts; sourced, not run. Override any of them
# from the environment, e.g. KIND_NODE_IMAGE=kindest/node:v1.34.0 ./create-cluster.sh
# shellcheck shell=bash
# shellcheck disable=SC2034 # the variables are for the scripts that source this file

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KIND_DIR=$REPO_ROOT/examples/kind
CHART_DIR=$REPO_ROOT/examples/mock-gpu/deploy/helm/mock-gpu-driver
# The chart values the demos need (GPU count, partitionable and consumable-capacity modes);
# examples/mock-gpu/tests/kind_demos.rs runs the demos with the same file.
DRIVER_VALUES=$KIND_DIR/driver-values.yaml

: "${CLUSTER_NAME:=dra-mock-gpu}"
: "${KIND_NODE_IMAGE:=kindest/node:v1.36.1}"
: "${DRIVER_NAMESPACE:=dra-mock-gpu}"
: "${RELEASE_NAME:=mock-gpu}"
: "${IMAGE_REPOSITORY:=ghcr.io/dra-sdk/mock-gpu-kubelet-plugin}"
: "${IMAGE_TAG:=dev}"
: "${KIND:=kind}"
: "${KUBECTL:=kubectl}"
: "${HELM:=helm}"
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

# The demos, in the order they run: one directory each under demos/.
DEMOS=(two-pods-one-gpu-each containers-share-a-gpu pods-share-a-claim cel-selector opaque-configs
  prioritized-list admin-access partitionable-devices consumable-capacity)
