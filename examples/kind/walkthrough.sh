#!/usr/bin/env bash
# The whole walkthrough in one go: cluster, image, driver, then the demos, each applied and
# checked before the next. Each step is idempotent, so running it again after a failure picks
# up where it stopped. Tear down with delete-cluster.sh.
set -euo pipefail
here=$(dirname "$0")
"$here/create-cluster.sh"
"$here/build-image.sh"
"$here/install-driver.sh"
"$here/run-demos.sh"
