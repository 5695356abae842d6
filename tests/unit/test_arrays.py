"""``distinct`` gives what ``np.unique`` gives, without loading ``numpy.ma``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from profiler_app.core.arrays import distinct


def assert_same_as_unique(values: npt.NDArray[np.generic]) -> None:
    expected = np.unique(values)
    got = distinct(values)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)  # NaNs compare equal here


@pytest.mark.parametrize(
    "values",
    [
        np.array([], dtype=np.intp),
        np.array([3, 1, 2, 3, 1], dtype=np.intp),
        np.array([[2.0, np.nan], [np.nan, 1.0]]),
        np.array([np.nan, np.nan]),
        np.array([-0.0, 0.0, np.inf, -np.inf]),
        np.array([1 + 1j, np.nan, complex(np.nan, 1), 1 + 1j]),
        np.array(["2026-11-23", "NaT", "NaT", "2026-11-22"], dtype="datetime64[D]"),
    ],
)
def test_the_cases_np_unique_treats_specially(values: npt.NDArray[np.generic]) -> None:
    assert_same_as_unique(values)


@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=2, max_side=30)))
def test_floats_with_nans_and_infinities(values: npt.NDArray[np.float64]) -> None:
    assert_same_as_unique(values)


@given(hnp.arrays(np.int64, st.integers(0, 60), elements=st.integers(-5, 5)))
def test_integers_with_repeats(values: npt.NDArray[np.int64]) -> None:
    assert_same_as_unique(values)


CHECK = """
import sys, numpy as np
print("numpy.ma" in sys.modules)
from profiler_app.core.arrays import distinct
distinct(np.array([2.0, np.nan, 1.0, 2.0])); distinct(np.array([3, 1, 3]))
print("numpy.ma" in sys.modules)
np.unique(np.array([3, 1, 3]))
print("numpy.ma" in sys.modules)
"""


def test_it_leaves_numpy_ma_unloaded_where_np_unique_loads_it() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60, check=True
    )
    loaded_by_import, *after = completed.stdout.split()
    if loaded_by_import == "True":  # numpy 1.x (the declared floor) imports numpy.ma itself
        pytest.skip("this numpy loads numpy.ma on import: nothing to save")
    assert after == ["False", "True"]


CLASSIFY = """
import sys
from pathlib import Path
from profiler_app.analysis import classify_matrix
from tests.support import jobs
print("numpy.ma" in sys.modules)
for job in jobs.labelled_jobs():  # multi-GPU jobs whose ranks wait for each other
    classify_matrix(job.util, 1.0, job.context())
print("numpy.ma" in sys.modules)
"""


def test_classifying_coupled_jobs_leaves_numpy_ma_unloaded() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", CLASSIFY],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    loaded_by_import, after = completed.stdout.split()
    if loaded_by_import == "True":
        pytest.skip("this numpy loads numpy.ma on import: nothing to save")
    assert after == "False"  # no plain np.unique (np.union1d is one) on the daemon's path
