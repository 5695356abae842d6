"""The node tests skip with a reason, instead of failing, where nodes cannot boot."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.nodes.harness import cluster


def test_not_root_is_a_reason_to_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cluster.missing_requirements() == (
        "booting test nodes needs root (systemd-nspawn, veth, cgroups)"
    )


def test_missing_tools_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        shutil, "which", lambda tool: None if tool in {"debootstrap", "zstd"} else tool
    )
    assert cluster.missing_requirements() == "missing tools for test nodes: debootstrap, zstd"
