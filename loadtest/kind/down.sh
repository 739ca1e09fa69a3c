#!/usr/bin/env bash
# Delete the kind cluster created by loadtest/kind/up.sh (and everything in it).
set -euo pipefail

CLUSTER="${KIND_CLUSTER:-ibex}"
command -v kind >/dev/null 2>&1 || { echo "down.sh: kind is required" >&2; exit 1; }
if kind get clusters | grep -qx "${CLUSTER}"; then
  kind delete cluster --name "${CLUSTER}"
else
  echo "no kind cluster named ${CLUSTER}"
fi
