"""A Prometheus whose dcgm-exporter answers a test scripts as it goes (a TEST DOUBLE).

``ScriptedDcgm`` is a ``StandInPrometheus`` responder: each GPU of one node has a current role
(``training``: a square wave with a period of 6 steps; ``idle``: near zero) and, optionally, the
pod dcgm-exporter names on it. Every ``query_range`` answer shows the whole requested window in
the GPU's *current* role, so a test flips a verdict from one cycle to the next instead of
waiting a window out. Instant queries (the cAdvisor pod peaks) answer an empty vector. What it
does not model: a GPU's history changing role within a window, and fields other than the
utilisation ones (missing fields are optional for the daemon).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass

import numpy as np

from profiler_app.core.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL
from tests.support import signals
from tests.support.prometheus import Reply, matrix_reply

# The profiler's query: FIELD{Hostname="node"} or FIELD{hostname="node"}.
_SELECTOR = re.compile(
    r'^(?P<field>[A-Za-z_:][A-Za-z0-9_:]*)\{Hostname="(?P<node>[^"]*)"\}( or |$)'
)
TRAINING_PERIOD_STEPS = 6


@dataclass
class ScriptedGpu:
    role: str = signals.IDLE
    namespace: str | None = None
    pod: str | None = None


class ScriptedDcgm:
    """``responder`` for ``StandInPrometheus``; ``set_gpu`` changes what the next answer shows."""

    def __init__(self, node: str, gpus: int = 2) -> None:
        self.node = node
        self._gpus = {str(index): ScriptedGpu() for index in range(gpus)}
        self._lock = threading.Lock()

    def set_gpu(
        self, gpu: str, role: str, namespace: str | None = None, pod: str | None = None
    ) -> None:
        with self._lock:
            self._gpus[gpu] = ScriptedGpu(role, namespace, pod)

    def responder(self, params: dict[str, str]) -> Reply:
        if "start" not in params:  # an instant query: cAdvisor's pod peaks
            body = {"status": "success", "data": {"resultType": "vector", "result": []}}
            return 200, json.dumps(body)
        match = _SELECTOR.match(params.get("query", ""))
        if match is None or match["node"] != self.node:
            return matrix_reply([])
        start, end, step = (float(params[key]) for key in ("start", "end", "step"))
        times = np.arange(start, end + step / 2, step)
        with self._lock:
            gpus = dict(self._gpus)
        result = []
        for index, gpu in gpus.items():
            values = self._values(match["field"], gpu.role, times.size, int(index))
            if values is None:
                continue
            labels = {"__name__": match["field"], "gpu": index, "UUID": f"GPU-{self.node}-{index}"}
            labels |= {"Hostname": self.node, "modelName": "NVIDIA H100 80GB HBM3"}
            if gpu.pod is not None:
                labels |= {"namespace": gpu.namespace or "", "pod": gpu.pod, "container": "main"}
            points = [[float(t), f"{v:g}"] for t, v in zip(times, values, strict=True)]
            result.append({"metric": labels, "values": points})
        return matrix_reply(result)

    @staticmethod
    def _values(field: str, role: str, n: int, seed: int) -> np.ndarray | None:
        rng = np.random.default_rng(seed)
        util = (
            signals.square(n, TRAINING_PERIOD_STEPS, rng, duty=0.6, noise=2.0)
            if role == signals.TRAINING
            else signals.near_zero_noise(n, rng)
        )
        busy = role == signals.TRAINING
        if field == GPU_UTIL:
            return np.rint(util)
        if field == MEM_COPY_UTIL:
            return np.rint(0.45 * util)
        if field == FB_USED:
            return np.full(n, 61_000.0 if busy else 0.0)
        return None
