"""Random pod histories through the training protector, against the stand-in API server (a test
double, see tests/support/apiserver/), checking the promises of docs/daemon.md:

1. a person's do-not-disrupt is never changed (after every cycle);
2. a pod training on this node for a cycle carries the profiler's protection at its end;
3. no pod carries the profiler's mark at the end of a cycle in which it did not train on
   this node (it stopped, finished, moved away, or was never there).

Events: a pod is created (on this node or another, requesting any of the GPU resources: whole,
time-sliced, MIG, time-sliced MIG; some by a training workload, so protected by their owner
before the classifier has judged them), recreated under the same name (a new UID, perhaps on the
other node), finishes, is deleted; a person sets do-not-disrupt (taking it over: the documented
way is to drop the profiler's marker), also just between the profiler's read of the pod and its
write, or clears it; training starts or stops; the daemon restarts; one pod's requests fail (a
fail-closed webhook answering 500, a 503 or 429, a read that times out) until it recovers; the
metrics source fails for a cycle. Cycles see the pods as a synced watcher does, or, now and then,
as the watcher saw them one cycle earlier (it lags): such a cycle must still never change a
person's annotation, and the next up-to-date cycle must restore 2 and 3. 2 and 3 hold for every
pod that does not fail itself; a cycle without metrics keeps the profiler's marks, protects by
owner and releases finished pods.
"""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from profiler_app.core.kube import KubeConnection, connect
from profiler_app.core.model import CycleResult, PodInfo
from profiler_app.sinks.kubernetes.protection import (
    PodsUnprotectedError,
    TrainingProtector,
    watched_annotations,
)
from profiler_app.sources.kube_pods import pod_info
from tests.support.apiserver.objects import pod_manifest, webhook_down
from tests.support.apiserver.server import StandInApiServer
from tests.support.cycles import AT, gpu_profile

NODE, OTHER_NODE = "node-a", "node-b"
DOMAIN = "ai.centaurus.io"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
MARKER = f"{DOMAIN}/do-not-disrupt"
NAMES = st.sampled_from(["worker-0", "worker-1"])
NODES = st.sampled_from([NODE, NODE, OTHER_NODE])
RESOURCES = st.sampled_from(
    [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-3g.40gb",
        "nvidia.com/mig-1g.10gb.shared",
    ]
)
STARTED = AT - timedelta(hours=2)
INTERVAL = 30.0
PATH = "/api/v1/namespaces/ml/pods/{}"


