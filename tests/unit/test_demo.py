"""A newcomer's quick path without a GPU or a cluster (README, "Try it without a GPU"): `demo`
fills its own store through the real writer, then every `report` view answers from it, and
`trace` and `trial plan` run on the files shipped in examples/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler_app.cli import main
from profiler_app.commands.report import RIGHTSIZE_VIEW
from profiler_app.reports.history import REPORT_VIEWS
from profiler_app.sources.synthetic import synthetic_days

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('demo') / 'demo.db'}"
    assert main(["demo", "--store-url", url]) == 0
    trace = ["trace", str(EXAMPLES / "nsys-input-bound.sqlite"), "--store-url", url]
    assert main([*trace, "--pod", "ml/llama-finetune-worker-0", "--node", "gpu-node-1"]) == 0
    return url


@pytest.mark.parametrize("view", [*REPORT_VIEWS, RIGHTSIZE_VIEW])
def test_every_report_view_has_rows_from_the_demo(
    demo_store: str, view: str, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    args = ["report", "--store-url", demo_store, "--by", view, "-o", "json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows, view


def test_the_demo_holds_the_mess_of_a_real_day(
    demo_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Restarted pods, a rollout, an idle notebook and unused GPUs all show where a reader
    would look for them."""
    capsys.readouterr()
    assert (
        main(["report", "--store-url", demo_store, "--by", "pod", "--top", "0", "-o", "json"]) == 0
    )
    pods = json.loads(capsys.readouterr().out)["rows"]
    names = {row["pod"] for row in pods}
    assert {"vllm-llama-7d9c4-x2kq8", "vllm-llama-5f6b8-m9t2w"} <= names  # the noon rollout
    finetune = [row for row in pods if row["pod"] == "llama-finetune-worker-0"]
    assert len({row["start_time"] for row in finetune}) >= 2  # recreated after its failure
    assert main(["report", "--store-url", demo_store, "--by", "idle-pods", "-o", "json"]) == 0
    idle = {row["pod"] for row in json.loads(capsys.readouterr().out)["rows"]}
    assert "notebook-bob-0" in idle
    assert main(["report", "--store-url", demo_store, "--by", "waste", "-o", "json"]) == 0
    kinds = {row["kind"] for row in json.loads(capsys.readouterr().out)["rows"]}
    assert "idle-no-pod" in kinds


def test_the_synthetic_days_vary_and_repeat_exactly_with_a_seed() -> None:
    from datetime import UTC, datetime  # noqa: PLC0415

    start = datetime(2026, 11, 1, tzinfo=UTC)
    first = [c for _, c in zip(range(40), synthetic_days(start), strict=False)]
    again = [c for _, c in zip(range(40), synthetic_days(start), strict=False)]
    assert first == again
    peaks = {round(g.stats["DCGM_FI_DEV_GPU_UTIL"].max, 3) for c in first for g in c.gpus}
    assert len(peaks) > 20  # no two cycles alike


def test_the_demo_makes_its_folder_on_a_fresh_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No ~/.local/share yet (a new server account, a container): the demo's store goes in
    our own data folder, made whole, as the default store's is."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "fresh" / "share"))
    assert main(["demo"]) == 0
    assert (tmp_path / "fresh" / "share" / "gpu-profiler" / "demo.db").is_file()
    assert "demo.db" in capsys.readouterr().err  # where it is, said on stderr


def test_the_demo_refuses_anything_but_a_sqlite_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--store-url", "postgresql://u@127.0.0.1:1/prod"]) == 2
    assert "the demo writes only a SQLite file" in capsys.readouterr().err


def test_trial_plan_runs_on_the_shipped_cluster_description(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.json"
    args = ["trial", "plan", "--from", str(EXAMPLES / "pytorchjob.yaml")]
    assert main([*args, "--nodes", str(EXAMPLES / "nodes.json"), "--output", str(plan)]) == 0
    trials = json.loads(plan.read_text())["trials"]
    models = {trial["placement"]["model"] for trial in trials}
    assert models == {"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"}
