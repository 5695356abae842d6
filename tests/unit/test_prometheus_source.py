"""PrometheusSource and query_range parsing, without a real Prometheus.

Test double: ``StandInPrometheus`` (http.server on 127.0.0.1) plays Prometheus' HTTP API so
errors, 5xx answers, invalid JSON and time-outs can be provoked; the real server is exercised
in tests/integration/test_analyze_prometheus.py.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import numpy as np
import pytest

from profiler_app.core.errors import SourceError, UserError
from profiler_app.core.model import FB_USED, GPU_UTIL, SeriesMatrix
from profiler_app.core.urls import without_credentials
from profiler_app.sources.prometheus import (
    MAX_POINTS_PER_REQUEST,
    PrometheusSource,
    default_step,
    grid_ending_at,
    load_query_range,
    parse_query_range,
    promql_selector,
    query_range_document,
)
from tests.support.prometheus import (
    Reply,
    StandInPrometheus,
    error_reply,
    free_port,
    matrix_reply,
)

END = 1_795_320_000.0  # a multiple of 10 s


def gpu_metric(gpu: str, **extra: str) -> dict[str, str]:
    return {"__name__": GPU_UTIL, "Hostname": "node-a", "gpu": gpu, "UUID": f"GPU-{gpu}", **extra}


def sample_series(params: dict[str, str]) -> Reply:
    """Two GPUs: GPU 0 reports t mod 97 at every step, GPU 1 only at every other step."""
    start, end, step = (float(params[key]) for key in ("start", "end", "step"))
    times = np.arange(start, end + step / 2, step)
    return matrix_reply(
        [
            {"metric": gpu_metric("0"), "values": [[t, str(t % 97)] for t in times]},
            {"metric": gpu_metric("1"), "values": [[t, "5"] for t in times[::2]]},
        ]
    )


def test_selector_escapes_the_label_value() -> None:
    selector = promql_selector(GPU_UTIL, "Hostname", 'we"ird\\node\n')
    assert selector == 'DCGM_FI_DEV_GPU_UTIL{Hostname="we\\"ird\\\\node\\n"}'


@pytest.mark.parametrize(
    ("field", "label", "message"),
    [("DCGM FI", "Hostname", "invalid metric name"), (GPU_UTIL, "host-name", "invalid label")],
)
def test_selector_rejects_bad_names(field: str, label: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        promql_selector(field, label, "node-a")


@pytest.mark.parametrize(
    ("window", "step"), [(120, 10), (1800, 10), (6 * 3600, 22), (86400, 87), (7 * 86400, 605)]
)
def test_default_step_is_10s_or_coarser_for_long_windows(window: float, step: float) -> None:
    assert default_step(window) == step
    assert window / default_step(window) <= 1000 or default_step(window) == 10


def test_grid_ends_on_a_step_boundary_and_covers_the_window() -> None:
    grid = grid_ending_at(END + 7.5, 1800, 10)
    assert grid.end == END
    assert grid.points == 181
    assert grid.start == END - 1800
    with pytest.raises(UserError, match="longer than the window"):
        grid_ending_at(END, 60, 120)


def test_grid_chunks_are_contiguous_and_within_the_limit() -> None:
    grid = grid_ending_at(END, 4 * 3600, 1)
    chunks = grid.chunks(MAX_POINTS_PER_REQUEST)
    assert [chunk.points for chunk in chunks] == [11_000, 14_401 - 11_000]
    assert chunks[1].start == chunks[0].end + 1
    assert chunks[-1].end == grid.end


def test_read_aligns_series_on_one_grid_with_nan_for_missing_samples() -> None:
    with StandInPrometheus(sample_series) as server:
        source = PrometheusSource(server.url, "node-a", fields=[GPU_UTIL])
        (matrix,) = source.read(1800, end=END)
    assert matrix.field == GPU_UTIL
    assert matrix.step_seconds == 10
    assert matrix.values.shape == (2, 181)
    assert matrix.labels[0] == {"Hostname": "node-a", "gpu": "0", "UUID": "GPU-0"}
    np.testing.assert_array_equal(matrix.timestamps, END - 1800 + 10 * np.arange(181))
    np.testing.assert_array_equal(matrix.values[0], matrix.timestamps % 97)
    assert np.isnan(matrix.values[1, 1::2]).all()
    assert (matrix.values[1, ::2] == 5).all()
    (request,) = server.requests
    # dcgm-exporter spells the node label either way (Hostname to 4.5.3-4.8.2, hostname after).
    assert request["query"] == (
        'DCGM_FI_DEV_GPU_UTIL{Hostname="node-a"} or DCGM_FI_DEV_GPU_UTIL{hostname="node-a"}'
    )
    assert float(request["start"]) == END - 1800
    assert float(request["end"]) == END
    assert float(request["step"]) == 10
    assert source.stats.requests == 1
    assert source.stats.bytes_read > 1000


def test_one_request_per_field_and_the_session_reuses_its_connection() -> None:
    with StandInPrometheus(sample_series) as server:
        source = PrometheusSource(server.url, "node-a", fields=[GPU_UTIL, FB_USED])
        matrices = source.read(600, end=END)
        source.read(600, end=END)
    assert [m.field for m in matrices] == [GPU_UTIL, FB_USED]
    assert [r["query"].split("{")[0] for r in server.requests] == [GPU_UTIL, FB_USED] * 2
    assert source.stats.requests == 4
    assert len(set(server.client_ports)) == 1


def test_fine_explicit_steps_are_split_into_requests_under_the_point_limit() -> None:
    with StandInPrometheus(sample_series) as server:
        source = PrometheusSource(server.url, "node-a", step_seconds=1)
        (matrix,) = source.read(4 * 3600, end=END)
    assert len(server.requests) == 2
    for request in server.requests:
        points = (float(request["end"]) - float(request["start"])) / float(request["step"]) + 1
        assert points <= MAX_POINTS_PER_REQUEST
    assert matrix.values.shape == (2, 4 * 3600 + 1)
    np.testing.assert_array_equal(matrix.values[0], matrix.timestamps % 97)


def test_special_values_are_parsed() -> None:
    def reply(params: dict[str, str]) -> Reply:
        end = float(params["end"])
        values = [[end - 20, "NaN"], [end - 10, "+Inf"], [end, "-Inf"]]
        return matrix_reply([{"metric": gpu_metric("0"), "values": values}])

    with StandInPrometheus(reply) as server:
        (matrix,) = PrometheusSource(server.url, "node-a").read(60, end=END)
    assert np.isnan(matrix.values[0, :-2]).all()
    assert matrix.values[0, -2] == math.inf
    assert matrix.values[0, -1] == -math.inf


@pytest.mark.parametrize(
    ("reply", "error", "message"),
    [
        (
            error_reply(400, "exceeded maximum resolution of 11,000 points per timeseries"),
            UserError,
            r"rejected DCGM_FI_DEV_GPU_UTIL\{Hostname=\"node-a\"\} or .* \(HTTP 400\): "
            "exceeded maximum",
        ),
        ((404, "404 page not found"), UserError, r"HTTP 404\): Not Found"),
        (
            error_reply(422, "query processing would load too many samples", "execution"),
            UserError,
            "422",
        ),
        (error_reply(503, "too many queries", "unavailable"), SourceError, "HTTP 503: too many"),
        ((500, "oops"), SourceError, "answered HTTP 500"),
        ((502, "<html>bad gateway</html>"), SourceError, "HTTP 502"),
        ((200, "<html>not prometheus</html>"), UserError, "not JSON"),
        ((200, json.dumps({"status": "success"})), UserError, "no 'data'"),
        (
            (
                200,
                json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}),
            ),
            UserError,
            "resultType is 'vector'",
        ),
    ],
)
def test_http_failures(reply: Reply, error: type[Exception], message: str) -> None:
    with StandInPrometheus(lambda _params: reply) as server:
        source = PrometheusSource(server.url, "node-a")
        with pytest.raises(error, match=message):
            source.read(600, end=END)


def test_a_slow_prometheus_is_a_transient_timeout() -> None:
    def slow(params: dict[str, str]) -> Reply:
        time.sleep(1.5)
        return sample_series(params)

    with StandInPrometheus(slow) as server:
        source = PrometheusSource(server.url, "node-a", timeout=0.2)
        with pytest.raises(SourceError, match=r"timed out after 0\.2s"):
            source.read(600, end=END)


def test_nothing_listening_is_a_transient_connection_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SourceError) as raised:
        PrometheusSource(url, "node-a").read(600)
    assert str(raised.value) == f"cannot reach Prometheus at {url}: Connection refused"


def test_an_unknown_node_says_so() -> None:
    with (
        StandInPrometheus(lambda _params: matrix_reply([])) as server,
        pytest.raises(UserError) as raised,
    ):
        PrometheusSource(server.url, "node-x").read(1800)
    assert str(raised.value) == (
        "no series for Hostname=node-x in the last 30m: "
        "unknown node or no dcgm-exporter data in the window"
    )


def test_a_field_the_exporter_lacks_is_named() -> None:
    def only_util(params: dict[str, str]) -> Reply:
        return sample_series(params) if GPU_UTIL in params["query"] else matrix_reply([])

    with StandInPrometheus(only_util) as server:
        source = PrometheusSource(server.url, "node-a", fields=[GPU_UTIL, FB_USED])
        with pytest.raises(UserError, match=f"no {FB_USED} series for Hostname=node-a"):
            source.read(600)


def test_an_optional_field_the_exporter_lacks_is_skipped_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def only_util(params: dict[str, str]) -> Reply:
        return sample_series(params) if GPU_UTIL in params["query"] else matrix_reply([])

    with StandInPrometheus(only_util) as server:
        source = PrometheusSource(
            server.url, "node-a", fields=[GPU_UTIL, FB_USED], optional_fields=[GPU_UTIL, FB_USED]
        )
        first = source.read(600)
        second = source.read(600)
    assert [matrix.field for matrix in first] == [GPU_UTIL]
    assert [matrix.field for matrix in second] == [GPU_UTIL]
    said = [record.message for record in caplog.records if FB_USED in record.message]
    assert len(said) == 1
    assert "going on without it" in said[0]


def test_the_primary_field_is_never_optional() -> None:
    with StandInPrometheus(lambda _params: matrix_reply([])) as server:
        source = PrometheusSource(server.url, "node-x", optional_fields=[GPU_UTIL])
        with pytest.raises(UserError, match="unknown node"):
            source.read(600)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"url": "prometheus:9090"}, "invalid Prometheus URL"),
        (
            {"url": "http://admin:hunter2@prometheus:90x0"},
            r"invalid Prometheus URL 'http://\*\*\*@",
        ),
        ({"fields": []}, "no fields"),
        ({"step_seconds": 0}, "positive"),
    ],
)
def test_bad_configuration(arguments: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {"url": "http://127.0.0.1:9", "node": "node-a", **arguments}
    with pytest.raises(UserError, match=message):
        PrometheusSource(**settings)  # type: ignore[arg-type]


def document(*series: dict[str, object]) -> dict[str, object]:
    return {"status": "success", "data": {"resultType": "matrix", "result": list(series)}}


def test_parse_query_range_infers_the_grid() -> None:
    saved = document(
        {"metric": gpu_metric("0"), "values": [[100, "1"], [130, "NaN"], [140, "2"]]},
        {"metric": gpu_metric("1"), "values": [[110, "+Inf"], [120, "3"]]},
        {"metric": {**gpu_metric("0"), "__name__": FB_USED}, "values": [[100, "9"]]},
    )
    matrix = parse_query_range(saved, GPU_UTIL)
    assert matrix.step_seconds == 10
    np.testing.assert_array_equal(matrix.timestamps, [100, 110, 120, 130, 140])
    np.testing.assert_array_equal(
        matrix.values, [[1, np.nan, np.nan, np.nan, 2], [np.nan, np.inf, 3, np.nan, np.nan]]
    )
    assert matrix.labels[1] == {"Hostname": "node-a", "gpu": "1", "UUID": "GPU-1"}


def test_parse_query_range_takes_unnamed_series_as_the_given_field() -> None:
    saved = document({"metric": {"gpu": "0"}, "values": [[0, "1"], [5, "2"]]})
    matrix = parse_query_range(saved, "max_util")
    assert matrix.field == "max_util"
    assert matrix.step_seconds == 5
    assert matrix.labels == [{"gpu": "0"}]


@pytest.mark.parametrize(
    ("saved", "message"),
    [
        ([], "no 'data' object"),
        ({"status": "error", "data": {}}, "Prometheus answered an error: no error text"),
        ({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}, "scalar"),
        ({"status": "success", "data": {"resultType": "matrix", "result": {}}}, "not a list"),
        (document({"metric": {}, "values": [[1, "2", 3]]}), "not a list of"),
        (document({"metric": {}, "values": [[1, "many"]]}), "malformed sample"),
        (document({"metric": {"__name__": FB_USED}, "values": [[1, "2"]]}), "no DCGM_FI_DEV_GPU"),
        (document({"metric": {}, "values": []}), "without samples"),
        (document({"metric": {}, "values": [[0, "1"], [1e9, "2"], [1e9 + 1, "3"]]}), "evenly"),
    ],
)
def test_parse_query_range_rejects_other_documents(saved: object, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_query_range(saved, GPU_UTIL)


def test_saved_documents_round_trip(tmp_path: Path) -> None:
    values = np.array([[1.0, np.nan, 3.5, np.inf], [0.0, 0.0, 0.0, 7.0]])
    labels = [{"gpu": "0", "Hostname": "n"}, {"gpu": "1", "Hostname": "n"}]
    timestamps = np.array([10.0, 20.0, 30.0, 40.0])
    saved = tmp_path / "dump.json"
    results = []
    for field in (GPU_UTIL, FB_USED):
        matrix = SeriesMatrix(field, labels, timestamps, values, 10.0)
        results += query_range_document(matrix)["data"]["result"]  # type: ignore[index]
    saved.write_text(json.dumps(document(*results)))
    util, fb = load_query_range(str(saved))
    assert (util.field, fb.field) == (GPU_UTIL, FB_USED)
    np.testing.assert_array_equal(util.values, values)
    assert util.labels == labels
    (only_fb,) = load_query_range(str(saved), [FB_USED])
    assert only_fb.field == FB_USED


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("{not json", "is not valid JSON"),
        (json.dumps(document({"metric": {}, "values": [[0, "1"]]})), "no __name__ label"),
    ],
)
def test_load_query_range_errors(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "dump.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError, match=message):
        load_query_range(str(path))


def test_credentials_in_the_url_never_reach_messages() -> None:
    port = free_port()
    source = PrometheusSource(f"http://admin:s3cret@127.0.0.1:{port}", "node-a")
    with pytest.raises(SourceError) as raised:
        source.read(600)
    assert (
        str(raised.value)
        == f"cannot reach Prometheus at http://***@127.0.0.1:{port}: Connection refused"
    )
    assert "s3cret" not in source.display_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://u:pw@[::1:113/db", "https://***@[::1:113/db"),  # urlsplit: Invalid IPv6 URL
        ("https://[::1:113/db", "https://[::1:113/db"),
        ("https://u:pw@[::1]:9090/x", "https://***@[::1]:9090/x"),
    ],
)
def test_unparseable_urls_are_masked_not_raised(url: str, shown: str) -> None:
    assert without_credentials(url) == shown


def test_credentials_are_sent_to_prometheus() -> None:
    """Basic authentication in the URL still works (requests sends it as a header)."""
    with StandInPrometheus(sample_series) as server:
        url = server.url.replace("http://", "http://admin:s3cret@")
        (matrix,) = PrometheusSource(url, "node-a").read(600, end=END)
    assert matrix.values.shape == (2, 61)
    assert server.headers[0]["Authorization"] == "Basic YWRtaW46czNjcmV0"  # admin:s3cret


def test_absurdly_fine_steps_are_refused() -> None:
    with pytest.raises(UserError, match=r"2,592,001 points per GPU; use a coarser step"):
        grid_ending_at(END, 30 * 86400, 1)


def test_credentials_never_reach_messages() -> None:
    assert without_credentials("http://admin:hunter2@prom:9090/x") == "http://***@prom:9090/x"
    assert without_credentials("http://prom:9090") == "http://prom:9090"
    # A malformed port is masked too, not a traceback (the source reports it afterwards).
    assert without_credentials("http://admin:hunter2@prom:x/") == "http://***@prom:x/"
    # Password options in the query string (libpq takes them) are masked, the others kept.
    assert (
        without_credentials("postgresql://db/gpus?sslmode=require&password=hunter2&sslpassword=k")
        == "postgresql://db/gpus?sslmode=require&password=***&sslpassword=***"
    )


@pytest.mark.parametrize(
    "url",
    ["http://[::1]:9090", "https://prometheus.monitoring.svc", "HTTP://10.0.0.1:9090/prom/"],
)
def test_urls_that_can_work_are_accepted(url: str) -> None:
    PrometheusSource(url, "node-a").close()


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://", "no host"),
        ("http://a b", "a space"),
        ("http://%zz", "a % not followed by two hex digits"),
        ("http://[::zz]:9090", "IPv6 address"),
        ("http://bad,host:9090", "is not a host name"),
        ("ftp://prometheus", "not http:// or https://"),
    ],
)
def test_urls_that_cannot_work_are_refused_with_the_reason(url: str, problem: str) -> None:
    with pytest.raises(UserError, match=f"invalid Prometheus URL .*{re.escape(problem)}"):
        PrometheusSource(url, "node-a")
