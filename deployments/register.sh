#!/usr/bin/env bash
# Create the work pools (if missing) and register every deployment in prefect.yaml against the
# server PREFECT_API_URL points at.
#
# The deployments' conductor home (artifacts, MLflow, model cache) is $CONDUCTOR_HOME, default
# ~/.conductor, stored as an absolute path in each deployment's job variables: a worker in any
# directory writes there. Nothing else about this machine (no working directory) is stored.
#   CONDUCTOR_HOME=/shared/conductor bash deployments/register.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

if [[ -z "${PREFECT_API_URL:-}" ]] && ! prefect config view 2>/dev/null | grep -q '^PREFECT_API_URL='; then
  echo "error: PREFECT_API_URL is not set; start a server (prefect server start) and" >&2
  echo "       export PREFECT_API_URL=http://127.0.0.1:4200/api" >&2
  exit 2
fi

home="${CONDUCTOR_HOME:-$HOME/.conductor}"
mkdir -p "$home"
CONDUCTOR_HOME="$(cd "$home" && pwd)"  # absolute, relative to where this script was started
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
