"""One ``trial run`` at a time in a namespace: a coordination.k8s.io/v1 Lease.

Two runs in one namespace would share its quota and nodes, so the quota could refuse one run's
trials because of the other's. The run takes the Lease ``gpu-profiler-trial-run`` of the trial
namespace before anything else (``holderIdentity`` its run id), renews it while it runs and
deletes it at the end. Another run finds it held and stops with one line naming the holder. A
Lease its holder stopped renewing (killed, cut off) for ``leaseDurationSeconds`` is taken over,
with the resourceVersion it was read at, so that of two runs taking it over at once one gets
409 Conflict.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from profiler_app.trial.cluster import ApiError, TrialCluster
from profiler_app.trial.guards import GuardError
from profiler_app.trial.manifests import MANAGED_BY
from profiler_app.trial.status import rfc3339

Json = dict[str, Any]
LEASE_NAME = "gpu-profiler-trial-run"
LEASE_SECONDS = 300


def _micro_time(seconds: float) -> str:
    """A MicroTime as the API server writes it."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NamespaceLock:
    def __init__(
        self, cluster: TrialCluster, namespace: str, run_id: str, clock: Callable[[], float]
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.run_id = run_id
        self.clock = clock
        self.lease: Json | None = None
        self._renewed = 0.0

    def _manifest(self, base: Json | None = None) -> Json:
        now = self.clock()
        lease = dict(base or {})
        lease.update(apiVersion="coordination.k8s.io/v1", kind="Lease")
        metadata = dict(lease.get("metadata") or {})
        metadata.update(name=LEASE_NAME, labels=dict([MANAGED_BY]))
        lease["metadata"] = metadata
        lease["spec"] = {
            "holderIdentity": self.run_id,
            "leaseDurationSeconds": LEASE_SECONDS,
            "acquireTime": _micro_time(now),
            "renewTime": _micro_time(now),
        }
        return lease

    def acquire(self) -> None:
        """Take the Lease, or raise GuardError naming the run that holds it."""
        try:
            self.lease = self.cluster.create("Lease", self.namespace, self._manifest())
        except ApiError as error:
            if error.status != 409:
                raise
            self._take_over()
        self._renewed = self.clock()

    def _take_over(self) -> None:
        found = self.cluster.get("Lease", self.namespace, LEASE_NAME)
        if found is None:  # released meanwhile
            self.lease = self.cluster.create("Lease", self.namespace, self._manifest())
            return
        spec = found.get("spec") or {}
        renewed = rfc3339(spec.get("renewTime")) or 0.0
        duration = float(spec.get("leaseDurationSeconds") or LEASE_SECONDS)
        age = self.clock() - renewed
        if age < duration:
            raise GuardError(
                f"namespace {self.namespace} is in use by trial run {spec.get('holderIdentity')} "
                f"(Lease {LEASE_NAME}, renewed {age:.0f} s ago): wait for it to end, or give "
                "another --namespace"
            )
        try:
            self.lease = self.cluster.update("Lease", self.namespace, self._manifest(found))
        except ApiError as error:
            if error.status == 409:
                raise GuardError(
                    f"namespace {self.namespace}: another trial run took the expired Lease "
                    f"{LEASE_NAME} at the same moment"
                ) from None
            raise

    def renew(self) -> None:
        """Renew once a third of the duration has passed (the caller ignores outages)."""
        if self.lease is None or self.clock() - self._renewed < LEASE_SECONDS / 3:
            return
        renewed = dict(self.lease)
        renewed["spec"] = {**(self.lease.get("spec") or {}), "renewTime": _micro_time(self.clock())}
        self.lease = self.cluster.update("Lease", self.namespace, renewed)
        self._renewed = self.clock()

    def release(self) -> None:
        if self.lease is not None:
            self.cluster.delete("Lease", self.namespace, LEASE_NAME)
            self.lease = None
