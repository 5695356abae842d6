# gpu-profiler: the profiling daemon (`gpu-profiler run`) for Kubernetes GPU nodes.
# Build from the repository root: docker build -t gpu-profiler .
# Runs as uid 65532 and works with a read-only root filesystem: the only writable path it
# needs is the SQLite store's directory (/var/lib/gpu-profiler), or none with
# GPU_PROFILER_STORE_URL=none / a PostgreSQL URL.

# Both stages on python:3.11-slim-bookworm by the digest of its multi-arch index (amd64 and
# arm64), the tag kept for people. The digest was taken from a public record of the tag, not
# re-resolved from a registry here: `docker buildx imagetools inspect python:3.11-slim-bookworm`
# shows the current one (docs/operations.md, "Supply chain").
FROM python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91 AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY constraints/image.txt ./constraints/image.txt
COPY profiler_app ./profiler_app
# The wheel with its runtime dependencies plus psycopg for PostgreSQL stores (the "postgres"
# extra); not the dev, infra or ansible extras. Every dependency, and setuptools that builds the
# wheel, from the hashed lock; then the wheel with no index at all, so nothing unlocked is fetched
# and a dependency missing from the lock fails the build.
RUN python -m venv /opt/gpu-profiler \
 && /opt/gpu-profiler/bin/pip install --require-hashes --no-deps -r constraints/image.txt \
 && /opt/gpu-profiler/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/gpu-profiler/bin/pip install --no-index "$(ls /wheels/gpu_cluster_profiler-*.whl)[postgres]" \
 && /opt/gpu-profiler/bin/pip uninstall --yes setuptools \
 && /opt/gpu-profiler/bin/pip check \
 && /opt/gpu-profiler/bin/gpu-profiler --version

FROM python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91
LABEL org.opencontainers.image.title="gpu-profiler" \
      org.opencontainers.image.description="Classifies what each GPU of a node does and publishes it" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /opt/gpu-profiler /opt/gpu-profiler
# The base image ships the standard library without bytecode, and a read-only root keeps Python
# from caching any: every command would compile the modules it imports each time it starts
# (0.2-0.5 s; benchmarks/RESULTS.md). Compiled once here, 10 MiB, leaving out what no command
# imports: the GUI, 2to3, distutils, pydoc's data, pip's bootstrap and the base image's pip.
RUN install -d -o 65532 -g 65532 -m 0750 /var/lib/gpu-profiler \
 && python -m compileall -q \
      -x '/(idlelib|tkinter|turtledemo|lib2to3|ensurepip|distutils|pydoc_data|site-packages)/' \
      /usr/local/lib/python3.11
# One OpenBLAS thread: the analysis is vectorised and small, and a BLAS thread pool sized to a
# 100-core GPU node would only cost memory.
ENV PATH=/opt/gpu-profiler/bin:$PATH \
    OPENBLAS_NUM_THREADS=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    XDG_DATA_HOME=/var/lib
USER 65532:65532
EXPOSE 9401
ENTRYPOINT ["gpu-profiler"]
CMD ["run"]