class ProtectionHistory(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.apiserver = StandInApiServer()
        self.apiserver.start()
        self.apiserver.add_node(NODE)
        self.apiserver.add_node(OTHER_NODE)
        self._directory = tempfile.TemporaryDirectory()
        kubeconfig = self.apiserver.write_kubeconfig(Path(self._directory.name) / "kubeconfig")
        made = connect(str(kubeconfig), request_timeout=(1.0, 0.3))  # a hung read: 0.3 s
        assert made is not None
        self.connection: KubeConnection = made
        self.now = 0.0  # the protector's clock: a cycle every INTERVAL
        self.protector = self._protector()
        self.training: set[str] = set()
        self.persons: dict[str, str] = {}  # pod name -> the value a person set and owns
        self.previous_view: tuple[PodInfo, ...] | None = None
        self.failing: set[str] = set()  # pods whose own requests failed: no promise for them

    def _protector(self) -> TrainingProtector:
        return TrainingProtector(
            self.connection, NODE, domain=DOMAIN, interval_seconds=INTERVAL, clock=lambda: self.now
        )

    def teardown(self) -> None:
        self.connection.close()
        self.apiserver.stop()
        self._directory.cleanup()

    # -- what happens to the pods --------------------------------------------------------------

    def _exists(self, name: str) -> bool:
        return any(pod["metadata"]["name"] == name for pod in self.apiserver.pods())

    @rule(name=NAMES, node=NODES, resource=RESOURCES)
    def create(self, name: str, node: str, resource: str) -> None:
        if not self._exists(name):
            self.apiserver.add_pod(
                pod_manifest("ml", name, node, gpus=1, gpu_resource=resource, start_time=STARTED)
            )

    @rule(name=NAMES, node=NODES, resource=RESOURCES)
    def training_job_starts_a_pod(self, name: str, node: str, resource: str) -> None:
        """A PyTorchJob's pod that has just started: protected by its owner until judged."""
        if not self._exists(name):
            manifest = pod_manifest(
                "ml",
                name,
                node,
                gpus=1,
                gpu_resource=resource,
                start_time=AT,
                owner=("PyTorchJob", "llama"),
            )
            self.apiserver.add_pod(manifest)

    @rule(name=NAMES, node=NODES)
    def recreate_under_the_same_name(self, name: str, node: str) -> None:
        if self._exists(name):
            self.apiserver.recreate_pod(pod_manifest("ml", name, node, gpus=1, start_time=AT))
            self.persons.pop(name, None)

    @rule(name=NAMES)
    def delete(self, name: str) -> None:
        if self._exists(name):
            self.apiserver.delete_pod("ml", name)
            self.persons.pop(name, None)

    @rule(name=NAMES)
    def finish(self, name: str) -> None:
        if self._exists(name):
            self.apiserver.update_pod(
                "ml", name, lambda pod: pod["status"].update(phase="Succeeded")
            )

    @rule(name=NAMES, value=st.sampled_from(["true", "false"]))
    def person_sets_do_not_disrupt(self, name: str, value: str) -> None:
        if not self._exists(name):
            return

        def take_over(pod: dict[str, dict[str, dict[str, str]]]) -> None:
            pod["metadata"]["annotations"][DO_NOT_DISRUPT] = value
            pod["metadata"]["annotations"].pop(MARKER, None)

        self.apiserver.update_pod("ml", name, take_over)  # type: ignore[arg-type]
        self.persons[name] = value

    @rule(name=NAMES, value=st.sampled_from(["true", "false"]))
    def person_sets_it_while_the_profiler_writes(self, name: str, value: str) -> None:
        """The person's change lands between the profiler's read of the pod and its PATCH."""
        self.apiserver.clear_faults()
        self.apiserver.before(
            "PATCH",
            f"/api/v1/namespaces/ml/pods/{name}",
            lambda: self.person_sets_do_not_disrupt(name, value),
        )

    @rule(name=NAMES)
    def person_clears_do_not_disrupt(self, name: str) -> None:
        if self._exists(name):
            self.apiserver.update_pod(
                "ml", name, lambda pod: pod["metadata"]["annotations"].pop(DO_NOT_DISRUPT, None)
            )
            self.persons.pop(name, None)

    @rule(name=NAMES)
    def training_starts(self, name: str) -> None:
        self.training.add(name)

    @rule(name=NAMES)
    def training_stops(self, name: str) -> None:
        self.training.discard(name)

    @rule()
    def daemon_restarts(self) -> None:
        self.protector = self._protector()

    @rule(name=NAMES, status=st.sampled_from([500, 503, 429]))
    def pods_writes_fail(self, name: str, status: int) -> None:
        """A fail-closed webhook for this pod's writes is down (or the server sheds them)."""
        cause = webhook_down("guard.example.com", "guard.ml.svc")
        self.apiserver.fail("PATCH", PATH.format(name), status, cause=cause)
        self.failing.add(name)

    @rule(name=NAMES)
    def pods_read_times_out(self, name: str) -> None:
        self.apiserver.hang("GET", PATH.format(name), seconds=0.5, times=1)
        self.failing.add(name)

    @rule()
    def failures_end(self) -> None:
        """The faults are gone and every pod's back-off (10 intervals at most) is over."""
        self.apiserver.clear_faults()
        self.now += 10 * INTERVAL
        self.failing.clear()

    # -- cycles ----------------------------------------------------------------------------------

    def _view(self) -> tuple[PodInfo, ...]:
        keys = watched_annotations(DOMAIN)
        return tuple(pod_info(pod, keys) for pod in self.apiserver.pods(NODE))

    def _result(self, view: tuple[PodInfo, ...]) -> CycleResult:
        # The GPUs' last samples name the training pods wherever they are now, and every pod
        # the view lists idles on a GPU of its own otherwise.
        names = sorted(self.training | {pod.name for pod in view})
        gpus = [
            gpu_profile(str(i), "training" if n in self.training else "idle", namespace="ml", pod=n)
            for i, n in enumerate(names)
        ]
        return CycleResult(NODE, AT, 1800.0, gpus, node_pods=view)

    def _publish(self, result: CycleResult) -> None:
        self.now += INTERVAL
        failing: set[str] = set()
        try:
            self.protector.publish(result)
        except PodsUnprotectedError as error:
            failing = {pod.removeprefix("ml/") for pod in error.failing}
        assert failing <= self.failing  # only the pods that fail themselves

    @rule()
    def cycle(self) -> None:
        self.previous_view = self._view()
        self._publish(self._result(self.previous_view))
        self._persons_untouched()
        self._protected_exactly_while_training()

    @precondition(lambda self: self.previous_view is not None)
    @rule()
    def cycle_with_a_lagging_watcher(self) -> None:
        assert self.previous_view is not None
        self._publish(self._result(self.previous_view))
        self._persons_untouched()

    @rule()
    def cycle_while_the_metrics_source_fails(self) -> None:
        """No GPU series: the marks stay, owners protect, finished pods are released."""
        self.previous_view = self._view()
        before = {pod.name: dict(pod.annotations) for pod in self.previous_view}
        blind = CycleResult(NODE, AT, 1800.0, [], node_pods=self.previous_view, gpus_read=False)
        self._publish(blind)
        self._persons_untouched()
        for pod in self.apiserver.pods(NODE):
            name, annotations = pod["metadata"]["name"], pod["metadata"]["annotations"]
            if name in self.persons or name in self.failing:
                continue
            kept = (
                before.get(name, {}).get(MARKER)
                if before.get(name, {}).get(DO_NOT_DISRUPT) == "true"
                else None
            )
            wanted = kept or ("owner" if self._owner_protected(pod) else None)
            if pod["status"]["phase"] != "Running":
                wanted = None
            assert annotations.get(MARKER) == wanted, name
            if wanted is not None:
                assert annotations.get(DO_NOT_DISRUPT) == "true", name

    # -- the promises ------------------------------------------------------------------------------

    def _persons_untouched(self) -> None:
        for pod in self.apiserver.pods():
            name, annotations = pod["metadata"]["name"], pod["metadata"]["annotations"]
            if name in self.persons:
                assert annotations.get(DO_NOT_DISRUPT) == self.persons[name], name
                assert MARKER not in annotations, name

    @staticmethod
    def _owner_protected(pod: dict[str, dict[str, object]]) -> bool:
        """Started by a training workload and not yet judged over a whole window."""
        return bool(pod["metadata"].get("ownerReferences")) and pod["status"]["startTime"] == (
            AT.strftime("%Y-%m-%dT%H:%M:%SZ")
        )

    def _protected_exactly_while_training(self) -> None:
        for pod in self.apiserver.pods():
            name, annotations = pod["metadata"]["name"], pod["metadata"]["annotations"]
            if name in self.failing:
                continue  # it fails itself: promises hold for the others
            here_and_running = (
                pod["spec"]["nodeName"] == NODE and pod["status"]["phase"] == "Running"
            )
            wanted = None
            if here_and_running and name in self.training:
                wanted = "training"
            elif here_and_running and self._owner_protected(pod):
                wanted = "owner"
            if wanted is not None and name not in self.persons:
                assert annotations.get(DO_NOT_DISRUPT) == "true", name
                assert annotations.get(MARKER) == wanted, name
            if wanted is None:
                assert MARKER not in annotations, name


ProtectionHistory.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestProtectionHistory = ProtectionHistory.TestCase


def test_known_histories() -> None:
    """Histories the random search reaches only now and then, replayed every run: the pod after
    one whose writes fail is protected in the same cycle; a cycle without metrics keeps marks,
    protects by owner, releases a finished pod; a pod on a MIG device is protected."""
    machine = ProtectionHistory()
    try:
        machine.create("worker-0", NODE, "nvidia.com/gpu")
        machine.create("worker-1", NODE, "nvidia.com/gpu.shared")
        machine.pods_writes_fail("worker-0", 500)
        machine.training_starts("worker-0")
        machine.training_starts("worker-1")
        machine.cycle()
        machine.failures_end()
        machine.cycle()
        machine.training_stops("worker-0")  # unseen: the metrics source fails from now
        machine.delete("worker-1")
        machine.training_job_starts_a_pod("worker-1", NODE, "nvidia.com/mig-3g.40gb")
        machine.cycle_while_the_metrics_source_fails()
        machine.finish("worker-0")
        machine.cycle_while_the_metrics_source_fails()
        machine.cycle()
    finally:
        machine.teardown()
