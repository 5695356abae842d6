"""The terminal table, rendered into string consoles."""

from __future__ import annotations

import io
import logging
from dataclasses import replace

import pytest
from rich.console import Console

from profiler_app.sinks.terminal import TerminalSink, host_line, render, summary_lines
from tests.support.cycles import sample_cycle


def text_of(renderable: object, width: int = 120) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    output = console.file.getvalue()
    assert isinstance(output, str)
    return output


def test_table_shows_each_gpu_and_the_host() -> None:
    output = text_of(render(sample_cycle()))
    assert "node-a: last 30m at 2026-11-22 04:00:00 UTC" in output
    lines = output.splitlines()
    at = next(i for i, line in enumerate(lines) if "job type" in line)
    header = lines[at - 1] + lines[at]  # two-line headers: "util" over "max"
    for word in ("GPU", "period", "util", "max", "p95", "mem", "copy", "FB", "used", "pod"):
        assert word in header
    gpu0 = next(line for line in output.splitlines() if "training" in line)
    for cell in ("12.5s", "90%", "85%", "40%", "29.3 GiB", "ml/trainer-0"):
        assert cell in gpu0, cell
    gpu1 = next(line for line in output.splitlines() if "idle" in line)
    assert "0 MiB" in gpu1
    assert gpu1.count(" - ") >= 1  # no period, no pod
    assert "host: cpu 12% " in output
    assert "mem 40%  disk 71%" in output


def test_table_and_log_lines_say_how_sure_and_why() -> None:
    output = text_of(render(sample_cycle()), width=200)
    header = next(line for line in output.splitlines() if "job type" in line)
    assert "conf" in header
    gpu0 = next(line for line in output.splitlines() if "training" in line)
    assert "0.90" in gpu0
    assert "GPU 0: period 12s in util; owner PyTorchJob" in output
    first, second = summary_lines(sample_cycle())[:2]
    assert first.endswith(
        "pod ml/trainer-0 runs torchrun (pytorch) confidence 0.90 "
        "(period 12s in util; owner PyTorchJob)"
    )
    assert " runs " not in second  # nothing known of what GPU 1 runs


def test_no_gpus_shows_the_notice_and_the_host() -> None:
    cycle = replace(sample_cycle(), gpus=[], pods=[])
    output = text_of(render(cycle, "no NVIDIA driver found: NVML Shared Library Not Found"))
    assert "job type" not in output
    assert "no NVIDIA driver found: NVML Shared Library Not Found" in output
    assert "host: cpu 12%" in output


def test_an_80_column_terminal_cuts_no_verdict_and_wraps_reasons_as_prose() -> None:
    output = text_of(render(sample_cycle()), width=80)
    assert "training" in output
    assert "trai…" not in output
    assert "29.3 GiB" in output  # numbers stay on one line too
    reasons = [line for line in output.splitlines() if line.startswith("GPU 0:")]
    assert reasons
    assert len(reasons[0].split()) > 3  # prose, not one word per line


def test_prometheus_mode_shows_no_host_line() -> None:
    cycle = replace(sample_cycle(), host={})
    assert "host" not in text_of(render(cycle))
    assert not any(line.startswith("host") for line in summary_lines(cycle))


def test_host_line_formats_rates() -> None:
    line = host_line(
        {
            "cpu_percent": 3.0,
            "cpu_percent_max": 55.0,
            "disk_read_bytes_per_second": 512.0,
            "disk_write_bytes_per_second": 2_500_000.0,
            "network_receive_bytes_per_second": 12_300.0,
            "network_transmit_bytes_per_second": 4e9,
        }
    )
    assert line == "cpu 3% (max 55%)  disk io r 512 B/s w 2.5 MB/s  net r 12.3 kB/s t 4.0 GB/s"
    assert host_line({}) == "no host readings yet"


def test_terminal_sink_redraws_in_place_on_a_tty() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, force_terminal=True, color_system=None)
    sink = TerminalSink(console)
    cycle = sample_cycle()
    sink.publish(cycle)
    sink.publish(replace(cycle, gpus=cycle.gpus[:1]))
    sink.close()
    output = buffer.getvalue()
    assert output.count("training") >= 2
    assert "\x1b[2K" in output  # lines erased: the second table replaces the first
    last_table = output.rsplit("node-a: last", 1)[1]
    assert "training" in last_table
    assert "idle" not in last_table


def test_terminal_sink_logs_lines_when_not_a_tty(caplog: pytest.LogCaptureFixture) -> None:
    buffer = io.StringIO()
    sink = TerminalSink(Console(file=buffer, width=120))
    with caplog.at_level(logging.INFO, logger="profiler_app.sinks.terminal"):
        sink.publish(sample_cycle())
    sink.close()
    assert buffer.getvalue() == ""
    messages = [record.getMessage() for record in caplog.records]
    assert messages == summary_lines(sample_cycle())
    assert messages[0].startswith("gpu 0 training period 12.5s util max 90% p95 85% mem copy 40%")
    assert messages[-1].startswith("host cpu 12%")
