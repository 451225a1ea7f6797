#!/usr/bin/env bash
# Deletes every demo's namespace (with its pods and claims); the driver stays installed.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
need "$KUBECTL"

for demo in "${DEMOS[@]}"; do
  kubectl_ delete namespace "$demo" --ignore-not-found --wait=true
done
