"""The alerting and recording rules under the real promtool (Debian's prometheus package).

``promtool check rules`` validates syntax; ``promtool test rules`` runs
tests/infra/promtool/gpu-rules.test.yaml, generated from tests/infra/promtool_cases.py: every alert
is shown quiet (or pending) and firing with its exact labels and annotations; and
tests/infra/promtool/gpu-scaling.test.yaml, generated from tests/infra/promtool_scaling.py: the
prometheus-adapter and KEDA queries in every dcgm-exporter series shape.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from infra import monitoring
from tests.infra import promtool_cases, promtool_scaling

PROMTOOL = shutil.which("promtool")
TEST_DIR = Path(__file__).parent / "promtool"
TEST_FILE = TEST_DIR / "gpu-rules.test.yaml"
RULES_FILE = Path(monitoring.__file__).parent / monitoring.RULES_FILE

pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package 'prometheus')"
)


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120
    )


def test_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", str(RULES_FILE), cwd=TEST_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_committed_unit_tests_match_the_cases() -> None:
    assert TEST_FILE.read_text() == promtool_cases.render(), (
        f"regenerate: python -m tests.infra.promtool_cases > tests/infra/promtool/{TEST_FILE.name}"
    )


def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", TEST_FILE.name, cwd=TEST_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_quiet_and_firing() -> None:
    document = yaml.safe_load(TEST_FILE.read_text())
    tested: dict[str, list[int]] = {}
    for test in document["tests"]:
        for check in test.get("alert_rule_test", []):
            tested.setdefault(check["alertname"], []).append(len(check["exp_alerts"]))
    assert set(tested) == set(promtool_cases.alert_rules())
    for alert, counts in tested.items():
        assert 0 in counts, f"{alert} is never shown quiet"
        assert any(counts), f"{alert} is never shown firing"


def test_every_recording_rule_is_tested() -> None:
    records = {
        rule["record"]
        for group in monitoring.prometheus_rules()["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    checked = {expr for _, expr, _ in promtool_cases.RECORDING_CASE.checks}
    assert checked == records


def test_unit_tests_catch_a_changed_threshold(tmp_path: Path) -> None:
    """Control: with a rule's threshold changed, promtool's unit tests must fail."""
    rules = RULES_FILE.read_text().replace("DCGM_FI_DEV_GPU_TEMP > 85", "DCGM_FI_DEV_GPU_TEMP > 95")
    assert rules != RULES_FILE.read_text()
    (tmp_path / "rules.yaml").write_text(rules)
    document = promtool_cases.unit_test_document()
    document["rule_files"] = ["rules.yaml"]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    result = promtool("test", "rules", "t.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "GpuTemperatureHigh" in result.stdout + result.stderr


# -- the scaling metrics in every dcgm-exporter shape (tests/infra/promtool_scaling.py) ----------

SCALING_FILE = TEST_DIR / "gpu-scaling.test.yaml"


def test_committed_scaling_tests_match_the_cases() -> None:
    assert SCALING_FILE.read_text() == promtool_scaling.render(), (
        "regenerate: python -m tests.infra.promtool_scaling > "
        f"tests/infra/promtool/{SCALING_FILE.name}"
    )


def test_scaling_metrics_give_each_pod_its_value_in_every_exporter_shape() -> None:
    result = promtool("test", "rules", SCALING_FILE.name, cwd=TEST_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_shape_expects_the_busy_pods_busy() -> None:
    """What the promtool file asks for: in every shape and node label spelling, the busy serving
    pod and the trainer read above 0 through the adapter, and KEDA sees the serving pod busy."""
    document = yaml.safe_load(SCALING_FILE.read_text())
    names = {test["name"] for test in document["tests"]}
    assert names == {
        f"{shape}, {label}"
        for shape in promtool_scaling.SHAPES
        for label in ("Hostname", "hostname")
    }
    keda = monitoring.workload_gpu_utilization_query("inference", "llm-.*")
    for test in document["tests"]:
        busy = {
            sample["labels"]: sample["value"]
            for check in test["promql_expr_test"]
            for sample in check["exp_samples"]
        }
        assert busy['{pod="llm-0"}'] > 0, test["name"]
        assert busy['{pod="trainer-0"}'] > 0, test["name"]
        (keda_check,) = [c for c in test["promql_expr_test"] if c["expr"] == keda]
        assert keda_check["exp_samples"][0]["value"] > 0, test["name"]


def test_a_rule_that_reads_only_pod_labelled_series_fails_the_scaling_tests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: the rules before per-pod series (the pod-labelled series' mean) read 0 for a busy
    pod where dcgm-exporter 4.5.3+ cannot map processes to pods; promtool must say so."""
    naive = copy.deepcopy(monitoring.adapter_rules())
    for rule in naive["custom"]:
        rule["metricsQuery"] = "avg by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>})"
    monkeypatch.setattr(monitoring, "adapter_rules", lambda: naive)
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(promtool_scaling.unit_test_document()))
    result = promtool("test", "rules", "t.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert 'got: {pod="llm-0"} 0' in result.stdout + result.stderr
