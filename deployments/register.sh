#!/usr/bin/env bash
# Create the process work pool (if missing) and register every deployment in prefect.yaml.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
prefect work-pool inspect conductor-process >/dev/null 2>&1 \
  || prefect work-pool create conductor-process --type process
# Training runs on its own pool; start its worker on a GPU host (CUDA_VISIBLE_DEVICES set).
prefect work-pool inspect conductor-gpu >/dev/null 2>&1 \
  || prefect work-pool create conductor-gpu --type process
# retrain-orchrm's pool is a variable, so it can point at the GPU pool; CPU by default.
prefect variable inspect orchrm_work_pool >/dev/null 2>&1 \
  || prefect variable set orchrm_work_pool conductor-process
cd "$here/.."
prefect --no-prompt deploy --all --prefect-file "$here/prefect.yaml"
