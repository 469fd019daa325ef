# syntax=docker/dockerfile:1
# The worker image: `pstar` (train, launch, plan, export), built with CUDA and
# NCCL; the operator runs `pstar launch` in it. A `device: cuda` job trains on
# the GPUs the device plugin gives the pod (docs/gpu.md). Build from the
# repository root (docs/install.md):
#   docker build -f docker/worker.Dockerfile \
#     -t ghcr.io/patrickstar-k8s/pstar-worker:0.1.0 .
# CPU jobs (device: cpu) run in the same image; no GPU is needed to run it.

# The CUDA release the worker is built and run with. The host driver must
# support it (CUDA 13 needs driver 580 or newer).
ARG CUDA_VERSION=13.0.1
ARG UBUNTU=ubuntu24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
# scripts/build-images.sh removes this stage's image by its label.
LABEL io.patrickstar.stage=build
ARG DEBIAN_FRONTEND=noninteractive
# The devel image brings nvcc, cuBLAS and NCCL; the rest are distribution
# packages (the same list as scripts/install-deps.sh, less the test tools).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      cmake ninja-build g++ pkg-config \
      libyaml-cpp-dev libcpprest-dev libssl-dev prometheus-cpp-dev nlohmann-json3-dev \
      libgloo-dev libopenblas-dev libopenblas-openmp-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# No -march=native: the image must run on any CPU of its architecture.
# GPU code for Ampere (sm_80) and Hopper (sm_90).
RUN cmake -S . -B /build -G Ninja \
      -DCMAKE_BUILD_TYPE=Release \
      -DPSTAR_WITH_CUDA=ON \
      -DPSTAR_NATIVE_ARCH=OFF \
      -DPSTAR_BUILD_TESTS=OFF \
      -DCMAKE_CUDA_ARCHITECTURES="80;90" \
 && cmake --build /build --target pstar
# The shared libraries pstar needs beyond what the runtime image has: glibc,
# the C++ runtime and the CUDA libraries (cudart, cuBLAS, NCCL) are there, and
# the driver's libcuda comes from the host through the NVIDIA container runtime.
RUN mkdir -p /out/lib \
 && cp /build/bin/pstar /out/pstar \
 && ldd /build/bin/pstar \
    | awk '$3 ~ /^\// { print $3 }' \
    | grep -Ev '/(ld-linux[^/]*|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcu[A-Za-z]*|libnccl|libnv[A-Za-z]*)\.so' \
    | xargs -r -I{} cp -L {} /out/lib/

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}
COPY --from=build /out/lib/ /usr/local/lib/pstar/
COPY --from=build /out/pstar /usr/local/bin/pstar
# The libraries are found through the loader cache; the build fails here if
# any is missing. The user owns /workspace, the working directory.
RUN echo /usr/local/lib/pstar > /etc/ld.so.conf.d/pstar.conf \
 && ldconfig \
 && ! ldd /usr/local/bin/pstar | grep 'not found' \
 && groupadd --gid 10001 pstar \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/pstar --shell /usr/sbin/nologin pstar \
 && mkdir -p /workspace \
 && chown pstar:pstar /workspace
USER 10001:10001
WORKDIR /workspace
ENV HOME=/home/pstar
# The CUDA base image exposes every GPU of the node to any container the
# NVIDIA runtime starts; a CPU pod must see none. The device plugin sets the
# variable to the allocated GPUs for pods that request nvidia.com/gpu.
ENV NVIDIA_VISIBLE_DEVICES=void
LABEL org.opencontainers.image.title="pstar-worker" \
      org.opencontainers.image.description="PatrickStar GPT trainer with chunk-based CPU/GPU memory" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/usr/local/bin/pstar"]
CMD ["--help"]
