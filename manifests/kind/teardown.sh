#!/usr/bin/env bash
# Undo manifests/kind/quickstart.sh.
#
#   manifests/kind/teardown.sh                 # delete the whole kind cluster
#   manifests/kind/teardown.sh --keep-cluster  # remove only the echo app and sluice
#
# Environment: CLUSTER_NAME (default sluice).
set -euo pipefail

CLUSTER_NAME="${CLUSTER_NAME:-sluice}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CONTEXT="kind-$CLUSTER_NAME"

keep_cluster=0
case "${1:-}" in
  "") ;;
  --keep-cluster) keep_cluster=1 ;;
  -h | --help) sed -n '2,8p' "$0"; exit 0 ;;
  *) echo "teardown: unknown argument $1" >&2; exit 2 ;;
esac

command -v kind >/dev/null 2>&1 || { echo "teardown: kind is required" >&2; exit 1; }
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
  echo "teardown: no kind cluster named $CLUSTER_NAME, nothing to do"
  exit 0
fi

if [[ "$keep_cluster" == 1 ]]; then
  kubectl --context "$CONTEXT" delete namespace echo --ignore-not-found --wait=true
  kubectl --context "$CONTEXT" delete -k "$REPO_ROOT/manifests/kind" --ignore-not-found --wait=true
  echo "teardown: removed the echo app and sluice; cluster $CLUSTER_NAME kept"
else
  kind delete cluster --name "$CLUSTER_NAME"
fi
