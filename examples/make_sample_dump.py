"""Write examples/prometheus-query-range.json: a realistic, reproducible Prometheus answer.

One node (gpu-node-1) with 4 GPUs labelled as dcgm-exporter labels them: GPU 0 runs a training
loop (120 s iterations), GPU 1 an inference server, GPU 2 is idle, GPU 3 runs sporadic batch
bursts. 30 minutes at 10 s, ending 2026-11-22T04:00:00Z, fields DCGM_FI_DEV_GPU_UTIL,
DCGM_FI_DEV_MEM_COPY_UTIL, DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_POWER_USAGE (an A100 SXM: about
55 W idle, 400 W limit) in one document, as the HTTP API answers

    /api/v1/query_range?query={__name__=~"DCGM_FI_DEV_(GPU_UTIL|MEM_COPY_UTIL|FB_USED|POWER_USAGE)",
        Hostname="gpu-node-1"}&start=...&end=...&step=10s

Run from the repository root: python examples/make_sample_dump.py
"""

import json
import uuid
from pathlib import Path

import numpy as np

from profiler_app.core.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL, POWER_USAGE, SeriesMatrix
from profiler_app.sources.prometheus import query_range_document

END = 1_795_320_000.0  # 2026-11-22T04:00:00Z
STEP = 10.0
POINTS = 181  # 30 minutes and both ends
HOST = "gpu-node-1"
OUTPUT = Path(__file__).with_name("prometheus-query-range.json")


def gpu_labels(index: int, pod: str | None) -> dict[str, str]:
    labels = {
        "gpu": str(index),
        "UUID": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{HOST}/{index}')}",
        "device": f"nvidia{index}",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": HOST,
        "instance": "10.0.12.7:9400",
        "job": "dcgm-exporter",
    }
    if pod:
        labels |= {"namespace": "ml", "pod": pod, "container": "main"}
    return labels


def utilisation(rng: np.random.Generator) -> list[np.ndarray]:
    t = np.arange(POINTS)
    training = np.where((t / 12 + 0.3) % 1.0 < 0.6, 96.0, 4.0) + rng.normal(0, 3, POINTS)
    drift = 8 * np.sin(2 * np.pi * t / (POINTS * 3.1) + 1.0)
    noise = np.convolve(rng.normal(0, 3, POINTS), 0.7 ** np.arange(20))[:POINTS]
    inference = 55 + drift + noise
    idle = np.abs(rng.normal(0, 0.8, POINTS))
    bursty = np.abs(rng.normal(0, 1, POINTS))
    for start, length in ((14, 5), (61, 9), (97, 3), (150, 7)):
        bursty[start : start + length] = 88 + rng.normal(0, 3, length)
    return [np.clip(np.rint(row), 0, 100) for row in (training, inference, idle, bursty)]


def main() -> None:
    rng = np.random.default_rng(20261122)
    util = utilisation(rng)
    labels = [
        gpu_labels(0, "llama-finetune-0"),
        gpu_labels(1, "vllm-serve-7d9c"),
        gpu_labels(2, None),
        gpu_labels(3, "batch-embed-28811"),
    ]
    copy = [np.clip(np.rint(0.4 * row + rng.normal(0, 1, POINTS)), 0, 100) for row in util]
    fb = [np.full(POINTS, mib) for mib in (71_305.0, 38_112.0, 0.0, 0.0)]
    fb[3] = np.where(util[3] > 5, 12_288.0, 0.0)
    power = [np.round(55 + 345 * 0.7 * row / 100 + rng.normal(0, 4, POINTS), 1) for row in util]
    timestamps = END - STEP * np.arange(POINTS - 1, -1, -1)
    result = []
    for field, rows in (
        (GPU_UTIL, util),
        (MEM_COPY_UTIL, copy),
        (FB_USED, fb),
        (POWER_USAGE, power),
    ):
        matrix = SeriesMatrix(field, labels, timestamps, np.vstack(rows), STEP)
        result += query_range_document(matrix)["data"]["result"]
    document = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    OUTPUT.write_text(json.dumps(document, separators=(",", ":")) + "\n")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
