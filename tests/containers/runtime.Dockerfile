# The container-mode tests' runtime image: the binaries this build made, on
# the Debian base the release images use, with the run-time libraries of
# both (scripts/runtime-image.sh stages bin/ and lib/: pstar, pstar-operator,
# and the shared libraries they link from outside Debian, such as CUDA's).
FROM debian:12.12-slim
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libyaml-cpp0.7 libprometheus-cpp-core1.0 libgloo0 libopenblas0-openmp libgomp1 \
      libcpprest2.10 libssl3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 pstar \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/pstar --shell /usr/sbin/nologin pstar \
 && mkdir -p /workspace && chown pstar:pstar /workspace
COPY lib/ /opt/pstar/lib/
COPY bin/ /usr/local/bin/
ENV LD_LIBRARY_PATH=/opt/pstar/lib HOME=/home/pstar
RUN ! ldd /usr/local/bin/pstar /usr/local/bin/pstar-operator | grep 'not found' \
 && /usr/local/bin/pstar --version
USER 10001:10001
WORKDIR /workspace
ENTRYPOINT ["/usr/local/bin/pstar"]
