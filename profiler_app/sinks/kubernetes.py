"""Publishes each cycle's profile as node and pod annotations, patching only what changed.

Requests per cycle: none when nothing changed meaningfully; otherwise one strategic-merge PATCH
for the node plus one per pod whose values changed. Numbers count as changed only when they move
beyond a tolerance (``TOLERANCES``) from the value last written, so a period estimate wobbling as
the window slides costs nothing while slow drift is still written once it adds up. A PATCH sent
anyway carries every value that differs at all, so the object is brought fully up to date. The
first cycle reads the node once (GET) to learn what an earlier run left. ``profiled-at`` is not a
change by itself: it is written with every real change and, as a heartbeat, at least every
``heartbeat_seconds`` (default 10 minutes), so "profiled-at is old" means "the profiler is down or
stuck", while an idle cluster costs no API requests between heartbeats. The heartbeat re-reads
the node first (GET + PATCH), so annotations edited or removed by hand are repaired.

Failures: 404 for a pod is churn (it was deleted since the cycle looked), logged once and
skipped; 404 for the node is a configuration problem (wrong --node) and raises. 409 is retried a
couple of times. 429, 5xx, timeouts and anything else raise ``KubernetesError`` and start an
exponential back-off (honouring Retry-After) during which ``publish`` sends nothing.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from profiler_app.errors import UserError
from profiler_app.kube import (
    TRANSPORT_ERRORS,
    KubeConnection,
    KubernetesError,
    describe,
    error_status,
    release,
    retry_after_seconds,
)
from profiler_app.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL, CycleResult, PodUsage
from profiler_app.sinks import field_stat

log = logging.getLogger(__name__)

DEFAULT_DOMAIN = "ai.centaurus.io"
DEFAULT_HEARTBEAT_SECONDS = 600.0
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
NODE_PATH = "/api/v1/nodes/{name}"
POD_PATH = "/api/v1/namespaces/{namespace}/pods/{name}"
# Kubernetes rejects objects whose annotations exceed 256 KiB in total, ours included with
# everyone else's. Our share stays far below: at most MAX_GPUS x 7 keys, checked against a budget.
MAX_GPUS = 64
ANNOTATION_BUDGET_BYTES = 32 * 1024
JOB_TYPE, PERIOD, UTIL_MAX, MEM_COPY_UTIL_MAX, FB_USED_MAX = (
    "job-type",
    "period-seconds",
    "util-max",
    "mem-copy-util-max",  # DCGM_FI_DEV_MEM_COPY_UTIL: memory bandwidth, not occupancy
    "fb-used-max-mib",
)
PROFILED_AT = "profiled-at"
# Why the job type: confidence (0-1, 2 decimals) and the reasons, joined by "; " and cut at a
# reason boundary to REASONS_MAX_CHARS; left out for every GPU when they would take the node
# past ANNOTATION_BUDGET_BYTES.
CONFIDENCE, REASONS = "confidence", "reasons"
REASONS_MAX_CHARS = 160
POD_GPU_UTIL_MAX, POD_GPU_MEM_COPY_UTIL_MAX, POD_CPU_UTIL_MAX, POD_MEM_USED_MAX = (
    "gpu-util-max",
    "gpu-mem-copy-util-max",
    "cpu-util-max",
    "mem-used-max-mib",
)
# Names earlier versions wrote for memory-copy utilisation: removed where found (node) or with
# the first write (pods), so a node never shows both.
LEGACY_NODE_NAMES = ("mem-util-max",)
LEGACY_POD_NAMES = ("gpu-mem-util-max",)


@dataclass(frozen=True)
class Tolerance:
    """How far a number may move from the value last written before it counts as a change."""

    absolute: float = 0.0
    relative: float = 0.0  # fraction of the value last written

    def exceeded(self, written: float, current: float) -> bool:
        return abs(current - written) > max(self.absolute, self.relative * abs(written))


_PERCENT = Tolerance(absolute=1.0)  # 1 point: 99 <-> 100 is noise, 97 -> 99 is news
_MIB = Tolerance(absolute=64.0, relative=0.01)
# Keyed by annotation name (after the domain and, on nodes, the gpu-<i>- prefix); see
# docs/annotations.md. Names not listed (job-type, profiled-at) change on any difference.
TOLERANCES: dict[str, Tolerance] = {
    PERIOD: Tolerance(relative=0.02),
    CONFIDENCE: Tolerance(absolute=0.05),
    UTIL_MAX: _PERCENT,
    MEM_COPY_UTIL_MAX: _PERCENT,
    FB_USED_MAX: _MIB,
    POD_GPU_UTIL_MAX: _PERCENT,
    POD_GPU_MEM_COPY_UTIL_MAX: _PERCENT,
    POD_CPU_UTIL_MAX: Tolerance(absolute=1.0, relative=0.02),  # percent of one core, may be > 100
    POD_MEM_USED_MAX: _MIB,
}

_NUMBER = re.compile(r"\d+(\.\d+)?")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GPU_INDEX = re.compile(r"^[A-Za-z0-9]+$")
_NODE_GPU_KEY_NAME = re.compile(r"^gpu-[A-Za-z0-9]+-(.+)$")

Annotations = dict[str, str]
Patch = dict[str, str | None]


def validate_domain(domain: str) -> str:
    """The annotation domain, or UserError if Kubernetes would reject it as a key prefix."""
    if len(domain) > 253 or not _DNS_SUBDOMAIN.match(domain):
        raise UserError(
            f"invalid annotation domain {domain!r}: use a DNS subdomain such as ai.centaurus.io"
        )
    return domain


def _whole(value: float | None) -> str | None:
    """Rounded to an integer: a percent or MiB that moves by less does not count as a change."""
    return None if value is None or math.isnan(value) else str(round(value))


def _rfc3339(moment: datetime) -> str:
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _reasons(reasons: tuple[str, ...]) -> str | None:
    """Reasons joined by "; ", as many whole ones as fit in ``REASONS_MAX_CHARS``."""
    kept: list[str] = []
    for reason in reasons:
        if len("; ".join([*kept, reason])) > REASONS_MAX_CHARS:
            break
        kept.append(reason)
    return "; ".join(kept) or None


def node_annotations(result: CycleResult, domain: str, max_gpus: int = MAX_GPUS) -> Annotations:
    """The node annotations ``result`` calls for, values rounded so noise does not churn them."""
    annotations = {f"{domain}/{PROFILED_AT}": _rfc3339(result.at)}
    reasons: Annotations = {}
    profiles = sorted(
        (p for p in result.gpus if _GPU_INDEX.match(p.gpu)),
        key=lambda p: (len(p.gpu), p.gpu),
    )
    if len(profiles) > max_gpus:
        log.warning("annotating the first %d of %d GPUs", max_gpus, len(profiles))
    for profile in profiles[:max_gpus]:
        prefix = f"{domain}/gpu-{profile.gpu}-"
        values = {
            JOB_TYPE: profile.job_type,
            PERIOD: None
            if profile.period_seconds is None or math.isnan(profile.period_seconds)
            else f"{profile.period_seconds:.1f}",
            UTIL_MAX: _whole(field_stat(profile, GPU_UTIL)),
            MEM_COPY_UTIL_MAX: _whole(field_stat(profile, MEM_COPY_UTIL)),
            FB_USED_MAX: _whole(field_stat(profile, FB_USED)),
            CONFIDENCE: None if profile.confidence is None else f"{profile.confidence:.2f}",
        }
        annotations.update({prefix + name: value for name, value in values.items() if value})
        if text := _reasons(profile.reasons):
            reasons[prefix + REASONS] = text
    if annotation_bytes(annotations) + annotation_bytes(reasons) <= ANNOTATION_BUDGET_BYTES:
        annotations.update(reasons)
    elif reasons:
        log.warning("leaving out the GPUs' reasons: they would exceed the annotation budget")
    return annotations


def pod_annotations(usage: PodUsage, domain: str) -> Annotations:
    """Annotations for a pod that uses GPUs; memory is the peak in MiB (see docs/annotations.md)."""
    memory_mib = None if usage.mem_used_max_bytes is None else usage.mem_used_max_bytes / 2**20
    values = {
        POD_GPU_UTIL_MAX: _whole(usage.gpu_util_max),
        POD_GPU_MEM_COPY_UTIL_MAX: _whole(usage.gpu_mem_copy_util_max),
        POD_CPU_UTIL_MAX: _whole(usage.cpu_util_max),
        POD_MEM_USED_MAX: _whole(memory_mib),
    }
    return {f"{domain}/{name}": value for name, value in values.items() if value is not None}


def annotation_bytes(annotations: Mapping[str, str | None]) -> int:
    """Size as Kubernetes counts it: keys plus values."""
    return sum(len(key) + len(value or "") for key, value in annotations.items())


def diff(known: Mapping[str, str], desired: Mapping[str, str], owned: Iterable[str]) -> Patch:
    """Patch turning ``known`` into ``desired``: changed values, and null for owned keys gone."""
    patch: Patch = {key: value for key, value in desired.items() if known.get(key) != value}
    patch.update({key: None for key in owned if key in known and key not in desired})
    return patch


def _tolerance(key: str) -> Tolerance | None:
    name = key.rpartition("/")[2]
    if name in TOLERANCES:  # a pod key, or a node key whose GPU index looks like one
        return TOLERANCES[name]
    node_key = _NODE_GPU_KEY_NAME.match(name)
    return TOLERANCES.get(node_key.group(1)) if node_key else None


def significant(key: str, written: str | None, current: str | None) -> bool:
    """Whether ``key`` going from ``written`` to ``current`` is worth a request.

    Appearing and disappearing always are; numbers only beyond the key's tolerance.
    """
    if written == current:
        return False
    if written is not None and current is not None and key.endswith(f"-{REASONS}"):
        # The numbers in reasons move a little every cycle; new evidence changes the words.
        return _NUMBER.sub("#", written) != _NUMBER.sub("#", current)
    tolerance = _tolerance(key)
    if tolerance is None or written is None or current is None:
        return True
    try:
        return tolerance.exceeded(float(written), float(current))
    except ValueError:
        return True


def significant_patch(known: Mapping[str, str], patch: Patch) -> bool:
    return any(significant(key, known.get(key), value) for key, value in patch.items())


class _Backoff:
    """Exponential back-off between failed attempts, never shorter than a Retry-After."""

    def __init__(self, initial: float, maximum: float, clock: Callable[[], float]) -> None:
        self._initial, self._maximum, self._clock = initial, maximum, clock
        self._failures = 0
        self._until = 0.0

    def ready(self) -> bool:
        return self._clock() >= self._until

    def remaining(self) -> float:
        return max(0.0, self._until - self._clock())

    def failed(self, retry_after: float | None) -> float:
        delay = min(self._maximum, self._initial * 2.0 ** min(self._failures, 30))
        delay = max(delay, min(retry_after or 0.0, self._maximum))
        self._failures += 1
        self._until = self._clock() + delay
        return delay

    def succeeded(self) -> None:
        self._failures = 0
        self._until = 0.0


class KubernetesSink:
    """Node and pod annotations. The connection belongs to the caller, who closes it."""

    name = "kubernetes"

    def __init__(
        self,
        connection: KubeConnection,
        node: str,
        *,
        domain: str = DEFAULT_DOMAIN,
        heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
        conflict_retries: int = 2,
        backoff_initial: float = 5.0,
        backoff_max: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connection = connection
        self.node = node
        self.domain = validate_domain(domain)
        self._heartbeat = heartbeat_seconds
        self._conflict_retries = conflict_retries
        self._clock = clock
        self._backoff = _Backoff(backoff_initial, backoff_max, clock)
        self._owned_node_key = re.compile(
            rf"^{re.escape(domain)}/(gpu-[A-Za-z0-9]+-({JOB_TYPE}|{PERIOD}|{UTIL_MAX}|"
            rf"{MEM_COPY_UTIL_MAX}|{FB_USED_MAX}|{CONFIDENCE}|{REASONS}|"
            rf"{'|'.join(LEGACY_NODE_NAMES)})|{PROFILED_AT})$"
        )
        self._node_known: Annotations | None = None  # our keys as on the server; None: unknown
        self._node_written_at: float | None = None
        self._node_missing = False
        self._pods_known: dict[tuple[str, str, datetime | None], Annotations] = {}
        self._pods_missing: set[tuple[str, str, datetime | None]] = set()

    def publish(self, result: CycleResult) -> None:
        if not self._backoff.ready():
            log.debug("Kubernetes back-off: %.0fs left, not patching", self._backoff.remaining())
            return
        try:
            self._publish_node(result)
            self._publish_pods(result.pods)
        except TRANSPORT_ERRORS as error:
            delay = self._backoff.failed(retry_after_seconds(error))
            raise KubernetesError(
                f"Kubernetes API call failed ({describe(error)}); retrying in {delay:.0f}s"
            ) from None
        self._backoff.succeeded()

    def close(self) -> None:
        """Nothing to release: the caller owns the connection."""

    # -- node --------------------------------------------------------------------------------

    def _publish_node(self, result: CycleResult) -> None:
        desired = node_annotations(result, self.domain)
        if annotation_bytes(desired) > ANNOTATION_BUDGET_BYTES:
            raise KubernetesError(
                f"node annotations would take {annotation_bytes(desired)} bytes, "
                f"over the {ANNOTATION_BUDGET_BYTES}-byte budget"
            )
        stamp_key = f"{self.domain}/{PROFILED_AT}"
        resync_due = (
            self._node_written_at is not None
            and self._clock() - self._node_written_at >= self._heartbeat
        )
        try:
            if self._node_known is None or resync_due:
                # First use, and with each heartbeat: edits made by hand are repaired.
                self._node_known = self._read_node()
            known = self._node_known
            patch = diff(known, desired, [key for key in known if key != stamp_key])
            patch.pop(stamp_key, None)
            due = resync_due or self._node_written_at is None
            if not due and not significant_patch(known, patch):
                return
            patch[stamp_key] = desired[stamp_key]
            self._patch(functools.partial(self._patch_node, patch))
        except TRANSPORT_ERRORS as error:
            if error_status(error) != 404:
                raise
            self._node_known = None
            if not self._node_missing:
                log.warning("node %s not found in the API; check --node / NODE_NAME", self.node)
            self._node_missing = True
            raise KubernetesError(f"node {self.node} not found in the Kubernetes API") from None
        self._node_missing = False
        self._node_known = {
            key: value for key, value in {**known, **patch}.items() if value is not None
        }
        self._node_written_at = self._clock()

    def _read_node(self) -> Annotations:
        node = self._connection.get_json(NODE_PATH, path_params={"name": self.node})
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        return {
            str(key): str(value)
            for key, value in annotations.items()
            if self._owned_node_key.match(str(key))
        }

    def _patch_node(self, patch: Patch) -> None:
        self._send_patch(NODE_PATH, {"name": self.node}, patch)

    # -- pods --------------------------------------------------------------------------------

    def _publish_pods(self, pods: Iterable[PodUsage]) -> None:
        current = set()
        for usage in pods:
            if not usage.gpus:
                continue
            key = (usage.namespace, usage.pod, usage.start_time)
            current.add(key)
            desired = pod_annotations(usage, self.domain)
            # Not yet written by this process: an earlier version's keys may be there.
            legacy = {f"{self.domain}/{name}": "" for name in LEGACY_POD_NAMES}
            known = self._pods_known.get(key, legacy)
            patch = diff(known, desired, known)
            if not significant_patch(known, patch) or key in self._pods_missing:
                continue
            try:
                self._patch(functools.partial(self._patch_pod, usage, patch))
            except TRANSPORT_ERRORS as error:
                if error_status(error) != 404:
                    raise
                log.info("pod %s/%s is gone; not annotating it", usage.namespace, usage.pod)
                self._pods_missing.add(key)
                continue
            self._pods_known[key] = desired
        # Forget pods that left, so memory follows the pods on the node.
        self._pods_known = {key: v for key, v in self._pods_known.items() if key in current}
        self._pods_missing &= current

    def _patch_pod(self, usage: PodUsage, patch: Patch) -> None:
        self._send_patch(POD_PATH, {"namespace": usage.namespace, "name": usage.pod}, patch)

    def _send_patch(self, path: str, path_params: Mapping[str, str], patch: Patch) -> None:
        release(
            self._connection.request(
                "PATCH",
                path,
                path_params=path_params,
                body={"metadata": {"annotations": patch}},
                content_type=STRATEGIC_MERGE_PATCH,
            )
        )

    # -- retries -----------------------------------------------------------------------------

    def _patch(self, call: Callable[[], None]) -> None:
        """Run one PATCH, retrying a 409 Conflict up to ``conflict_retries`` times."""
        for attempt in range(self._conflict_retries + 1):
            try:
                call()
                return
            except TRANSPORT_ERRORS as error:
                if error_status(error) != 409 or attempt == self._conflict_retries:
                    raise
                log.debug("409 Conflict patching annotations; retry %d", attempt + 1)
                time.sleep(0.05 * (attempt + 1))
