#!/usr/bin/env bash
# Applies every demo under demos/ (or those named as arguments) and waits until their pods
# run. Applying again changes nothing; a demo's namespace holds all of its objects.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
need "$KUBECTL"

demos=("$@")
[[ ${#demos[@]} -gt 0 ]] || demos=("${DEMOS[@]}")
for demo in "${demos[@]}"; do
  say "demo $demo"
  kubectl_ apply -f "$KIND_DIR/demos/$demo/demo.yaml"
done
for demo in "${demos[@]}"; do
  kubectl_ wait --for=condition=Ready pod --all -n "$demo" --timeout 120s
done
