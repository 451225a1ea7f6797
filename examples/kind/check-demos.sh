#!/usr/bin/env bash
# Checks what each demo's containers printed against what its README says to expect: the
# GPU_DEVICE_* variables the driver gave them (bad-config-denied: that the API server refuses
# its claim). Checks the demos named as arguments (every demo
# by default, in the order of DEMOS in common.sh); exits non-zero naming every demo that
# differs. run-demos.sh runs it for each demo right after the demo's pods run.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
need "$KUBECTL"

failed=()

# uuids <namespace> <pod> <container>: the GPU UUIDs the container got, sorted, on one line.
uuids() {
  kubectl_ logs -n "$1" "$2" -c "$3" | grep -E '^GPU_DEVICE_[0-9]+=' | cut -d= -f2 | sort | tr '\n' ' '
}
count() { wc -w <<<"$1"; }
# printed <namespace> <pod> <container> <extended regex>: the container printed a matching line.
printed() {
  kubectl_ logs -n "$1" "$2" -c "$3" | grep -qE "$4"
}
# expect <demo> <what> <command...>: runs the check and records a failure.
expect() {
  local demo=$1 what=$2
  shift 2
  if "$@"; then
    say "$demo: $what"
  else
    echo "FAILED $demo: $what" >&2
    failed+=("$demo")
  fi
}

distinct_single_gpus() {
  local a b
  a=$(uuids "$1" pod0 ctr)
  b=$(uuids "$1" pod1 ctr)
  [[ $(count "$a") -eq 1 && $(count "$b") -eq 1 && $a != "$b" ]]
}
same_single_gpu() { # <namespace> <pod> <container> <pod> <container>
  local a b
  a=$(uuids "$1" "$2" "$3")
  b=$(uuids "$1" "$4" "$5")
  [[ $(count "$a") -eq 1 && $a == "$b" ]]
}
fallback_chosen() {
  local request
  request=$(kubectl_ get resourceclaims -n prioritized-list \
    -o jsonpath='{.items[0].status.allocation.devices.results[0].request}')
  [[ $(count "$(uuids prioritized-list pod ctr)") -eq 1 && $request == gpu/any ]]
}
# The GPUs per node that install-driver.sh set (kubeletPlugin.numDevices of driver-values.yaml).
num_devices=$(sed -n 's/^ *numDevices: *\([0-9][0-9]*\).*/\1/p' "$DRIVER_VALUES")
every_gpu_with_admin_access() {
  [[ $(count "$(uuids admin-access pod ctr)") -eq $num_devices ]] &&
    printed admin-access pod ctr '^DRA_ADMIN_ACCESS=true$'
}
# partitions <namespace> <pod> <container>: `<gpu> <uuid>` per partition the container got.
partitions() {
  kubectl_ logs -n "$1" "$2" -c "$3" |
    sed -n 's/^GPU_DEVICE_\([0-9][0-9]*\)_PARTITION_[0-9][0-9]*=\(.*\)$/\1 \2/p'
}
partitions_of_one_gpu_and_another_whole_gpu() {
  local parts whole
  parts=$(partitions partitionable-devices pod part-ctr)
  whole=$(uuids partitionable-devices pod whole-ctr)
  [[ $(wc -l <<<"$parts") -eq 2 && $(sort -u <<<"$parts" | wc -l) -eq 1 ]] &&
    [[ $(count "$whole") -eq 1 && $parts != *"${whole% }"* ]] &&
    [[ $(kubectl_ logs -n partitionable-devices pod -c part-ctr | grep -cE '^GPU_DEVICE_[0-9]+_PARTITION_[0-9]+_MEMORY=20480Mi$') -eq 2 ]]
}
quarter_shares_of_gpu_11() {
  local ctr
  same_single_gpu consumable-capacity pod ctr0 pod ctr1 || return 1
  for ctr in ctr0 ctr1; do
    printed consumable-capacity pod "$ctr" '^GPU_DEVICE_11_MEMORY=20Gi$' &&
      printed consumable-capacity pod "$ctr" '^GPU_DEVICE_11_COMPUTE=25$' || return 1
  done
}
# gpu_indices <namespace> <pod> <container>: the indices <n> of the whole GPUs
# (GPU_DEVICE_<n>=<uuid>) the container got, sorted, one a line.
gpu_indices() {
  kubectl_ logs -n "$1" "$2" -c "$3" | sed -n 's/^GPU_DEVICE_\([0-9][0-9]*\)=.*$/\1/p' | sort -n
}
# Two GPUs of one NVLink pair: the mock driver bridges GPUs 2k and 2k+1 (same nvlinkGroup).
two_gpus_of_one_nvlink_pair() {
  local indices first second
  indices=$(gpu_indices gpus-on-one-nvlink-group pod ctr | tr '\n' ' ')
  read -r first second _ <<<"$indices"
  [[ $(count "$indices") -eq 2 ]] && ((first % 2 == 0 && second == first + 1))
}

