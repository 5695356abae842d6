"""What the analysis may know about each row besides its utilisation: the GPU's other signals
(power, SM activity), which rows belong to one job, and a prior from the workload's owner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from profiler_app.analysis.stats import FloatArray, IntArray
from profiler_app.core.model import FloatMatrix, Prior


@dataclass(frozen=True)
class Context:
    """Per-row inputs besides utilisation; every one optional (None: not known for any row).

    Matrices have the utilisation matrix's shape and NaN where a sample is missing; arrays have
    one entry per row.
    """

    power: FloatMatrix | None = None  # DCGM_FI_DEV_POWER_USAGE, watts
    # Each row's idle floor and power limit in watts (analysis.power.power_range); NaN where
    # unknown, and then power is judged within the window only.
    power_floor: FloatArray | None = None
    power_limit: FloatArray | None = None
    sm_active: FloatMatrix | None = None  # DCGM_FI_PROF_SM_ACTIVE, a ratio 0-1
    mem_copy: FloatMatrix | None = None  # DCGM_FI_DEV_MEM_COPY_UTIL, percent: a last resort
    groups: IntArray | None = None  # rows of one job share an id >= 0; -1: no known job
    # Rows on one node share an id: GPUs of no known job there are one job when their stalls
    # coincide (analysis.coupling). None: only rows of one known job are compared.
    nodes: IntArray | None = None
    # What the workload says each row runs (None: nothing known): the daemon knows the owner,
    # the engine in the command, or both. A serving prior turns a loop into a request cadence
    # and a flat GPU into inference, a training prior keeps a flat GPU training; with none, a
    # verdict on a loop says "no workload context".
    priors: Sequence[Prior | None] | None = None
    # Why, per row: one reason ("owner PyTorchJob") or several ("engine vllm", "owner Job").
    prior_reasons: Sequence[str | Sequence[str]] | None = None
    names: Sequence[str] | None = None  # how reasons name a row, e.g. "gpu 0"

    def checked(self, rows: int, columns: int) -> Context:
        """This context, or ValueError when a part does not fit a ``rows`` x ``columns`` matrix."""
        for name in ("power", "sm_active", "mem_copy"):
            matrix = getattr(self, name)
            if matrix is not None and np.shape(matrix) != (rows, columns):
                raise ValueError(f"{name} has shape {np.shape(matrix)}, expected {(rows, columns)}")
        for name in (
            "power_floor",
            "power_limit",
            "groups",
            "nodes",
            "priors",
            "prior_reasons",
            "names",
        ):
            part = getattr(self, name)
            if part is not None and len(part) != rows:
                raise ValueError(f"{name} has {len(part)} entries for {rows} rows")
        return self

    def name(self, row: int) -> str:
        return self.names[row] if self.names is not None else f"row {row}"

    def prior_codes(self, rows: int) -> IntArray:
        """0 for no prior, 1 for training, 2 for serving."""
        codes = np.zeros(rows, dtype=np.intp)
        if self.priors is not None:
            order = {Prior.TRAINING: 1, Prior.SERVING: 2}
            codes[:] = [order.get(prior, 0) if prior else 0 for prior in self.priors]
        return codes
