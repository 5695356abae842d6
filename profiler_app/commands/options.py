"""Command-line options shared by ``analyze`` and ``run``, each falling back to an environment
variable, with the effective default shown in ``--help``.

Durations stay strings while parsing and are converted by ``duration`` in the command, so a
malformed value (from a flag or the environment) is one clear error line, not an argparse
usage dump or a traceback. A value the command line did not give is a ``Preset``: its errors
name the environment variable it came from, and a command can tell it from a typed one.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

from profiler_app.core.durations import format_duration, parse_duration
from profiler_app.core.errors import UserError
from profiler_app.core.gpu_resources import GPU_RESOURCES_ENV, GpuResources, parse_gpu_resources
from profiler_app.core.model import (
    DRAM_ACTIVE,
    FB_USED,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    MEM_COPY_UTIL,
    POWER_USAGE,
    SM_ACTIVE,
)
from profiler_app.core.urls import http_url_problem, without_credentials
from profiler_app.sources.prometheus.defaults import (
    DEFAULT_DEADLINE_SECONDS,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_POINTS,
    DEFAULT_STEP_SECONDS,
)

T = TypeVar("T")

# Every field but the classified one is optional: one a node's exporter lacks is said once
# and done without.
# DCGM's profiling fields: MIG instances have no GPU_UTIL or MEM_COPY_UTIL, and these stand in
# for them; SM activity (and DRAM_ACTIVE) is what right-sizing measures (docs/sharing.md). Read
# quietly where absent (not every GPU has them); local mode (NVML) has none of them.
MIG_FIELDS = (GR_ENGINE_ACTIVE, DRAM_ACTIVE, SM_ACTIVE)
DEFAULT_FIELDS = (GPU_UTIL, MEM_COPY_UTIL, FB_USED, POWER_USAGE, *MIG_FIELDS)
DEFAULT_WINDOW = "30m"
DEFAULT_NODE_LABEL = "Hostname"
STORE_URL_ENV = "GPU_PROFILER_STORE_URL"
# The one spelling of a store URL in every command's --help and in the docs.
STORE_URL_FORMS = "sqlite:///PATH or postgresql://USER[:PASSWORD]@HOST[:PORT]/DB"


class Preset(str):
    """An option's value the command line did not give: from the environment variable
    ``variable``, or the built-in default when that is None."""

    variable: str | None = None

    @classmethod
    def of(cls, value: str, variable: str | None = None) -> Preset:
        preset = cls(value)
        preset.variable = variable
        return preset


def env_default(name: str, fallback: str | None = None) -> str | None:
    """The environment variable ``name`` when set and not blank, else ``fallback``; both as a
    ``Preset``."""
    value = os.environ.get(name, "").strip()
    if value:
        return Preset.of(value, name)
    return None if fallback is None else Preset.of(fallback)


def given(value: object) -> bool:
    """Whether the command line itself gave this option's value."""
    return value is not None and not isinstance(value, Preset)


def named(value: object, flag: str) -> str:
    """How an error names where ``value`` came from: its environment variable, else ``flag``."""
    if isinstance(value, Preset) and value.variable:
        return value.variable
    return flag


def add_env_option(
    group: argparse._ActionsContainer,
    flag: str,
    *,
    env: str,
    help: str,
    default: str | None = None,
    shown_default: str | None = None,
    **kwargs: Any,  # passed on to argparse as they are (type, metavar)
) -> None:
    """A flag that falls back to the environment variable ``env``, then to ``default``.

    The help text ends with both, e.g. "(env GPU_PROFILER_WINDOW; default: 30m)".
    """
    shown = shown_default or ("%(default)s" if default is not None else "unset")
    if "type" in kwargs:
        kwargs["type"] = _naming_its_variable(kwargs["type"])
    group.add_argument(
        flag,
        default=env_default(env, default),
        help=f"{help} (env {env}; default: {shown})",
        **kwargs,
    )


