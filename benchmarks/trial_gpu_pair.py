"""One real trial pair on a GPU, without Kubernetes, through ``gpu-profiler trial``'s estimators.

    python benchmarks/trial_gpu_pair.py [--seconds 60] [--warmup 10] [--gpu 0] [--script FILE]

Runs a training script alone on the GPU, then two copies of it sharing the GPU, each for
``--seconds``. Each copy's stdout lines are stamped as the kubelet stamps them, and GPU
utilisation is sampled through NVML every 0.2 s meanwhile; the measured part (after
``--warmup``) goes through the same estimators as a trial: Katib-format ``samples_per_sec=``
lines (1), step lines (2), the iteration period of the utilisation waveform (3) and the
utilisation proxy (4). Prints one JSON document: each run's throughput by each estimator, and the
pair's total against the script alone (what time-slicing two jobs on one GPU gives).

The default script is a small PyTorch MLP training loop (``torch`` with CUDA needed); ``--script``
runs any command line that prints ``step=N samples_per_sec=X`` lines. Needs a GPU and its driver.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from profiler_app.trial import estimators

SAMPLE_SECONDS = 0.2
SCRIPT = """
import sys, time, torch
torch.manual_seed(0)
device = "cuda"
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
batch = torch.randn(256, 4096, device=device)
step = 0
while True:
    started = time.perf_counter()
    loss = model(batch).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    step += 1
    rate = batch.shape[0] / (time.perf_counter() - started)
    print(f"step={step} loss={loss.item():.4f} samples_per_sec={rate:.1f}", flush=True)
"""


def _fail(message: str) -> None:
    print(f"trial_gpu_pair: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _sampler(gpu: int, stop: threading.Event, samples: list[tuple[float, float]]) -> None:
    import pynvml  # noqa: PLC0415

    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    while not stop.wait(SAMPLE_SECONDS):
        rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
        samples.append((time.time(), float(rates.gpu)))


def _read(process: subprocess.Popen[str], lines: list[tuple[float, str]]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.append((time.time(), line.rstrip("\n")))  # stamped on arrival, as the kubelet does


def run_copies(command: list[str], copies: int, seconds: float, gpu: int) -> dict[str, Any]:
    stop = threading.Event()
    samples: list[tuple[float, float]] = []
    sampler = threading.Thread(target=_sampler, args=(gpu, stop, samples), daemon=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
    started = time.time()
    sampler.start()
    processes, outputs, readers = [], [], []
    for _ in range(copies):
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        lines: list[tuple[float, str]] = []
        reader = threading.Thread(target=_read, args=(process, lines), daemon=True)
        reader.start()
        processes.append(process)
        outputs.append(lines)
        readers.append(reader)
    time.sleep(seconds)
    for process in processes:
        process.terminate()
        process.wait(timeout=30)
    stop.set()
    sampler.join()
    return {"started": started, "outputs": outputs, "samples": samples}


def measure(run: dict[str, Any], warmup: float, gpus: int = 1) -> dict[str, Any]:
    start = run["started"] + warmup
    copies = []
    for lines in run["outputs"]:
        kept = estimators.after(lines, start)
        metric = estimators.from_rate_samples(
            estimators.katib_samples(kept, "samples_per_sec")[1], "samples_per_sec"
        )
        steps = estimators.from_step_marks(estimators.step_marks(kept, re.compile(r"^step=")))
        copies.append(
            {
                "metric_samples_per_sec": metric.rate,
                "metric_cv": metric.cv,
                "step_regex_steps_per_sec": steps.rate,
                "step_seconds": steps.step_seconds,
                "stable": steps.stable,
            }
        )
    utilisation = np.asarray([u for t, u in run["samples"] if t >= start], dtype=np.float64)
    period = estimators.from_waveform(utilisation[None, :], SAMPLE_SECONDS)
    proxy = estimators.from_sm_activity(utilisation / 100.0, gpus)
    return {
        "copies": copies,
        "period_seconds": period.step_seconds,
        "period_note": period.note,
        "utilisation_proxy": proxy.rate,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--script", help="a command line printing step=N samples_per_sec=X")
    args = parser.parse_args()
    try:
        import pynvml  # noqa: PLC0415

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(args.gpu))
    except Exception as error:  # any NVML failure means: no GPU on this host
        _fail(f"no NVIDIA GPU through NVML: {error}")
    with tempfile.TemporaryDirectory() as folder:
        if args.script:
            command = args.script.split()
        else:
            check = subprocess.run(  # noqa: PLW1510  its code is read below
                [sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                capture_output=True,
            )
            if check.returncode != 0:
                _fail("the default script needs PyTorch with CUDA (pip install torch)")
            path = Path(folder) / "train.py"
            path.write_text(SCRIPT)
            command = [sys.executable, str(path)]
        alone = measure(run_copies(command, 1, args.seconds, args.gpu), args.warmup)
        pair = measure(run_copies(command, 2, args.seconds, args.gpu), args.warmup)
    single = alone["copies"][0]["step_regex_steps_per_sec"] or 0.0
    together = sum(c["step_regex_steps_per_sec"] or 0.0 for c in pair["copies"])
    print(
        json.dumps(
            {
                "gpu": str(name),
                "seconds": args.seconds,
                "warmup": args.warmup,
                "alone": alone,
                "pair": pair,
                "pair_total_over_alone": together / single if single else None,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
