"""Pod CPU/memory peaks from Prometheus' cAdvisor series (``PodPeaksQuery``), how they fill
``pod_usage`` where the cgroups say nothing, and how the daemon copes when they fail.

Test double: ``StandInPrometheus`` (http.server on 127.0.0.1) plays Prometheus' instant query
API so the query text can be read back and errors provoked; the real server answers the same
queries in tests/integration/test_pod_peaks_prometheus.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import replace

import pytest

from profiler_app.core.errors import SourceError, UserError
from profiler_app.core.model import PodPeak
from profiler_app.profiles.pods import pod_usage
from profiler_app.sources.cadvisor import PodPeaksQuery
from profiler_app.sources.prometheus import PrometheusSource
from tests.support.daemon_doubles import (
    RecordingSink,
    ScriptedSource,
    errors,
    make_daemon,
    pod_info,
)
from tests.support.prometheus import Reply, StandInPrometheus, error_reply
from tests.unit.test_daemon_pods import pod

END = 1_795_320_000.0


def vector_reply(samples: list[tuple[dict[str, str], str]]) -> Reply:
    result = [{"metric": metric, "value": [END, value]} for metric, value in samples]
    return 200, json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}
    )


def cadvisor_answers(params: dict[str, str]) -> Reply:
    """CPU for pods a and b, memory only for a (b's memory series are missing)."""
    if "container_cpu_usage_seconds_total" in params["query"]:
        return vector_reply(
            [
                ({"namespace": "ml", "pod": "a"}, "250.5"),
                ({"namespace": "ml", "pod": "b"}, "12"),
                ({"namespace": "ml", "pod": "nan"}, "NaN"),
            ]
        )
    return vector_reply([({"namespace": "ml", "pod": "a"}, "3221225472")])


def test_queries_sum_containers_per_pod_and_escape_the_node() -> None:
    source = PrometheusSource("http://127.0.0.1:9", 'we"ird\\node', step_seconds=15)
    cpu, memory = PodPeaksQuery(source).queries(1800)
    node = 'node="we\\"ird\\\\node",container!="",container!="POD"'
    assert cpu == (
        "max_over_time((sum by (namespace, pod) "
        f"(rate(container_cpu_usage_seconds_total{{{node}}}[2m])))[1800s:15s]) * 100"
    )
    assert memory == (
        "max_over_time((sum by (namespace, pod) "
        f"(container_memory_working_set_bytes{{{node}}}))[1800s:15s])"
    )


def test_default_step_follows_the_gpu_read_and_the_node_label_is_an_option() -> None:
    source = PrometheusSource("http://127.0.0.1:9", "n")
    cpu, memory = PodPeaksQuery(source, node_label="kubernetes_node").queries(24 * 3600)
    assert '{kubernetes_node="n",' in cpu
    assert "[86400s:87s]" in memory  # default_step(1 day): at most 1,000 points
    with pytest.raises(UserError, match="invalid label name"):
        PodPeaksQuery(source, node_label="bad-label")


def test_read_makes_two_instant_queries_and_parses_by_pod() -> None:
    with StandInPrometheus(cadvisor_answers) as stand_in:
        source = PrometheusSource(stand_in.url, "node-a")
        peaks = PodPeaksQuery(source).read(1800, end=END)
    assert peaks == {
        ("ml", "a"): PodPeak(cpu_util_max=250.5, mem_used_max_bytes=3221225472.0),
        ("ml", "b"): PodPeak(cpu_util_max=12.0, mem_used_max_bytes=None),
    }
    assert source.stats.requests == 2
    assert [request["time"] for request in stand_in.requests] == [f"{END:.3f}"] * 2
    assert "start" not in stand_in.requests[0]  # instant queries, not ranges


def test_no_cadvisor_series_is_empty_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="profiler_app.sources.cadvisor")
    with StandInPrometheus(lambda params: vector_reply([])) as stand_in:
        query = PodPeaksQuery(PrometheusSource(stand_in.url, "node-a"))
        assert query.read(1800, end=END) == {}
        assert query.read(1800, end=END) == {}
    said = [r.getMessage() for r in caplog.records if "no cAdvisor series" in r.getMessage()]
    assert said == [
        "no cAdvisor series for node=node-a in Prometheus: pods get no CPU/memory peaks"
    ]


def test_errors_map_like_the_gpu_reads() -> None:
    overloaded = StandInPrometheus(lambda params: error_reply(503, "overloaded"))
    with overloaded as stand_in, pytest.raises(SourceError, match="HTTP 503: overloaded"):
        PodPeaksQuery(PrometheusSource(stand_in.url, "n")).read(1800, end=END)
    matrix = (
        200,
        json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}),
    )
    with (
        StandInPrometheus(lambda params: matrix) as stand_in,
        pytest.raises(UserError, match="expected 'vector'"),
    ):
        PodPeaksQuery(PrometheusSource(stand_in.url, "n")).read(1800, end=END)


def test_cgroup_peaks_win_and_prometheus_fills_the_gaps() -> None:
    usage = pod_usage(
        [],
        [pod("t", "uid-t"), pod("u", "uid-u"), pod("v", "uid-v")],
        {"uid-t": PodPeak(cpu_util_max=310.0, mem_used_max_bytes=None)},
        "node-a",
        {
            ("ml", "t"): PodPeak(cpu_util_max=99.0, mem_used_max_bytes=4e9),
            ("ml", "u"): PodPeak(cpu_util_max=20.0, mem_used_max_bytes=1e9),
            ("other", "v"): PodPeak(cpu_util_max=1.0, mem_used_max_bytes=1.0),
        },
    )
    by_name = {u.pod: (u.cpu_util_max, u.mem_used_max_bytes) for u in usage}
    assert by_name == {"t": (310.0, 4e9), "u": (20.0, 1e9), "v": (None, None)}


def test_daemon_uses_the_peaks_and_survives_their_failure() -> None:
    calls: list[float] = []
    script: list[Exception | None] = [None, SourceError("Prometheus timed out")]

    def peaks(window_seconds: float) -> Mapping[tuple[str, str], PodPeak]:
        calls.append(window_seconds)
        if failure := script.pop(0):
            raise failure
        return {("ml", "trainer-0"): PodPeak(cpu_util_max=1.0, mem_used_max_bytes=7e9)}

    sink = RecordingSink("store")
    daemon, metrics = make_daemon(ScriptedSource(), sink, pods=lambda: [pod_info()])
    # No cgroup tree, as in the DaemonSet: the peaks come from Prometheus alone.
    daemon.cycle.inputs = replace(daemon.cycle.inputs, host=None, metric_pod_peaks=peaks)
    assert daemon.run_cycle()
    first = sink.received[-1].pods[0]
    assert (first.pod, first.cpu_util_max, first.mem_used_max_bytes) == ("trainer-0", 1.0, 7e9)
    assert daemon.run_cycle()  # the GPU work still succeeds without them
    assert errors(metrics, "source") == 1
    second = sink.received[-1].pods[0]
    assert (second.gpus, second.cpu_util_max, second.mem_used_max_bytes) == (("0",), None, None)
    assert calls == [daemon.cycle.analysis.window_seconds] * 2
