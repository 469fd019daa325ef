# syntax=docker/dockerfile:1
# The CPU worker image: `pstar` built without CUDA on Debian slim with
# OpenBLAS, for `device: cpu` jobs (the operator picks it for them; the CUDA
# image, docker/worker.Dockerfile, is gigabytes of CUDA runtime a CPU job
# never loads). Build from the repository root (docs/install.md):
#   docker build -f docker/worker-cpu.Dockerfile \
#     -t ghcr.io/patrickstar-k8s/pstar-worker-cpu:0.1.0 .
# The bases are pinned to exact Debian point-release tags; for a release, pin
# them by digest too (debian:12.12-slim@sha256:...; docs/install.md says how).

FROM debian:12.12 AS build
# scripts/build-images.sh removes this stage's image by its label.
LABEL io.patrickstar.stage=build
ARG DEBIAN_FRONTEND=noninteractive
# The worker's distribution packages (scripts/install-deps.sh less the
# operator's, the tests' and CUDA).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      cmake ninja-build g++ pkg-config \
      libyaml-cpp-dev prometheus-cpp-dev nlohmann-json3-dev \
      libgloo-dev libopenblas-dev libopenblas-openmp-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# No -march=native: the image must run on any CPU of its architecture.
RUN cmake -S . -B /build -G Ninja \
      -DCMAKE_BUILD_TYPE=Release \
      -DPSTAR_WITH_CUDA=OFF \
      -DPSTAR_BUILD_OPERATOR=OFF \
      -DPSTAR_NATIVE_ARCH=OFF \
      -DPSTAR_BUILD_TESTS=OFF \
 && cmake --build /build --target pstar

FROM debian:12.12-slim
ARG DEBIAN_FRONTEND=noninteractive
# The run-time libraries of the packages above (Gloo brings its own).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libyaml-cpp0.7 libprometheus-cpp-core1.0 libgloo0 libopenblas0-openmp libgomp1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /build/bin/pstar /usr/local/bin/pstar
# The build fails here if a library is missing. The user owns /workspace,
# the working directory.
RUN ! ldd /usr/local/bin/pstar | grep 'not found' \
 && /usr/local/bin/pstar --version \
 && groupadd --gid 10001 pstar \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/pstar --shell /usr/sbin/nologin pstar \
 && mkdir -p /workspace \
 && chown pstar:pstar /workspace
USER 10001:10001
WORKDIR /workspace
ENV HOME=/home/pstar
LABEL org.opencontainers.image.title="pstar-worker-cpu" \
      org.opencontainers.image.description="PatrickStar GPT trainer, CPU build (no CUDA)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/usr/local/bin/pstar"]
CMD ["--help"]
