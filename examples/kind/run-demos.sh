#!/usr/bin/env bash
# Runs the demos one at a time, in the order of DEMOS in common.sh (or those named as
# arguments, in the order given): applies a demo, waits until its pods run, and checks it with
# check-demos.sh before the next one starts, so each check sees the GPUs as its README
# describes them (admin-access, first, sees all 14; the demos after it hold a GPU or two each).
# Stops at the first demo that differs. Applying again changes nothing; a demo's namespace
# holds all of its objects. A demo of DENIED_DEMOS (bad-config-denied) has no pods: its check
# applies it and expects the API server to refuse it.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
need "$KUBECTL"

demos=("$@")
[[ ${#demos[@]} -gt 0 ]] || demos=("${DEMOS[@]}")
for demo in "${demos[@]}"; do
  if [[ ! -f $KIND_DIR/demos/$demo/demo.yaml ]]; then
    echo "no demo $demo (the demos: ${DEMOS[*]})" >&2
    exit 1
  fi
done
for demo in "${demos[@]}"; do
  say "demo $demo"
  if denied "$demo"; then
    # No pods: the check applies the manifest and expects the webhook's denial.
    "$KIND_DIR/check-demos.sh" "$demo"
    continue
  fi
  kubectl_ apply -f "$KIND_DIR/demos/$demo/demo.yaml"
  if ! kubectl_ wait --for=condition=Ready pod --all -n "$demo" --timeout 120s; then
    echo "the pods of demo $demo do not run; kubectl describe pods -n $demo says why" >&2
    exit 1
  fi
  "$KIND_DIR/check-demos.sh" "$demo"
done
say "every demo ran and matches its README"
