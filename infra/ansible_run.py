"""Run the project's Ansible playbooks for KubeadmCluster, keeping secrets out of argv and logs.

Pulumi's ``command.local.Command`` runs ``python -m infra.ansible_run`` with its inputs in the
environment (secret inputs stay secret in Pulumi's state). Secrets reach Ansible only through files
readable by the current user alone, in a private temporary directory removed afterwards:

- ``GPU_CLUSTER_BECOME_PASSWORD`` becomes ``--become-password-file``;
- ``GPU_CLUSTER_SSH_KEY_PASSPHRASE`` unlocks ``GPU_CLUSTER_SSH_PRIVATE_KEY`` into a private
  ssh-agent (through an askpass helper), so that the passphrase never appears on a command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ENV_INVENTORY = "GPU_CLUSTER_INVENTORY"
ENV_PLAYBOOKS = "GPU_CLUSTER_PLAYBOOKS"  # os.pathsep-separated
ENV_EXTRA_VARS = "GPU_CLUSTER_EXTRA_VARS"  # a JSON object
ENV_PRIVATE_KEY = "GPU_CLUSTER_SSH_PRIVATE_KEY"
ENV_KEY_PASSPHRASE = "GPU_CLUSTER_SSH_KEY_PASSPHRASE"  # noqa: S105  a variable name
ENV_BECOME_PASSWORD = "GPU_CLUSTER_BECOME_PASSWORD"  # noqa: S105  a variable name
ENV_ANSIBLE_PLAYBOOK = "GPU_CLUSTER_ANSIBLE_PLAYBOOK"  # the executable; default: next to python
SECRET_VARIABLES = (ENV_KEY_PASSPHRASE, ENV_BECOME_PASSWORD)


class RunError(Exception):
    """A configuration problem, reported in one line."""


@dataclass(frozen=True)
class PlaybookRun:
    """What to run, read from the environment."""

    inventory: str
    playbooks: tuple[str, ...]
    extra_vars: dict[str, object]
    private_key: str | None
    key_passphrase: str | None
    become_password: str | None
    ansible_playbook: str

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> PlaybookRun:
        inventory = environ.get(ENV_INVENTORY, "")
        playbooks = tuple(p for p in environ.get(ENV_PLAYBOOKS, "").split(os.pathsep) if p)
        if not inventory or not playbooks:
            raise RunError(f"{ENV_INVENTORY} and {ENV_PLAYBOOKS} must be set")
        for path in (inventory, *playbooks):
            if not Path(path).exists():
                raise RunError(f"no such file: {path}")
        try:
            extra_vars = json.loads(environ.get(ENV_EXTRA_VARS) or "{}")
        except json.JSONDecodeError as error:
            raise RunError(f"{ENV_EXTRA_VARS} is not JSON: {error}") from None
        if not isinstance(extra_vars, dict):
            raise RunError(f"{ENV_EXTRA_VARS} must be a JSON object")
        default_playbook = str(Path(sys.executable).with_name("ansible-playbook"))
        return cls(
            inventory=inventory,
            playbooks=playbooks,
            extra_vars=extra_vars,
            private_key=environ.get(ENV_PRIVATE_KEY) or None,
            key_passphrase=environ.get(ENV_KEY_PASSPHRASE) or None,
            become_password=environ.get(ENV_BECOME_PASSWORD) or None,
            ansible_playbook=environ.get(ENV_ANSIBLE_PLAYBOOK) or default_playbook,
        )


def _private_file(folder: Path, name: str, content: str, mode: int = 0o600) -> Path:
    path = folder / name
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(content)
    return path


def playbook_command(
    run: PlaybookRun, extra_vars_file: Path, become_file: Path | None
) -> list[str]:
    """The ansible-playbook argv; it holds file names only, never a secret."""
    command = [run.ansible_playbook, "-i", run.inventory, "--extra-vars", f"@{extra_vars_file}"]
    if run.private_key:
        command += ["--private-key", run.private_key]
    if become_file is not None:
        command += ["--become-password-file", str(become_file)]
    return [*command, *run.playbooks]


def _child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    env = {key: value for key, value in environ.items() if key not in SECRET_VARIABLES}
    env.setdefault("ANSIBLE_HOST_KEY_CHECKING", "True")
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


def _start_agent(run: PlaybookRun, folder: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A private ssh-agent holding the unlocked key; the passphrase goes through askpass."""
    assert run.private_key is not None
    assert run.key_passphrase is not None
    socket = folder / "agent.sock"
    passphrase_file = _private_file(folder, "passphrase", run.key_passphrase)
    # ssh-add asks again after a wrong passphrase until it gets an empty answer: answer once.
    askpass = _private_file(
        folder,
        "askpass",
        f"#!/bin/sh\ncat '{passphrase_file}' 2>/dev/null\nrm -f '{passphrase_file}'\n",
        mode=0o700,
    )
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(50):  # the agent creates its socket within milliseconds
            if socket.exists():
                break
            time.sleep(0.1)
        env["SSH_AUTH_SOCK"] = str(socket)
        add_env = {
            **env,
            "SSH_ASKPASS": str(askpass),
            "SSH_ASKPASS_REQUIRE": "force",
            "DISPLAY": ":0",
        }
        added = subprocess.run(
            ["ssh-add", run.private_key],
            env=add_env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
            check=False,
        )
        if added.returncode != 0:
            raise RunError(f"ssh-add could not unlock {run.private_key}")
    except subprocess.TimeoutExpired:
        _stop(agent)
        raise RunError(f"ssh-add timed out unlocking {run.private_key}") from None
    except BaseException:
        _stop(agent)
        raise
    return agent


def _stop(agent: subprocess.Popen[bytes]) -> None:
    agent.terminate()
    try:
        agent.wait(timeout=10)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()


def run_playbooks(run: PlaybookRun, environ: Mapping[str, str]) -> int:
    """Run ansible-playbook once over all playbooks; returns its exit status."""
    env = _child_environment(environ)
    with tempfile.TemporaryDirectory(prefix="gpu-cluster-ansible-") as tmp:
        folder = Path(tmp)  # mkdtemp creates it with mode 0700
        extra_vars_file = _private_file(folder, "extra-vars.json", json.dumps(run.extra_vars))
        become_file = (
            _private_file(folder, "become-password", run.become_password)
            if run.become_password
            else None
        )
        agent = _start_agent(run, folder, env) if run.key_passphrase and run.private_key else None
        try:
            command = playbook_command(run, extra_vars_file, become_file)
            return subprocess.run(command, env=env, check=False).returncode
        finally:
            if agent is not None:
                _stop(agent)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Entry point of ``python -m infra.ansible_run`` (takes no arguments)."""
    del argv
    environ = os.environ if environ is None else environ
    try:
        run = PlaybookRun.from_environment(environ)
        return run_playbooks(run, environ)
    except RunError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
