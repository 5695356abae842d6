# gpu-profiler: the profiling daemon (`gpu-profiler run`) for Kubernetes GPU nodes.
# Build from the repository root: docker build -t gpu-profiler .
# Runs as uid 65532 and works with a read-only root filesystem: the only writable path it
# needs is the SQLite store's directory (/var/lib/gpu-profiler), or none with
# GPU_PROFILER_STORE_URL=none / a PostgreSQL URL.

FROM python:3.11-slim-bookworm AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY constraints/image.txt ./constraints/image.txt
COPY profiler_app ./profiler_app
# The wheel with its runtime dependencies plus psycopg for PostgreSQL stores (the "postgres"
# extra); not the dev, infra or ansible extras. Every dependency at its pinned version.
RUN python -m venv /opt/gpu-profiler \
 && /opt/gpu-profiler/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/gpu-profiler/bin/pip install --constraint constraints/image.txt \
      "$(ls /wheels/gpu_cluster_profiler-*.whl)[postgres]" \
 && /opt/gpu-profiler/bin/gpu-profiler --version

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="gpu-profiler" \
      org.opencontainers.image.description="Classifies what each GPU of a node does and publishes it" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /opt/gpu-profiler /opt/gpu-profiler
RUN install -d -o 65532 -g 65532 -m 0750 /var/lib/gpu-profiler
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
