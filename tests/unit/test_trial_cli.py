"""``gpu-profiler trial`` in-process: bad input is one line and exit 2, before anything is created;
a plan from a file and saved nodes; a dry run; results in the table store (migration
0004) read back by ``trial report`` and ``report --by trial``."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from profiler_app.cli import main
from profiler_app.sinks.store.trials import TrialStore
from profiler_app.trial.estimators import Measurement
from profiler_app.trial.placement import Placement
from profiler_app.trial.progress import LineProgress, LiveProgress, progress_for
from profiler_app.trial.results import OK, TrialResult, summarise
from tests.unit.test_trial_manifests import job, pytorch_job

pytestmark = pytest.mark.usefixtures("cli_environment")


def nodes_file(path: Path) -> Path:
    def node(name: str, gpus: int) -> dict[str, Any]:
        return {
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "NVIDIA-A10G"},
            },
            "spec": {
                "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
            },
            "status": {
                "allocatable": {"nvidia.com/gpu": str(gpus)},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }

    path.write_text(json.dumps({"kind": "NodeList", "items": [node("a", 4), node("b", 4)]}))
    return path


def write(path: Path, document: Any) -> Path:
    path.write_text(yaml.safe_dump(document))
    return path


def plan_file(tmp_path: Path, *dims: str) -> Path:
    manifest = write(tmp_path / "ptj.yaml", pytorch_job())
    nodes = nodes_file(tmp_path / "nodes.json")
    out = tmp_path / "plan.json"
    args = ["trial", "plan", "--from", str(manifest), "--nodes", str(nodes), "--output", str(out)]
    assert main([*args, "--dims", *(dims or ("gpus=1,2,4",))]) == 0
    return out


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("gpu-profiler: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_plan_writes_the_pruned_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = plan_file(tmp_path, "gpus=1,2,4,8")
    plan = json.loads(out.read_text())
    assert [t["placement"]["gpus"] for t in plan["trials"]] == [1, 2, 2, 4, 4, 8]
    assert plan["gpu_hours"] == pytest.approx(21 * (600 + 30) / 3600)  # deadline and grace
    err = capsys.readouterr().err
    assert "8 GPUs packed" in err
    assert "no node of NVIDIA-A10G has 8 allocatable GPUs" in err


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {
                **job(),
                "spec": {"template": {"spec": {"containers": [{"name": "a", "image": "b"}]}}},
            },
            "requests no nvidia.com/gpu",
        ),
        (
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}},
            "unknown kind apps/v1/Deployment",
        ),
    ],
)
def test_bad_manifests_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: Any, message: str
) -> None:
    manifest = write(tmp_path / "bad.yaml", document)
    nodes = nodes_file(tmp_path / "nodes.json")
    assert main(["trial", "plan", "--from", str(manifest), "--nodes", str(nodes)]) == 2
    assert message in one_error_line(capsys)


def test_a_budget_too_small_for_one_trial_is_refused_before_any_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = plan_file(tmp_path)
    capsys.readouterr()
    # No kubeconfig at all: a refusal that needed the cluster would fail differently.
    code = main(
        ["trial", "run", "--plan", str(plan), "--budget-gpu-hours", "0.1", "--step-regex", "step="]
    )
    assert code == 2
    line = one_error_line(capsys)
    assert "--budget-gpu-hours 0.1 is too small for a single trial" in line
    assert (
        main(
            [
                "trial",
                "run",
                "--plan",
                str(plan),
                "--budget-gpu-hours",
                "1",
                "--step-regex",
                "step=",
            ]
        )
        == 2
    )
    assert "over --budget-gpu-hours 1" in one_error_line(capsys)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "no way to measure throughput"),
        (["--step-regex", "("], "--step-regex '('"),
        (["--step-regex", "x", "--warmup", "20m"], "--warmup must be shorter than --per-trial"),
        (["--metric-query", "rate(x[1m])"], "--metric-query needs --prometheus-url"),
    ],
)
def test_bad_run_options_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    plan = plan_file(tmp_path)
    capsys.readouterr()
    assert main(["trial", "run", "--plan", str(plan), "--budget-gpu-hours", "10", *extra]) == 2
    assert message in one_error_line(capsys)


def test_dry_run_prints_every_trial_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = plan_file(tmp_path)
    capsys.readouterr()
    code = main(
        [
            "trial",
            "run",
            "--plan",
            str(plan),
            "--budget-gpu-hours",
            "10",
            "--step-regex",
            "step=",
            "--dry-run",
            "--per-trial",
            "5m",
            "--warmup",
            "1m",
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    manifests = list(yaml.safe_load_all(captured.out))
    assert [m["kind"] for m in manifests] == ["PyTorchJob"] * 5
    assert {m["spec"]["runPolicy"]["activeDeadlineSeconds"] for m in manifests} == {300}
    assert "nothing created" in captured.err


def measured(index: int, gpus: int, layout: str, rate: float) -> TrialResult:
    pods = 1 if layout == "packed" else gpus
    return TrialResult(
        index,
        f"trial-abcd1234-{index}",
        Placement(gpus, gpus // pods, layout, "NVIDIA-A10G", "nvidia.com/gpu.product"),
        1 if layout == "packed" else 2,
        OK,
        measurement=Measurement("step-regex", rate, "steps/s", samples=30, step_seconds=1 / rate),
        gpu_seconds=60.0 * gpus,
    )


def test_results_round_trip_through_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    summary = summarise(
        [
            measured(0, 1, "packed", 5.0),
            measured(1, 2, "packed", 4.8),
            measured(2, 2, "spread", 3.0),
        ],
        "weak",
    )
    store = TrialStore(url)
    rows = [
        {**row, "workload": "PyTorchJob/ml/resnet", "recommendation": summary.recommendation}
        for row in summary.rows()
    ]
    store.record("abcd1234", rows)
    store.record("abcd1234", rows)  # again: replaced, not doubled
    assert len(store.run_rows("abcd1234")) == 3
    store.close()

    assert main(["trial", "report", "abcd1234", "--store-url", url, "--output", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["recommendation"] == summary.recommendation
    assert document["pareto"] == ["trial-abcd1234-0", "trial-abcd1234-1"]
    assert [t["status"] for t in document["trials"]] == ["ok"] * 3

    assert main(["trial", "report", "abcd1234", "--store-url", url, "--output", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [row["placement"] for row in table] == [
        "1 GPU on NVIDIA-A10G",
        "2 GPUs packed on NVIDIA-A10G",
        "2 GPUs spread (2 pods x 1) on NVIDIA-A10G",
    ]
    assert main(["trial", "report", "abcd1234", "--store-url", url]) == 0
    assert "Recommendation: 2 GPUs packed on NVIDIA-A10G: the best" in capsys.readouterr().out

    assert main(["report", "--by", "trial", "--store-url", url, "--output", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {row["run_id"] for row in listed["rows"]} == {"abcd1234"}
    assert sum(row["recommended"] for row in listed["rows"]) == 1

    assert main(["trial", "report", "nope", "--store-url", url]) == 2
    assert "no trial run 'nope'" in one_error_line(capsys)


def test_report_reads_a_results_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = summarise([measured(0, 1, "packed", 5.0)], "weak")
    results = tmp_path / "results.json"
    results.write_text(
        json.dumps(
            {
                "run_id": "r1",
                "workload": "Job/ml/x",
                "recommendation": summary.recommendation,
                "pareto": ["trial-abcd1234-0"],
                "trials": summary.rows(),
            }
        )
    )
    assert main(["trial", "report", str(results), "--output", "csv"]) == 0
    assert "trial-abcd1234-0" in capsys.readouterr().out


def test_progress_is_a_live_table_on_a_terminal_and_lines_elsewhere() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    board = [
        {
            "trial": "2 GPUs packed",
            "status": "measuring",
            "elapsed": 95.0,
            "throughput": "9.5 per-GPU batches/s",
            "note": "",
        }
    ]
    screen = Terminal()
    live = progress_for(screen)
    assert isinstance(live, LiveProgress)
    with live:
        live.update(board)
        live.event("2 GPUs packed: started")
    drawn = screen.getvalue()
    assert "2 GPUs packed" in drawn
    assert "1m35s" in drawn
    assert "9.5 per-GPU batches/s" in drawn
    log = io.StringIO()
    lines = progress_for(log)
    assert isinstance(lines, LineProgress)
    with lines:
        lines.update(board)
        lines.event("2 GPUs packed: started")
    assert log.getvalue() == "gpu-profiler trial: 2 GPUs packed: started\n"
