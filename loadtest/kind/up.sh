#!/usr/bin/env bash
# End-to-end on a local kind cluster (needs Docker, kind, kubectl and helm 3.14+/4):
#   cluster -> images -> metrics-server -> chart (in-chart stores + operator) -> example ContextProfiles
#   -> seed Job -> in-cluster locust Job (p99 gate) -> results -> helm test.
# Re-runnable: existing cluster, release and Jobs are reused or replaced.
#
#   loadtest/kind/up.sh            # everything
#   SKIP_BUILD=1 loadtest/kind/up.sh   # reuse the images already loaded
#   loadtest/kind/down.sh          # delete the cluster
#
# Not run in this repository's CI (no Docker engine there); see docs/kubernetes.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KIND_DIR="${ROOT}/loadtest/kind"
CLUSTER="${KIND_CLUSTER:-ibex}"
# Optional: a kindest/node image to pin the Kubernetes version (default: the kind release's own).
NODE_IMAGE="${KIND_NODE_IMAGE:-}"
NAMESPACE="${NAMESPACE:-ibex}"
# The Jobs in this directory address the service as "ibex-context": keep the release name.
RELEASE="ibex-context"
IMAGE="ibex-context:kind"
LOADTEST_IMAGE="ibex-context-loadtest:kind"
METRICS_SERVER_CHART_VERSION="3.12.2"
KUBECTL=(kubectl --context "kind-${CLUSTER}")

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

require() {
  local tool
  for tool in "$@"; do
    command -v "${tool}" >/dev/null 2>&1 || { echo "up.sh: ${tool} is required" >&2; exit 1; }
  done
}

# wait_job NAME TIMEOUT_SECONDS: 0 when the Job completes, 1 when it fails or times out.
wait_job() {
  local name="$1" timeout="$2" waited=0 succeeded failed
  while (( waited < timeout )); do
    succeeded="$("${KUBECTL[@]}" -n "${NAMESPACE}" get job "${name}" -o jsonpath='{.status.succeeded}')"
    failed="$("${KUBECTL[@]}" -n "${NAMESPACE}" get job "${name}" -o jsonpath='{.status.failed}')"
    if [[ "${succeeded:-0}" -ge 1 ]]; then return 0; fi
    if [[ "${failed:-0}" -ge 1 ]]; then
      local backoff
      backoff="$("${KUBECTL[@]}" -n "${NAMESPACE}" get job "${name}" -o jsonpath='{.spec.backoffLimit}')"
      if (( failed > backoff )); then return 1; fi
    fi
    sleep 5
    waited=$((waited + 5))
  done
  echo "up.sh: job ${name} did not finish within ${timeout}s" >&2
  return 1
}

# run_job FILE NAME TIMEOUT: (re)create the Job, wait, print its logs; fail the script if the Job failed.
run_job() {
  local file="$1" name="$2" timeout="$3" status=0
  "${KUBECTL[@]}" -n "${NAMESPACE}" delete job "${name}" --ignore-not-found --wait=true
  "${KUBECTL[@]}" -n "${NAMESPACE}" apply -f "${file}"
  wait_job "${name}" "${timeout}" || status=$?
  "${KUBECTL[@]}" -n "${NAMESPACE}" logs "job/${name}" --all-containers --tail=-1 || true
  if (( status != 0 )); then
    "${KUBECTL[@]}" -n "${NAMESPACE}" describe job "${name}" >&2 || true
    echo "up.sh: job ${name} failed" >&2
    exit 1
  fi
}

require docker kind kubectl helm

log "kind cluster ${CLUSTER}"
if kind get clusters | grep -qx "${CLUSTER}"; then
  echo "reusing cluster ${CLUSTER}"
else
  create=(kind create cluster --name "${CLUSTER}" --config "${KIND_DIR}/kind-config.yaml" --wait 120s)
  if [[ -n "${NODE_IMAGE}" ]]; then create+=(--image "${NODE_IMAGE}"); fi
  "${create[@]}"
fi
"${KUBECTL[@]}" version

if [[ "${SKIP_BUILD:-0}" != "1" ]]; then
  log "images ${IMAGE} and ${LOADTEST_IMAGE}"
  docker build -t "${IMAGE}" "${ROOT}"
  docker build --target loadtest -t "${LOADTEST_IMAGE}" "${ROOT}"
  kind load docker-image "${IMAGE}" "${LOADTEST_IMAGE}" --name "${CLUSTER}"
fi

log "metrics-server (CPU metrics for the HPA; kubelet certificates in kind are self-signed)"
helm --kube-context "kind-${CLUSTER}" upgrade --install metrics-server metrics-server \
  --repo https://kubernetes-sigs.github.io/metrics-server/ --version "${METRICS_SERVER_CHART_VERSION}" \
  --namespace kube-system --set 'args={--kubelet-insecure-tls}' --wait --timeout 5m

log "chart ${RELEASE} in ${NAMESPACE} (in-chart Redis and PostgreSQL, operator)"
helm --kube-context "kind-${CLUSTER}" upgrade --install "${RELEASE}" "${ROOT}/charts/ibex-context" \
  --namespace "${NAMESPACE}" --create-namespace \
  --values "${KIND_DIR}/values-kind.yaml" --wait --timeout 10m
# Helm installs crds/ only on first install; keep the CRD current on re-runs.
"${KUBECTL[@]}" apply --server-side -f "${ROOT}/charts/ibex-context/crds/"
"${KUBECTL[@]}" -n "${NAMESPACE}" wait --for=condition=Available deployment --all --timeout=300s

log "example ContextProfiles"
mapfile -t examples < <(grep -lE '^kind: ContextProfile$' "${ROOT}"/examples/*.yaml 2>/dev/null || true)
for example in "${examples[@]}"; do
  "${KUBECTL[@]}" -n "${NAMESPACE}" apply -f "${example}"
done
"${KUBECTL[@]}" -n "${NAMESPACE}" wait --for=condition=Ready contextprofile --all --timeout=120s
"${KUBECTL[@]}" -n "${NAMESPACE}" get contextprofiles
"${KUBECTL[@]}" -n "${NAMESPACE}" get "configmap/${RELEASE}-profiles" "hpa/${RELEASE}"

log "seed data (Job ibex-seed)"
"${KUBECTL[@]}" -n "${NAMESPACE}" apply -f "${KIND_DIR}/loadtest-data-pvc.yaml"
run_job "${KIND_DIR}/seed-job.yaml" ibex-seed 900
# The seeder writes PostgreSQL only; drop what the service cached in Redis from before the seed.
"${KUBECTL[@]}" -n "${NAMESPACE}" exec "statefulset/${RELEASE}-redis" -- redis-cli FLUSHALL

log "load test (Job ibex-locust, in-cluster)"
run_job "${KIND_DIR}/locust-job.yaml" ibex-locust 900

log "after the load"
"${KUBECTL[@]}" -n "${NAMESPACE}" get hpa,deployments,pods -o wide

log "helm test"
helm --kube-context "kind-${CLUSTER}" test "${RELEASE}" --namespace "${NAMESPACE}" --logs

log "done: kubectl --context kind-${CLUSTER} -n ${NAMESPACE} get all; loadtest/kind/down.sh to delete"
