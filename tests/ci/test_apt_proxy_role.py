"""The apt_proxy role refuses values that would break out of an apt.conf string.

apt.conf values are double-quoted strings without escapes (apt's apt.conf(5)): a quote would end
the string and the rest would be read as apt configuration. Runs the role with ansible-playbook on
localhost in check mode; nothing is written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def run_role(tmp_path: Path, **variables: object) -> subprocess.CompletedProcess[str]:
    if not PLAYBOOK.exists() and shutil.which("ansible-playbook") is None:
        pytest.skip("ansible-playbook is not installed (the ansible extra has it)")
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n"
        f"  roles:\n    - role: {ROOT / 'playbooks' / 'roles' / 'apt_proxy'}\n"
    )
    extra = {
        "apt_proxy_config_path": str(tmp_path / "01proxy"),
        "ansible_python_interpreter": sys.executable,
        **variables,
    }
    command = str(PLAYBOOK if PLAYBOOK.exists() else "ansible-playbook")
    return subprocess.run(
        [command, "-i", "localhost,", "--check", str(play), "-e", json.dumps(extra)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_plain_proxy_url_passes(tmp_path: Path) -> None:
    result = run_role(
        tmp_path,
        apt_proxy_url="http://10.200.1.1:3142",
        apt_proxy_https_url="http://proxy.internal:3128/",
        apt_proxy_direct_hosts=["mirror.internal.example"],
    )
    assert result.returncode == 0, result.stdout[-2000:]


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"apt_proxy_url": 'http://proxy:3142"; Acquire::x "y'}, "apt_proxy_url="),
        ({"apt_proxy_url": "http://proxy:3142", "apt_proxy_https_url": "http://a b"}, "https_url="),
        ({"apt_proxy_url": "proxy:3142"}, "apt_proxy_url="),
        (
            {"apt_proxy_url": "http://proxy:3142", "apt_proxy_direct_hosts": ['m"; x']},
            "apt_proxy_direct_hosts entry",
        ),
    ],
)
def test_a_value_that_would_break_apt_conf_is_refused(
    tmp_path: Path, variables: dict[str, object], named: str
) -> None:
    result = run_role(tmp_path, **variables)
    assert result.returncode != 0
    assert named in result.stdout
    assert "cannot go into apt.conf" in result.stdout or "is not a host name" in result.stdout
    assert not (tmp_path / "01proxy").exists()