def _naming_its_variable(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """``convert`` that, for a value from the environment, fails with one line naming the
    variable (argparse would name the flag, then print its usage)."""

    def checked(text: str) -> Any:
        try:
            return convert(text)
        except (argparse.ArgumentTypeError, ValueError, TypeError) as error:
            if isinstance(text, Preset) and text.variable:
                raise UserError(f"{text.variable}: {error}") from None
            raise

    checked.__name__ = getattr(convert, "__name__", "value")  # argparse's "invalid X value"
    return checked


def port(text: str) -> int:
    """A TCP port, or 0 for none (argparse type)."""
    try:
        number = int(text)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: use 1-65535, or 0 for none")
    return number


def add_gpu_resource_option(group: argparse._ActionsContainer) -> None:
    """``--gpu-resource``: resource names a device plugin renamed GPUs to (gpu_resources)."""
    add_env_option(
        group,
        "--gpu-resource",
        env=GPU_RESOURCES_ENV,
        shown_default="nvidia.com/gpu, nvidia.com/mig-*, and each with .shared",
        metavar="NAME[,NAME...]",
        help="more extended resources that are GPUs: names the device plugin's config renames "
        "GPUs to",
    )


def gpu_resources(args: argparse.Namespace) -> GpuResources:
    """The GPU resources, with those --gpu-resource (or its variable) adds."""
    return parse_gpu_resources(args.gpu_resource, named(args.gpu_resource, "--gpu-resource"))


def add_store_url_option(
    group: argparse._ActionsContainer, *, purpose: str, none: str | None
) -> None:
    """``--store-url``, spelled the same in every command; ``none`` says what 'none' does, for the
    commands that can do without a store."""
    from profiler_app.sinks.store.urls import default_store_url  # noqa: PLC0415  (no SQLAlchemy)

    default = default_store_url()
    effective = env_default(STORE_URL_ENV, default) or default
    forms = f"{STORE_URL_FORMS}, or none {none}" if none else STORE_URL_FORMS
    add_env_option(
        group,
        "--store-url",
        env=STORE_URL_ENV,
        default=default,
        # The environment's URL may hold a password: --help shows it masked.
        shown_default=without_credentials(effective).replace("%", "%%"),
        metavar="URL",
        help=f"{purpose}: {forms}",
    )


def checked(value: str, check: Callable[[str], T]) -> T:
    """``check(value)``; its error, for a value from the environment, names the variable (the
    message itself speaks of the value, as it does for a flag)."""
    try:
        return check(value)
    except UserError as error:
        if isinstance(value, Preset) and value.variable:
            raise UserError(f"{value.variable}: {error}") from None
        raise


def check_prometheus_url(value: str | None) -> None:
    """One line for a Prometheus URL that is not http(s), before anything is read."""
    if value is None:
        return

    def check(url: str) -> None:
        if problem := http_url_problem(url):
            shown = without_credentials(url)
            raise UserError(
                f"invalid Prometheus URL {shown!r} ({problem}): expected http://HOST:PORT"
            )

    checked(value, check)


def duration(text: str | None, flag: str) -> float | None:
    """Seconds in a duration option (None stays None); a malformed one names its flag, or the
    environment variable it came from."""
    if text is None:
        return None
    try:
        return parse_duration(text)
    except UserError as error:
        raise UserError(f"{named(text, flag)}: {error}") from error


def split_fields(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def add_prometheus_options(
    parser: argparse.ArgumentParser,
    *,
    default_fields: tuple[str, ...] = DEFAULT_FIELDS,
    default_window: str = DEFAULT_WINDOW,
) -> None:
    """--prometheus-url, --node, --node-label, --field, --window, --step and the answers' limits
    (--prometheus-max-bytes, --prometheus-deadline)."""
    group = parser.add_argument_group("Prometheus (dcgm-exporter metrics)")
    add_env_option(
        group,
        "--prometheus-url",
        env="GPU_PROFILER_PROMETHEUS_URL",
        metavar="URL",
        help="Prometheus base URL, e.g. http://prometheus:9090",
    )
    add_env_option(
        group,
        "--node",
        env="NODE_NAME",
        default=socket.gethostname(),
        metavar="NAME",
        help="the node whose GPUs to read",
    )
    add_env_option(
        group,
        "--node-label",
        env="GPU_PROFILER_NODE_LABEL",
        default=DEFAULT_NODE_LABEL,
        metavar="LABEL",
        help="the dcgm-exporter label holding the node name",
    )
    group.add_argument(  # its variable is read by explicit_fields(), as a comma-separated list
        "--field",
        metavar="FIELD",
        action="append",
        help=f"a dcgm-exporter field to read; repeat for several; {GPU_UTIL} if among them, "
        "else the first, is classified; the others are optional (one missing is a warning) "
        f"(env GPU_PROFILER_FIELDS, comma-separated; default: {', '.join(default_fields)})",
    )
    add_env_option(
        group,
        "--window",
        env="GPU_PROFILER_WINDOW",
        default=default_window,
        metavar="DURATION",
        help="how much history to analyse",
    )
    add_env_option(
        group,
        "--step",
        env="GPU_PROFILER_STEP",
        shown_default=f"{format_duration(DEFAULT_STEP_SECONDS)}, coarser for windows over "
        f"{format_duration(DEFAULT_STEP_SECONDS * DEFAULT_MAX_POINTS)} so that a window holds "
        f"at most {DEFAULT_MAX_POINTS:,} points",
        metavar="DURATION",
        help="query resolution",
    )
    add_env_option(
        group,
        "--prometheus-max-bytes",
        env="GPU_PROFILER_PROMETHEUS_MAX_BYTES",
        default=f"{DEFAULT_MAX_BYTES // 2**20}Mi",
        metavar="SIZE",
        help="the largest answer read from Prometheus, in bytes or with Ki, Mi or Gi; a larger one "
        "fails the request (parsing JSON takes about 8 times its size in memory)",
    )
    add_env_option(
        group,
        "--prometheus-deadline",
        env="GPU_PROFILER_PROMETHEUS_DEADLINE",
        default=format_duration(DEFAULT_DEADLINE_SECONDS),
        metavar="DURATION",
        help="the longest one Prometheus request may take, answer included, however steadily "
        "the server sends",
    )
    parser.set_defaults(default_fields=default_fields)


_SIZE_UNITS = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
_SIZE = re.compile(r"(\d+)(Ki|Mi|Gi)?")


def byte_size(text: str, flag: str) -> int:
    """A positive size in bytes, ``16777216`` or ``16Mi``; a malformed one names its flag or the
    environment variable it came from."""
    match = _SIZE.fullmatch(text.strip())
    size = int(match.group(1)) * _SIZE_UNITS[match.group(2) or ""] if match else 0
    if size <= 0:
        raise UserError(
            f"{named(text, flag)}: invalid size {text!r}: use a positive number of bytes, "
            "optionally with Ki, Mi or Gi (16Mi)"
        )
    return size


class PrometheusLimits(TypedDict):
    """One Prometheus request's limits, as ``PrometheusSource`` takes them."""

    max_bytes: int
    deadline_seconds: float


def prometheus_limits(args: argparse.Namespace) -> PrometheusLimits:
    """--prometheus-max-bytes and --prometheus-deadline, checked."""
    deadline = duration(args.prometheus_deadline, "--prometheus-deadline")
    if deadline is None or deadline <= 0:
        raise UserError(
            f"{named(args.prometheus_deadline, '--prometheus-deadline')} must be a positive "
            "duration"
        )
    return PrometheusLimits(
        max_bytes=byte_size(args.prometheus_max_bytes, "--prometheus-max-bytes"),
        deadline_seconds=deadline,
    )


def explicit_fields(args: argparse.Namespace) -> list[str] | None:
    """Fields named by --field or GPU_PROFILER_FIELDS, or None when neither is given."""
    if args.field:
        listed = [name for text in args.field for name in split_fields(text)]
    else:
        listed = split_fields(env_default("GPU_PROFILER_FIELDS") or "")
    return list(dict.fromkeys(listed)) or None


def fields(args: argparse.Namespace) -> list[str]:
    """The fields to read: --field, else GPU_PROFILER_FIELDS, else the command's default."""
    return explicit_fields(args) or list(args.default_fields)


def classified_first(names: list[str]) -> list[str]:
    """``names`` with the classified field first: GPU utilisation when present, else the first."""
    primary = GPU_UTIL if GPU_UTIL in names else names[0]
    return [primary, *(name for name in names if name != primary)]
