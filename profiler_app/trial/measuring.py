"""Measuring a running trial: its throughput by the estimators in order of preference (its
log, a Prometheus query, the GPUs' waveform and activity), and the GPU memory and SM activity
it reached."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from profiler_app.trial import estimators
from profiler_app.trial import status as trial_status
from profiler_app.trial.cluster import ApiError, TrialCluster
from profiler_app.trial.estimators import Measurement
from profiler_app.trial.manifests import Template, gpu_container, pod_specs
from profiler_app.trial.metrics import MetricsUnavailableError, TrialMetrics
from profiler_app.trial.run_state import ActiveTrial


@dataclass(frozen=True)
class Measuring:
    """How throughput can be measured, in the estimators' order of preference."""

    metric: str | None = None  # a Katib-style name=value on stdout
    metric_query: str | None = None  # PromQL, $POD substituted
    step_regex: re.Pattern[str] | None = None
    metrics: TrialMetrics | None = None  # Prometheus, for the query, period, proxy and peaks

    @property
    def reads_logs(self) -> bool:
        return self.metric is not None or self.step_regex is not None

    @property
    def ends_early(self) -> bool:
        """Only per-step samples (estimators 1 and 2) can show stability while running."""
        return self.reads_logs or self.metric_query is not None


class TrialMeasurer:
    """Measures the trials of one run in ``namespace``, after ``warmup_seconds`` of running."""

    def __init__(
        self,
        measuring: Measuring,
        cluster: TrialCluster,
        namespace: str,
        template: Template,
        *,
        warmup_seconds: float,
        clock: Callable[[], float],
    ) -> None:
        self.measuring = measuring
        self.cluster = cluster
        self.namespace = namespace
        self.template = template
        self.warmup_seconds = warmup_seconds
        self.clock = clock

    def measure(self, active: ActiveTrial, final: bool = True) -> None:
        """Measure with the estimators in order of preference (with ``final`` False, only the
        per-step ones, for the early-end test)."""
        if active.running_since is None or not active.pods:
            return
        start = active.running_since + self.warmup_seconds
        end = self.clock()
        if self.measuring.reads_logs:
            self._read_log(active)
        lines = estimators.after(active.lines, start)
        tried: list[Measurement] = []
        if self.measuring.metric is not None:
            _times, values = estimators.katib_samples(lines, self.measuring.metric)
            tried.append(estimators.from_rate_samples(values, self.measuring.metric))
        metrics = self.measuring.metrics
        if self.measuring.metric_query is not None and metrics is not None and end > start:
            try:
                values = metrics.user_rate(self.measuring.metric_query, active.pods, start, end)
                tried.append(estimators.from_rate_samples(values, "metric"))
            except MetricsUnavailableError as error:
                tried.append(estimators.unmeasured(estimators.METRIC, str(error)))
        if self.measuring.step_regex is not None:
            tried.append(
                estimators.from_step_marks(estimators.step_marks(lines, self.measuring.step_regex))
            )
        if final and metrics is not None and end > start:
            tried += self._gpu_estimators(metrics, active, start, end)
        best = next((m for m in tried if m.ok), None)
        active.notes = [f"{m.estimator}: {m.note}" for m in tried if not m.ok and m.note]
        active.measurement = best or (tried[0] if tried else None)

    def peaks(self, active: ActiveTrial, ended: float) -> tuple[float | None, float | None]:
        """The trial's peak GPU memory (MiB) and mean SM activity from its start to ``ended``:
        None without Prometheus, before it ran, or while Prometheus does not answer."""
        peak = sm = None
        metrics = self.measuring.metrics
        if metrics is not None and active.running_since is not None and active.pods:
            try:
                peak = metrics.fb_peak_mib(self.namespace, active.pods, active.running_since, ended)
                values = metrics.sm_active(self.namespace, active.pods, active.running_since, ended)
                sm = float(np.mean(values)) if values.size else None
            except MetricsUnavailableError:
                pass
        return peak, sm

    def _gpu_estimators(
        self, metrics: TrialMetrics, active: ActiveTrial, start: float, end: float
    ) -> list[Measurement]:
        ns, pods = self.namespace, active.pods
        try:
            utilisation = metrics.utilisation(ns, pods, start, end)
            period = estimators.from_waveform(utilisation, metrics.step)
            sm = metrics.sm_active(ns, pods, start, end)
            proxy = estimators.from_sm_activity(sm, active.planned.placement.gpus)
        except MetricsUnavailableError as error:
            return [estimators.unmeasured(estimators.PERIOD, str(error))]
        return [period, proxy]

    def _read_log(self, active: ActiveTrial) -> None:
        pod = trial_status.rank_zero(active.pods)
        spec = next(spec for _, spec in pod_specs(dict(self.template.manifest)))
        container = (gpu_container(spec, self.template.name) or {}).get("name")
        since = None
        if active.last_stamp is not None:
            since = datetime.fromtimestamp(int(active.last_stamp), UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            )
        try:
            text = self.cluster.pod_log(self.namespace, pod, container, since)
        except ApiError:
            return  # not started yet, or gone
        fresh = [
            (t, line)
            for t, line in estimators.parse_log(text)
            if active.last_stamp is None or t > active.last_stamp
        ]
        active.lines.extend(fresh)
        if fresh:
            active.last_stamp = fresh[-1][0]
