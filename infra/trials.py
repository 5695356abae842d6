"""GpuTrialRunner (optional): what ``gpu-profiler trial run`` needs to run in the cluster as a
one-shot Job, with nothing more than it needs.

- The trial namespace, its ResourceQuota on ``requests.nvidia.com/gpu`` and on object counts,
  and the low PriorityClass with ``preemptionPolicy: Never``: made here, by someone allowed to,
  so the runner's ServiceAccount needs no cluster-wide right but reading that one class (the
  runner reads the quota and the class and finds them in place).
- A ServiceAccount and a Role limited to that namespace: Jobs and PyTorchJobs create, get, list,
  delete; pods get, list, watch, delete (a trial's pods are deleted with its short grace
  period); pods/log get; ConfigMaps (each run's anchor) create, get, list, delete;
  ResourceQuotas get; Leases (one run at a time) create, get, update, delete; Events list
  (a quota refusing a trial's pods). One cluster-wide
  right, narrowed to one object: get on the PriorityClass ``gpu-profiler-trial`` (the runner
  refuses to run when it cannot check that class). The profiler DaemonSet's own ClusterRole
  does not change.
- A ValidatingAdmissionPolicy (``infra/admission.py``): the runner creates and deletes only
  objects labelled as its own (pods included), writes no Lease but its run lock, and no trial pod
  runs as the runner's ServiceAccount.

docs/trial.md has the Job that runs ``trial run`` with this ServiceAccount.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra.admission import MANAGED_BY_LABEL, admission_objects, trial_policy
from infra.platform import namespace_name
from profiler_app.trial.lock import LEASE_NAME

TRIAL_NAMESPACE = "gpu-profiler-trials"  # gpu-profiler trial's default --namespace
TRIAL_ACCOUNT = "gpu-profiler-trial"
PRIORITY_CLASS = "gpu-profiler-trial"  # gpu-profiler trial's PriorityClass
PRIORITY_VALUE = -100  # below the default 0 of production pods
QUOTA_NAME = "gpu-profiler-trials"  # the runner reads its GPU limit by this name
LABELS = {MANAGED_BY_LABEL: "gpu-profiler-trial"}  # also on every object the runner makes

# (API group, resources, verbs): everything the runner does in the trial namespace.
ROLE_RULES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("batch", ("jobs",), ("create", "get", "list", "delete")),
    ("kubeflow.org", ("pytorchjobs",), ("create", "get", "list", "delete")),
    ("", ("pods",), ("get", "list", "watch", "delete")),
    ("", ("pods/log",), ("get",)),
    ("", ("configmaps",), ("create", "get", "list", "delete")),
    ("", ("resourcequotas",), ("get",)),
    ("coordination.k8s.io", ("leases",), ("create", "get", "update", "delete")),  # one run a time
    ("", ("events",), ("list",)),  # a controller's FailedCreate: the quota refused a trial's pods
)


@dataclass(frozen=True)
class GpuTrialRunnerArgs:
    namespace: str = TRIAL_NAMESPACE
    max_gpus: int = 8  # GPUs all trials of the namespace may request at once
    max_trials: int = 4  # trial objects at once (Jobs and PyTorchJobs, each)
    # Trials run user images; baseline keeps them off the host (no hostPath, hostNetwork,
    # privileged) while allowing what training images usually do.
    pod_security: str = "baseline"

    def __post_init__(self) -> None:
        if self.max_gpus < 1 or self.max_trials < 1:
            raise ValueError("trialRunner maxGpus and maxTrials must be at least 1")


def quota_hard(args: GpuTrialRunnerArgs) -> dict[str, str]:
    trials = str(args.max_trials)
    return {
        "requests.nvidia.com/gpu": str(args.max_gpus),
        # "pods" counts pods that have not ended; "count/pods" would count finished ones too.
        "pods": str(args.max_gpus),  # every trial pod requests a GPU
        "count/jobs.batch": trials,
        "count/pytorchjobs.kubeflow.org": trials,
        "count/configmaps": "16",  # the runs' anchors and kube-root-ca.crt
    }


class GpuTrialRunner(pulumi.ComponentResource):
    """The trial namespace with its guards, and the runner's ServiceAccount and Role."""

    namespace: pulumi.Output[str]
    service_account: pulumi.Output[str]

    def __init__(
        self, name: str, args: GpuTrialRunnerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpu-cluster:index:GpuTrialRunner", name, None, opts)
        ns = k8s.core.v1.Namespace(
            "trial-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=args.namespace,
                labels={**LABELS, "pod-security.kubernetes.io/enforce": args.pod_security},
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        namespace = namespace_name(ns)
        child = pulumi.ResourceOptions(parent=self, depends_on=[ns])

        def meta(object_name: str) -> k8s.meta.v1.ObjectMetaArgs:
            return k8s.meta.v1.ObjectMetaArgs(name=object_name, namespace=namespace, labels=LABELS)

        k8s.core.v1.ResourceQuota(
            "trial-quota",
            metadata=meta(QUOTA_NAME),
            spec=k8s.core.v1.ResourceQuotaSpecArgs(hard=quota_hard(args)),
            opts=child,
        )
        k8s.scheduling.v1.PriorityClass(
            "trial-priority-class",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=PRIORITY_CLASS, labels=LABELS),
            value=PRIORITY_VALUE,
            preemption_policy="Never",
            global_default=False,
            description="gpu-profiler trials: below production, never preempting",
            opts=pulumi.ResourceOptions(parent=self),
        )
        account = k8s.core.v1.ServiceAccount(
            "trial-service-account", metadata=meta(TRIAL_ACCOUNT), opts=child
        )
        role = k8s.rbac.v1.Role(
            "trial-role",
            metadata=meta(TRIAL_ACCOUNT),
            rules=[
                k8s.rbac.v1.PolicyRuleArgs(
                    api_groups=[group], resources=list(resources), verbs=list(verbs)
                )
                for group, resources, verbs in ROLE_RULES
            ],
            opts=child,
        )
        k8s.rbac.v1.RoleBinding(
            "trial-role-binding",
            metadata=meta(TRIAL_ACCOUNT),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind="Role", name=TRIAL_ACCOUNT
            ),
            subjects=[
                k8s.rbac.v1.SubjectArgs(
                    kind="ServiceAccount", name=TRIAL_ACCOUNT, namespace=namespace
                )
            ],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[ns, role, account]),
        )
        reader = k8s.rbac.v1.ClusterRole(
            "trial-priority-class-reader",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{TRIAL_ACCOUNT}-priority", labels=LABELS),
            rules=[
                k8s.rbac.v1.PolicyRuleArgs(
                    api_groups=["scheduling.k8s.io"],
                    resources=["priorityclasses"],
                    resource_names=[PRIORITY_CLASS],
                    verbs=["get"],
                )
            ],
            opts=pulumi.ResourceOptions(parent=self),
        )
        k8s.rbac.v1.ClusterRoleBinding(
            "trial-priority-class-reader-binding",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{TRIAL_ACCOUNT}-priority", labels=LABELS),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io",
                kind="ClusterRole",
                name=f"{TRIAL_ACCOUNT}-priority",
            ),
            subjects=[
                k8s.rbac.v1.SubjectArgs(
                    kind="ServiceAccount", name=TRIAL_ACCOUNT, namespace=namespace
                )
            ],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[reader, account]),
        )
        admission_objects(
            trial_policy(args.namespace, TRIAL_ACCOUNT, LABELS[MANAGED_BY_LABEL], LEASE_NAME),
            LABELS,
            pulumi.ResourceOptions(parent=self),
        )
        self.namespace = namespace
        self.service_account = pulumi.Output.from_input(TRIAL_ACCOUNT)
        self.register_outputs(
            {"namespace": self.namespace, "service_account": self.service_account}
        )
