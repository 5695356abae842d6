"""Runs ansible-playbook / ansible against a test inventory and parses the play recap."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[3]
PLAYBOOKS = REPO_ROOT / "playbooks"
BIN = Path(sys.executable).parent
RECAP_LINE = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


@dataclass
class RunResult:
    returncode: int
    output: str
    recap: dict[str, dict[str, int]]
    seconds: float

    def total(self, field: str) -> int:
        return sum(host[field] for host in self.recap.values())

    def describe(self) -> str:
        """The tail of the output, for assertion messages."""
        return f"rc={self.returncode} recap={self.recap}\n{self.output[-6000:]}"


def role_variables(*roles: str) -> dict[str, Any]:
    """The roles' defaults and vars merged in order, as group variables of `all` would be."""
    variables: dict[str, Any] = {}
    for role in roles:
        for part in ("defaults", "vars"):
            variables.update(
                yaml.safe_load((PLAYBOOKS / "roles" / role / part / "main.yml").read_text())
            )
    return variables


def ansible_env() -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_PIPELINING": "1",
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
    }


def _run(command: list[str], log: Path | None, timeout: float) -> RunResult:
    started = time.monotonic()
    completed = subprocess.run(
        command,
        cwd=PLAYBOOKS if PLAYBOOKS.exists() else REPO_ROOT,
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = completed.stdout + completed.stderr
    if log is not None:
        log.write_text(output)
    recap = {
        match["host"]: {key: int(match[key]) for key in ("ok", "changed", "unreachable", "failed")}
        for match in RECAP_LINE.finditer(completed.stdout)
    }
    return RunResult(completed.returncode, output, recap, time.monotonic() - started)


def run_playbook(
    playbook: str,
    inventory: Path,
    *extra: str,
    log: Path | None = None,
    timeout: float = 1500,
) -> RunResult:
    """ansible-playbook PLAYBOOK (relative to playbooks/) -i INVENTORY EXTRA..."""
    command = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(PLAYBOOKS / playbook)]
    return _run([*command, *extra], log, timeout)


def run_local_play(workdir: Path, inventory: dict[str, Any], play: str) -> None:
    """Runs the play text ``play`` in ``workdir`` against ``inventory`` (local hosts: role logic
    without a node) and asserts that it succeeded."""
    (workdir / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (workdir / "play.yml").write_text(play)
    completed = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "inventory.yml", "play.yml"],
        cwd=workdir,
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]


def role_decisions(
    workdir: Path,
    roles: tuple[str, ...],
    hosts: dict[str, dict[str, Any]],
    expressions: dict[str, str],
    *,
    facts: bool = False,
    children: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """What ``roles`` decide for made-up local hosts, without booting a node: real Ansible
    evaluates each Jinja expression of ``expressions`` (name: expression) for each host of
    ``hosts`` (name: its variables, what the role's tasks would have registered there), the
    roles' defaults and vars being group variables. ``facts``: gather the minimal facts first.
    Returns {host: {name: value}}."""
    out = workdir / "out"
    out.mkdir()
    inventory = {
        "all": {
            "vars": {
                **role_variables(*roles),
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
            },
            "hosts": hosts,
            "children": children or {},
        }
    }
    written = ", ".join(f"{name!r}: {expression}" for name, expression in expressions.items())
    play = [
        {
            "name": "Evaluate the roles' decisions.",
            "hosts": "all",
            "gather_facts": facts,
            "gather_subset": ["min"],
            "tasks": [
                {
                    "name": "Write them.",
                    "ansible.builtin.copy": {
                        "content": f"{{{{ {{{written}}} | to_json }}}}",
                        "dest": f"{out}/{{{{ inventory_hostname }}}}.json",
                        "mode": "0600",
                    },
                }
            ],
        }
    ]
    run_local_play(workdir, inventory, yaml.safe_dump(play))
    return {host: json.loads((out / f"{host}.json").read_text()) for host in hosts}


def run_module(
    pattern: str, inventory: Path, module: str, args: str, timeout: float = 600
) -> RunResult:
    """An ad-hoc `ansible PATTERN -m MODULE -a ARGS`."""
    command = [str(BIN / "ansible"), pattern, "-i", str(inventory), "-m", module, "-a", args]
    return _run(command, None, timeout)
