#!/usr/bin/env bash
# Create the work pools (if missing) and register every deployment in prefect.yaml against the
# server PREFECT_API_URL points at.
#
# The deployments' conductor home (artifacts, MLflow) is the one every `conductor` command
# uses: $CONDUCTOR_HOME, default ~/.conductor (prefect_conductor.conductor.home decides, so the two never
# differ), stored as an absolute path in each deployment's job variables: a worker in any
# directory writes there. Nothing else about this machine (no working directory) is stored.
#   CONDUCTOR_HOME=/shared/conductor bash deployments/register.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

if [[ -z "${PREFECT_API_URL:-}" ]] && ! prefect config view 2>/dev/null | grep -q '^PREFECT_API_URL='; then
  echo "error: PREFECT_API_URL is not set; start a server (prefect server start) and" >&2
  echo "       export PREFECT_API_URL=http://127.0.0.1:4200/api" >&2
  exit 2
fi

# Absolute, relative to where this script was started; the same rule as the commands'.
if ! CONDUCTOR_HOME="$(python -c 'from prefect_conductor.conductor.home import conductor_home; print(conductor_home())')"; then
  echo "error: cannot import conductor; activate the environment prefect-conductor is installed in" >&2
  exit 2
fi
mkdir -p "$CONDUCTOR_HOME"
export CONDUCTOR_HOME

prefect work-pool inspect conductor-process >/dev/null 2>&1 \
  || prefect work-pool create conductor-process --type process
# Training runs on its own pool; start its worker on a GPU host (CUDA_VISIBLE_DEVICES set).
prefect work-pool inspect conductor-gpu >/dev/null 2>&1 \
  || prefect work-pool create conductor-gpu --type process
# retrain-orchrm's pool is a variable, so it can point at the GPU pool; CPU by default.
prefect variable inspect orchrm_work_pool >/dev/null 2>&1 \
  || prefect variable set orchrm_work_pool conductor-process
prefect --no-prompt deploy --all --prefect-file "$here/prefect.yaml"
echo "conductor home of these deployments: $CONDUCTOR_HOME"
