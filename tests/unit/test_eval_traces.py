"""The perturbations of ``benchmarks/eval_traces.py`` and its scoring, on a generated
``query_range`` document of one node: two GPUs of one pod (utilisation and power) running the
stalling ranks of ``tests/support/jobs.py``, written to a temporary traces folder with its
``truth.json`` (the real traces stay evaluation data; the scoring runs the real CLI in process)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.eval_traces import Perturbation, confusion_table, score, variants
from tests.support import jobs

SAMPLES = 600


def _document(util: np.ndarray, power: np.ndarray) -> dict[str, object]:
    result = []
    for field, rows in (("DCGM_FI_DEV_GPU_UTIL", util), ("DCGM_FI_DEV_POWER_USAGE", power)):
        for gpu, row in enumerate(rows):
            metric = {
                "__name__": field,
                "gpu": str(gpu),
                "UUID": f"GPU-{gpu}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": "node-a",
                "namespace": "ml",
                "pod": "job-0",
            }
            values = [[1_800_000_000 + t, f"{v:.1f}"] for t, v in enumerate(row.tolist())]
            result.append({"metric": metric, "values": values})
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


@pytest.fixture
def document() -> dict[str, object]:
    util, power = jobs.stalling_ranks(SAMPLES, 2, np.random.default_rng(4))
    return _document(util, power)


def _series(document: dict[str, object]) -> list[tuple[dict[str, str], list[list[float]]]]:
    """(labels, [[time, value], ...]) of every series."""
    data = document["data"]
    assert isinstance(data, dict)
    return [(series["metric"], series["values"]) for series in data["result"]]


def test_perturbations_take_away_labels_fields_and_samples(document: dict[str, object]) -> None:
    perturbation = Perturbation(drop_labels=("pod",), drop_fields=("power",), every=5)

    [(suffix, changed)] = list(variants(document, perturbation))

    assert suffix == ""
    assert [labels["__name__"] for labels, _ in _series(changed)] == ["DCGM_FI_DEV_GPU_UTIL"] * 2
    assert all("pod" not in labels for labels, _ in _series(changed))
    assert all(len(values) == SAMPLES // 5 for _, values in _series(changed))
    assert "pod" in _series(document)[0][0]  # the recorded document is left as it was


def test_sub_windows_are_shifted_by_half_a_window(document: dict[str, object]) -> None:
    windows = list(variants(document, Perturbation(window_share=0.5)))

    assert [suffix for suffix, _ in windows] == ["@0", "@0.25", "@0.5"]
    # Samples 0-599: windows of 299.5 s starting at 0, 149.75 and 299.5 s.
    starts = [_series(window)[0][1][0][0] - 1_800_000_000 for _, window in windows]
    assert starts == [0, 150, 300]
    assert {len(values) for _, window in windows for _, values in _series(window)} == {300}


def test_a_job_is_scored_by_its_recorded_pod_whatever_labels_are_removed(
    document: dict[str, object], tmp_path: Path
) -> None:
    (tmp_path / "ranks.json").write_text(json.dumps(document))
    truth = {"ranks|node-a|0": "training", "ranks|node-a|1": "training"}
    (tmp_path / "truth.json").write_text(json.dumps(truth))

    recorded = score(tmp_path, Perturbation(), None)
    bare = score(tmp_path, Perturbation(drop_labels=("pod",), drop_fields=("power",)), None)

    for result in (recorded, bare):
        assert result.share("training") == (2, 2), result.misses
        assert (result.jobs, result.consistent) == (1, 1)


def test_the_confusion_matrix_counts_each_label_against_the_job_types_said(
    document: dict[str, object], tmp_path: Path
) -> None:
    """Two ranks that are training, one labelled "other" on purpose: the matrix shows where each
    label went, a miss included."""
    (tmp_path / "ranks.json").write_text(json.dumps(document))
    truth = {"ranks|node-a|0": "training", "ranks|node-a|1": "other", "ranks|node-a|7": "idle"}
    (tmp_path / "truth.json").write_text(json.dumps(truth))

    result = score(tmp_path, Perturbation(), None)

    assert dict(result.confusion) == {
        ("training", "training"): 1,
        ("other", "training"): 1,
        ("idle", "not profiled"): 1,
    }
    assert confusion_table(result) == [
        "| label \\ said | idle | training | inference | bursty | not profiled |",
        "| --- | --- | --- | --- | --- | --- |",
        "| idle | 0 | 0 | 0 | 0 | 1 |",
        "| training | 0 | 1 | 0 | 0 | 0 |",
        "| other | 0 | 1 | 0 | 0 | 0 |",
    ]
