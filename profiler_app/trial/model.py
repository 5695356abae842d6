"""A step-time model fitted to measured trials, to skip the trials it predicts with confidence.

The model follows AdaptDL/Pollux's (Qiao et al., OSDI 2021): a step is a compute part plus a
synchronisation part whose cost depends on the slowest link between the replicas, NVLink or PCIe
within a node, the network across nodes. Linear, without Pollux's overlap exponent and its
per-replica retrogression terms, so that three or four trials determine it:

    step(K GPUs, N nodes) = compute(K) + (K - 1) / K * (c_node if N == 1 else c_net)

``compute(K)`` is ``a`` when each GPU keeps its batch (weak scaling) and ``a + b / K`` when the
global batch is split (strong scaling); ``(K - 1) / K`` is ring all-reduce's share of the
gradient each GPU sends. The fit is weighted least squares, each measured step time weighted by
its own standard error.

A trial is skipped only when, with at least three measured trials of its GPU model:
- its (K, N) is determined by the measured points (the feature row lies in their span);
- the model is validated: every measured point that the others determine is predicted by them
  within ``tolerance`` (leave-one-out), and there is at least one such point;
- the 95 % interval of its prediction is within ``tolerance`` of the prediction, with the
  parameters' covariance scaled up when the residuals exceed the measurement errors;
- it does not reach past twice the most GPUs measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MIN_POINTS = 3
DEFAULT_TOLERANCE = 0.10
Z_95 = 1.96
MIN_RELATIVE_ERROR = 0.005  # a measured step time is never taken as better known than 0.5 %
SPAN_TOLERANCE = 1e-8
EXTRAPOLATION_LIMIT = 2.0

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Point:
    """One measured trial: GPUs, nodes spanned, step time and its relative standard error."""

    gpus: int
    nodes: int
    step_seconds: float
    relative_error: float = MIN_RELATIVE_ERROR


@dataclass(frozen=True)
class Prediction:
    step_seconds: float
    relative_halfwidth: float  # of the 95 % interval
    points: int

    def describe(self) -> str:
        return (
            f"predicted {self.step_seconds:.3g} s/step ± {self.relative_halfwidth:.0%} by "
            f"the step-time model fitted to {self.points} measured trials"
        )


def features(gpus: int, nodes: int, strong: bool) -> FloatArray:
    """The model's feature row for K GPUs on N nodes (see the module docstring)."""
    share = (gpus - 1) / gpus
    comm = [share if nodes <= 1 else 0.0, share if nodes > 1 else 0.0]
    compute = [1.0 / gpus, 1.0] if strong else [1.0]
    return np.asarray(compute + comm, dtype=np.float64)


@dataclass(frozen=True)
class Fit:
    coefficients: FloatArray
    covariance: FloatArray
    design: FloatArray  # the measured points' feature rows

    def determines(self, row: FloatArray) -> bool:
        """Whether ``row`` lies in the span of the measured rows (its value is identified)."""
        projector = np.linalg.pinv(self.design) @ self.design
        return bool(
            np.linalg.norm(row - row @ projector)
            <= SPAN_TOLERANCE * max(1.0, float(np.linalg.norm(row)))
        )

    def predict(self, row: FloatArray) -> tuple[float, float]:
        """Step time and its standard error."""
        value = float(row @ self.coefficients)
        variance = float(row @ self.covariance @ row)
        return value, float(np.sqrt(max(variance, 0.0)))


def fit_points(points: Sequence[Point], strong: bool) -> Fit:
    design = np.vstack([features(p.gpus, p.nodes, strong) for p in points])
    target = np.asarray([p.step_seconds for p in points], dtype=np.float64)
    sigma = target * np.asarray(
        [max(p.relative_error, MIN_RELATIVE_ERROR) for p in points], dtype=np.float64
    )
    weighted = design / sigma[:, None]
    coefficients, *_ = np.linalg.lstsq(weighted, target / sigma, rcond=None)
    rank = int(np.linalg.matrix_rank(weighted))
    dof = len(points) - rank
    residuals = (target - design @ coefficients) / sigma
    scale = max(1.0, float(residuals @ residuals) / dof) if dof > 0 else 1.0
    covariance = np.linalg.pinv(weighted.T @ weighted) * scale
    return Fit(coefficients.astype(np.float64), covariance.astype(np.float64), design)


def validated(points: Sequence[Point], strong: bool, tolerance: float) -> bool:
    """Leave-one-out: each point the others determine is predicted within ``tolerance``; at
    least one is."""
    checked = 0
    for index, point in enumerate(points):
        others = [p for i, p in enumerate(points) if i != index]
        model = fit_points(others, strong)
        row = features(point.gpus, point.nodes, strong)
        if not model.determines(row):
            continue
        value, _ = model.predict(row)
        if abs(value - point.step_seconds) > tolerance * point.step_seconds:
            return False
        checked += 1
    return checked > 0


def confident_prediction(
    points: Sequence[Point],
    gpus: int,
    nodes: int,
    *,
    strong: bool = False,
    tolerance: float = DEFAULT_TOLERANCE,
) -> Prediction | None:
    """The step time of K GPUs on N nodes when the model predicts it with confidence (see the
    module docstring), else None."""
    if len(points) < MIN_POINTS or gpus > EXTRAPOLATION_LIMIT * max(p.gpus for p in points):
        return None
    model = fit_points(points, strong)
    row = features(gpus, nodes, strong)
    if not model.determines(row) or not validated(points, strong, tolerance):
        return None
    value, error = model.predict(row)
    if value <= 0:
        return None
    halfwidth = Z_95 * error / value
    if halfwidth > tolerance:
        return None
    return Prediction(value, halfwidth, len(points))
