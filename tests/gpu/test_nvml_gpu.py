"""Real NVML on a real GPU: sampling and the embedded default. Skipped without a driver."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pynvml
import pytest

from profiler_app.core.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL
from profiler_app.sources.nvml import POWER_USAGE, NvmlSource

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def _gpu_count() -> int:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        pytest.skip(f"no NVIDIA driver: {error}")
    try:
        count: int = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        pytest.skip("NVIDIA driver present but no GPU visible")
    return count


def test_sampler_reads_every_gpu() -> None:
    count = _gpu_count()
    source = NvmlSource(
        "gpu-host",
        window_seconds=5,
        sample_interval=0.1,
        fields=[GPU_UTIL, MEM_COPY_UTIL, FB_USED, POWER_USAGE],
    )
    source.start()
    try:
        time.sleep(1.5)
        matrices = {matrix.field: matrix for matrix in source.read(1.0)}
    finally:
        source.close()
    assert source.available
    util = matrices[GPU_UTIL]
    assert util.values.shape == (count, 10)
    sampled = util.values[~np.isnan(util.values)]
    assert sampled.size >= count * 5
    assert ((sampled >= 0) & (sampled <= 100)).all()
    assert (matrices[FB_USED].values[~np.isnan(matrices[FB_USED].values)] >= 0).all()
    for labels in util.labels:
        assert labels["UUID"].startswith(("GPU-", "MIG-"))
        assert labels["modelName"]
        assert labels["Hostname"] == "gpu-host"


def test_embedded_default_profiles_the_gpus(tmp_path: Path) -> None:
    count = _gpu_count()
    database = tmp_path / "profiler.db"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "profiler_app",
            "run",
            "--once",
            "--interval",
            "3s",
            "--sample-interval",
            "0.2s",
            "--metrics-port",
            "0",
            "--store-url",
            f"sqlite:///{database}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "no NVIDIA driver found" not in completed.stderr
    with sqlite3.connect(database) as connection:
        rows = connection.execute("select gpu, job_type from gpu_window").fetchall()
    assert sorted(gpu for gpu, _ in rows) == sorted(str(i) for i in range(count))
    assert {job for _, job in rows} <= {"idle", "training", "inference", "bursty"}
