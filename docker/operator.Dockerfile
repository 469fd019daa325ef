# syntax=docker/dockerfile:1
# The operator image: pstar-operator on Debian 12, user 65532, nothing else.
# Build from the repository root (docs/install.md):
#   docker build -f docker/operator.Dockerfile \
#     -t ghcr.io/patrickstar-k8s/pstar-operator:0.1.0 .

FROM debian:12.12 AS build
# scripts/build-images.sh removes this stage's image by its label.
LABEL io.patrickstar.stage=build
ARG DEBIAN_FRONTEND=noninteractive
# The whole project configures (the operator links the worker's config and
# memory planner), so the build needs the worker's libraries too.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      cmake ninja-build g++ pkg-config \
      libyaml-cpp-dev libcpprest-dev libssl-dev prometheus-cpp-dev nlohmann-json3-dev \
      libgloo-dev libopenblas-dev libopenblas-openmp-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# No -march=native: the image must run on any CPU of its architecture.
RUN cmake -S . -B /build -G Ninja \
      -DCMAKE_BUILD_TYPE=Release \
      -DPSTAR_WITH_CUDA=OFF \
      -DPSTAR_NATIVE_ARCH=OFF \
      -DPSTAR_BUILD_TESTS=OFF \
 && cmake --build /build --target pstar-operator

FROM debian:12.12-slim
ARG DEBIAN_FRONTEND=noninteractive
# Exactly what `ldd pstar-operator` lists: cpprestsdk (with its brotli and
# zlib), OpenSSL, yaml-cpp, prometheus-cpp core, and OpenBLAS (OpenMP
# flavour, with libgomp and libgfortran) through the memory planner.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libcpprest2.10 libssl3 libyaml-cpp0.7 libprometheus-cpp-core1.0 \
      libopenblas0-openmp libgomp1 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nonroot
COPY --from=build /build/bin/pstar-operator /usr/local/bin/pstar-operator
# Fails the build when a shared library is missing.
RUN ! ldd /usr/local/bin/pstar-operator | grep 'not found' \
 && /usr/local/bin/pstar-operator --help > /dev/null
USER 65532:65532
# /metrics, /healthz and /readyz.
EXPOSE 8080
LABEL org.opencontainers.image.title="pstar-operator" \
      org.opencontainers.image.description="Kubernetes operator for PatrickStarJobs" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/usr/local/bin/pstar-operator"]
