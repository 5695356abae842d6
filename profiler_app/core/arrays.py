"""Array helpers shared by the sources and the analysis."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

Scalar = TypeVar("Scalar", bound=np.generic)


def distinct(values: npt.NDArray[Scalar]) -> npt.NDArray[Scalar]:
    """The sorted distinct values (NaNs counted as one), as ``np.unique(values)`` gives them.

    numpy 2.4's plain ``np.unique`` imports ``numpy.ma`` on its first call (1.25 MiB the daemon
    keeps for good); sorting and keeping each value unlike its predecessor needs nothing more.
    """
    ordered = np.sort(values, axis=None)
    keep = np.empty(ordered.shape, dtype=np.bool_)
    keep[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    if ordered.dtype.kind in "cfmM" and ordered.size and np.isnan(ordered[-1]):
        nans = np.isnan(ordered)  # sorted last: keep the first of them only
        keep[nans] = False
        keep[int(np.argmax(nans))] = True
    return ordered[keep]
