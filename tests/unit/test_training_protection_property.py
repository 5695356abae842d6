"""Random pod histories through the training protector, against the stand-in API server (a test
double, see tests/support/apiserver.py), checking the promises of docs/daemon.md:

1. a person's do-not-disrupt is never changed (after every cycle);
2. a pod training on this node for a cycle carries the profiler's protection at its end;
3. no pod carries the profiler's mark at the end of a cycle in which it did not train on
   this node (it stopped, finished, moved away, or was never there).

Events: a pod is created (on this node or another), recreated under the same name (a new UID,
perhaps on the other node), finishes, is deleted; a person sets do-not-disrupt (taking it over:
the documented way is to drop the profiler's marker), also just between the profiler's read of
the pod and its write, or clears it; training starts or stops; the daemon restarts. Cycles see
the pods as a synced watcher does, or, now and then, as the watcher saw them one cycle earlier
(it lags): such a cycle must still never change a person's annotation, and the next up-to-date
cycle must restore 2 and 3.
"""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from profiler_app.kube import KubeConnection, connect
from profiler_app.model import CycleResult, PodInfo
from profiler_app.sinks.kubernetes.protection import TrainingProtector, watched_annotations
from profiler_app.sources.kube_pods import pod_info
from tests.support.apiserver import StandInApiServer, pod_manifest
from tests.support.cycles import AT, gpu_profile

NODE, OTHER_NODE = "node-a", "node-b"
DOMAIN = "ai.centaurus.io"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
MARKER = f"{DOMAIN}/do-not-disrupt"
NAMES = st.sampled_from(["worker-0", "worker-1"])
NODES = st.sampled_from([NODE, NODE, OTHER_NODE])
STARTED = AT - timedelta(hours=2)


class ProtectionHistory(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.apiserver = StandInApiServer()
        self.apiserver.start()
        self.apiserver.add_node(NODE)
        self.apiserver.add_node(OTHER_NODE)
        self._directory = tempfile.TemporaryDirectory()
        kubeconfig = self.apiserver.write_kubeconfig(Path(self._directory.name) / "kubeconfig")
        made = connect(str(kubeconfig), request_timeout=(1.0, 2.0))
        assert made is not None
        self.connection: KubeConnection = made
        self.protector = TrainingProtector(self.connection, NODE, domain=DOMAIN)
        self.training: set[str] = set()
        self.persons: dict[str, str] = {}  # pod name -> the value a person set and owns
        self.previous_view: tuple[PodInfo, ...] | None = None

    def teardown(self) -> None:
        self.connection.close()
        self.apiserver.stop()
        self._directory.cleanup()

    # -- what happens to the pods --------------------------------------------------------------

    def _exists(self, name: str) -> bool:
        return any(pod["metadata"]["name"] == name for pod in self.apiserver.pods())

    @rule(name=NAMES, node=NODES)
    def create(self, name: str, node: str) -> None:
        if not self._exists(name):
            self.apiserver.add_pod(pod_manifest("ml", name, node, gpus=1, start_time=STARTED))

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
        self.protector = TrainingProtector(self.connection, NODE, domain=DOMAIN)

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

    @rule()
    def cycle(self) -> None:
        self.previous_view = self._view()
        self.protector.publish(self._result(self.previous_view))
        self._persons_untouched()
        self._protected_exactly_while_training()

    @precondition(lambda self: self.previous_view is not None)
    @rule()
    def cycle_with_a_lagging_watcher(self) -> None:
        assert self.previous_view is not None
        self.protector.publish(self._result(self.previous_view))
        self._persons_untouched()

    # -- the promises ------------------------------------------------------------------------------

    def _persons_untouched(self) -> None:
        for pod in self.apiserver.pods():
            name, annotations = pod["metadata"]["name"], pod["metadata"]["annotations"]
            if name in self.persons:
                assert annotations.get(DO_NOT_DISRUPT) == self.persons[name], name
                assert MARKER not in annotations, name

    def _protected_exactly_while_training(self) -> None:
        for pod in self.apiserver.pods():
            name, annotations = pod["metadata"]["name"], pod["metadata"]["annotations"]
            trains_here = (
                name in self.training
                and pod["spec"]["nodeName"] == NODE
                and pod["status"]["phase"] == "Running"
            )
            if trains_here and name not in self.persons:
                assert annotations.get(DO_NOT_DISRUPT) == "true", name
                assert annotations.get(MARKER) == "training", name
            if not trains_here:
                assert MARKER not in annotations, name


ProtectionHistory.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestProtectionHistory = ProtectionHistory.TestCase
