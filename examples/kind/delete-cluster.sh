#!/usr/bin/env bash
# Deletes the kind cluster, and with it everything the walkthrough made. Nothing to do if it
# does not exist.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
need "$KIND"

if cluster_exists; then
  say "deleting kind cluster $CLUSTER_NAME"
  "$KIND" delete cluster --name "$CLUSTER_NAME"
else
  say "kind cluster $CLUSTER_NAME does not exist"
fi
