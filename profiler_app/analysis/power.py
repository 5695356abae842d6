"""Power draw judged against each GPU's own range: from its idle floor to its power limit.

The same watts mean different things on different GPUs (150 W is near idle for an H100 and
flat out for a T4), so power is read as a fraction of the GPU's range. The range comes, in this
order of preference, from the exported limit (``DCGM_FI_DEV_POWER_MGMT_LIMIT`` or
``DCGM_FI_DEV_ENFORCED_POWER_LIMIT``), from ``MODEL_POWER`` by the ``modelName`` label, or, when
neither is known, from the window itself (its lowest to highest reading). Only an absolute range
(the first two) can say "near idle": within the window's own range the lowest reading is 0 % by
construction, whatever the GPU was doing.
"""

from __future__ import annotations

import numpy as np

from profiler_app.analysis.stats import FloatArray
from profiler_app.core.model import FloatMatrix

# (words that must all appear in the model name, power limit W, idle draw W). The name is
# lower-cased and split at spaces and hyphens ("NVIDIA A100-SXM4-80GB": nvidia, a100, sxm4, 80gb).
# First match wins, so the more specific names come first. Limits are the vendors' default board
# power; idle draws are typical readings of an idle GPU (with a CUDA context they run higher,
# which the near-idle threshold leaves room for). Approximate by nature: an exported limit
# always wins over this table.
MODEL_POWER: tuple[tuple[tuple[str, ...], float, float], ...] = (
    (("h100", "nvl"), 400.0, 60.0),
    (("h100", "pcie"), 350.0, 50.0),
    (("h100",), 700.0, 70.0),  # SXM5 (NVML: "NVIDIA H100 80GB HBM3")
    (("h200",), 700.0, 75.0),
    (("b200",), 1000.0, 140.0),
    (("a100", "pcie", "40gb"), 250.0, 35.0),
    (("a100", "pcie"), 300.0, 45.0),
    (("a100",), 400.0, 55.0),  # SXM4
    (("a10g",), 300.0, 25.0),
    (("a10",), 150.0, 20.0),
    (("a30",), 165.0, 30.0),
    (("a40",), 300.0, 30.0),
    (("l40s",), 350.0, 35.0),
    (("l40",), 300.0, 35.0),
    (("l4",), 72.0, 16.0),
    (("t4",), 70.0, 10.0),
    (("v100", "pcie"), 250.0, 25.0),
    (("v100",), 300.0, 40.0),  # SXM2
    (("p100",), 250.0, 30.0),
    (("rtx", "6000", "ada"), 300.0, 25.0),
    (("rtx", "a6000"), 300.0, 25.0),
    (("rtx", "4090"), 450.0, 25.0),
    (("rtx", "3090"), 350.0, 25.0),
    (("titan", "x"), 250.0, 15.0),
)
# Where only the limit is known (exported, model not in the table): idle draw as a share of it.
DEFAULT_IDLE_SHARE = 0.1


def model_power(model_name: str) -> tuple[float, float] | None:
    """(power limit, idle draw) in watts for a ``modelName`` label, or None if not in the table."""
    words = set(model_name.lower().replace("-", " ").split())
    for required, limit, idle in MODEL_POWER:
        if words.issuperset(required):
            return limit, idle
    return None


def power_range(
    model_name: str, exported_limit: float | None
) -> tuple[float, float] | tuple[None, None]:
    """(idle floor, limit) in watts from the exported limit and the model table, or
    (None, None) when neither knows: the caller then judges power within the window only."""
    known = model_power(model_name)
    if exported_limit is not None and np.isfinite(exported_limit) and exported_limit > 0:
        idle = known[1] if known is not None else DEFAULT_IDLE_SHARE * exported_limit
        return min(idle, exported_limit / 2), float(exported_limit)
    if known is not None:
        return known[1], known[0]
    return None, None


def power_fraction(power: FloatMatrix, floor: FloatArray, limit: FloatArray) -> FloatMatrix:
    """Each reading as a fraction of its row's range, clipped to [0, 1] (NaN stays NaN)."""
    span = np.maximum(limit - floor, 1e-9)
    fraction: FloatMatrix = np.clip((power - floor[:, None]) / span[:, None], 0.0, 1.0)
    return fraction