# The claim of bad-config-denied misspells this field of its GpuConfig.
MISSPELLED_FIELD=timeSliceConfig
# denied_at_apply: `kubectl apply` of bad-config-denied fails with the webhook's denial naming
# the misspelled field, and no claim was stored. With failurePolicy Ignore a webhook that does
# not answer lets the claim in: that is reported (and the claim deleted, so a rerun checks
# again), not passed.
denied_at_apply() {
  local out claims
  if out=$(kubectl_ apply -f "$KIND_DIR/demos/bad-config-denied/demo.yaml" 2>&1); then
    echo "the claim with the misspelled $MISSPELLED_FIELD was admitted: is the webhook running?" >&2
    echo "  kubectl -n $DRIVER_NAMESPACE get deployments,pods -l app.kubernetes.io/component=webhook" >&2
    kubectl_ delete -f "$KIND_DIR/demos/bad-config-denied/demo.yaml" --ignore-not-found >/dev/null 2>&1 || true
    return 1
  fi
  printf '%s\n' "$out"
  [[ $out == *"denied the request"* && $out == *"$MISSPELLED_FIELD"* ]] || return 1
  claims=$(kubectl_ get resourceclaims -n bad-config-denied -o name)
  [[ -z $claims ]]
}

# check <demo>: the demo's expectations, as its README states them.
check() {
  case $1 in
    two-pods-one-gpu-each)
      expect two-pods-one-gpu-each "each pod has one GPU, and they differ" \
        distinct_single_gpus two-pods-one-gpu-each ;;
    containers-share-a-gpu)
      expect containers-share-a-gpu "one GPU, the same in both containers" \
        same_single_gpu containers-share-a-gpu pod ctr0 pod ctr1 ;;
    pods-share-a-claim)
      expect pods-share-a-claim "one GPU, the same in both pods" \
        same_single_gpu pods-share-a-claim pod0 ctr pod1 ctr ;;
    cel-selector)
      expect cel-selector "the GPU has index 6 or 7" \
        printed cel-selector pod ctr '^GPU_DEVICE_[67]=' ;;
    opaque-configs)
      expect opaque-configs "ts-ctr: time-slicing with the Long interval" \
        printed opaque-configs pod ts-ctr '^GPU_DEVICE_[0-9]+_TIMESLICE_INTERVAL=Long$'
      expect opaque-configs "sp-ctr: space-partitioning into 4" \
        printed opaque-configs pod sp-ctr '^GPU_DEVICE_[0-9]+_PARTITION_COUNT=4$' ;;
    bad-config-denied)
      expect bad-config-denied "kubectl apply is denied, naming $MISSPELLED_FIELD; no claim stored" \
        denied_at_apply ;;
    prioritized-list)
      expect prioritized-list "one GPU, from the fallback alternative gpu/any" fallback_chosen ;;
    admin-access)
      expect admin-access "all $num_devices GPUs of the node, with admin access" \
        every_gpu_with_admin_access ;;
    partitionable-devices)
      expect partitionable-devices "two partitions of one GPU, and a whole GPU that is another" \
        partitions_of_one_gpu_and_another_whole_gpu ;;
    consumable-capacity)
      expect consumable-capacity "both claims share GPU 11, a quarter each" \
        quarter_shares_of_gpu_11 ;;
    gpus-on-one-nvlink-group)
      expect gpus-on-one-nvlink-group "two GPUs of one NVLink pair (2k and 2k+1)" \
        two_gpus_of_one_nvlink_pair ;;
    *)
      echo "no demo $1 (the demos: ${DEMOS[*]})" >&2
      failed+=("$1") ;;
  esac
}

demos=("$@")
[[ ${#demos[@]} -gt 0 ]] || demos=("${DEMOS[@]}")
for demo in "${demos[@]}"; do
  check "$demo"
done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "demos that differ from their README: ${failed[*]}" >&2
  exit 1
fi
if [[ $# -eq 0 ]]; then
  say "every demo matches its README"
fi
