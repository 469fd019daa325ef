# The container-mode tests' runtime image: the binaries this build made
# (scripts/runtime-image.sh stages them in bin/) on the Debian base the
# release images use, with the run-time libraries of both from Debian. The
# libraries they link from outside Debian (CUDA's, in a CUDA build) are not
# copied in: the node provides them at /opt/pstar/lib, mounted read-only, as
# a GPU node's container toolkit mounts its driver's libraries.
FROM debian:12.12-slim
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libyaml-cpp0.7 libprometheus-cpp-core1.0 libgloo0 libopenblas0-openmp libgomp1 \
      libcpprest2.10 libssl3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 pstar \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/pstar --shell /usr/sbin/nologin pstar \
 && mkdir -p /workspace /opt/pstar/lib && chown pstar:pstar /workspace
COPY bin/ /usr/local/bin/
ENV LD_LIBRARY_PATH=/opt/pstar/lib HOME=/home/pstar
USER 10001:10001
WORKDIR /workspace
ENTRYPOINT ["/usr/local/bin/pstar"]
