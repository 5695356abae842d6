"""The alerting and recording rules under the real promtool (Debian's prometheus package).

``promtool check rules`` validates syntax; ``promtool test rules`` runs
tests/infra/promtool/gpu-rules.test.yaml, generated from tests/infra/promtool_cases.py: every alert
is shown quiet (or pending) and firing with its exact labels and annotations.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from infra import monitoring
from tests.infra import promtool_cases

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
