"""``gpu-profiler analyze``: classify the GPUs of one node, once, and print the result.

Reads the node's dcgm-exporter fields from Prometheus (one ``query_range`` request per field)
or from a saved ``query_range`` JSON answer (``--input``), then prints a table or JSON.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from profiler_app.commands import SUMMARIES, options
from profiler_app.core.errors import SourceError, UserError

if TYPE_CHECKING:
    from profiler_app.core.model import SeriesMatrix

# numpy and the Prometheus client load in handle(): `analyze --help` needs neither.

# Options only a Prometheus query uses (flag: attribute): a saved answer has its own window, step
# and nodes.
INPUT_IGNORES = {
    "--prometheus-url": "prometheus_url",
    "--node": "node",
    "--window": "window",
    "--step": "step",
}


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "analyze",
        help=SUMMARIES["analyze"],
        description="Classify what each GPU of one node did over a window (idle, training with "
        "its period, inference, bursty) from dcgm-exporter metrics, and print it.",
    )
    options.add_prometheus_options(parser)
    parser.add_argument(
        "--input",
        metavar="FILE",
        help="read a saved /api/v1/query_range JSON answer instead of querying Prometheus "
        "(every series in it; fields from the __name__ label, else --field)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "wide", "json"),
        default="table",
        help="table (default), wide (every column) or json: one object with one record per GPU, "
        "keys in docs/analyze.md",
    )
    parser.set_defaults(handler=handle)


def _read_prometheus(
    args: argparse.Namespace, window: float, step: float | None
) -> list[SeriesMatrix]:
    from profiler_app.sources.prometheus import PrometheusSource  # noqa: PLC0415

    fields = options.classified_first(options.fields(args))
    source = PrometheusSource(
        args.prometheus_url,
        args.node,
        args.node_label,
        fields,
        step,
        optional_fields=fields[1:],
        **options.prometheus_limits(args),
    )
    try:
        return source.read(window)
    except SourceError as error:  # worth a retry in the daemon; here the user decides
        raise UserError(str(error)) from error
    finally:
        source.close()


def handle(args: argparse.Namespace) -> int:
    from profiler_app.profiles.build import build_profiles  # noqa: PLC0415
    from profiler_app.profiles.render import render_json, render_table  # noqa: PLC0415
    from profiler_app.sources.prometheus import load_query_range  # noqa: PLC0415

    # Checked even where unused (--input) so a typo is never silently ignored.
    window = options.duration(args.window, "--window")
    step = options.duration(args.step, "--step")
    options.check_prometheus_url(args.prometheus_url)
    if args.input:
        unused = [
            flag for flag, dest in INPUT_IGNORES.items() if options.given(getattr(args, dest))
        ]
        if unused:
            print(
                f"gpu-profiler: warning: --input ignores {' and '.join(unused)}: the file's "
                "samples are analysed as they are",
                file=sys.stderr,
            )
        named = options.explicit_fields(args)
        optional = options.classified_first(named)[1:] if named else ()
        matrices = load_query_range(args.input, named, optional_fields=optional)
    elif args.prometheus_url:
        assert window is not None  # the option has a default
        matrices = _read_prometheus(args, window, step)
    else:
        raise UserError(
            "no metrics to analyse: give --prometheus-url URL (or set GPU_PROFILER_PROMETHEUS_URL)"
            " or --input FILE"
        )
    ordered = options.classified_first([matrix.field for matrix in matrices])
    profiles = build_profiles(matrices, ordered[0], node_label=args.node_label)
    if args.output == "json":
        print(render_json(profiles))
    else:
        print(render_table(profiles, ordered, wide=args.output == "wide"))
    return 0
