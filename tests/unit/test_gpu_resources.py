"""Which resources are GPUs (profiler_app/core/gpu_resources.py), and ``--gpu-resource``.

The names are NVIDIA/k8s-device-plugin v0.20.0's: ``nvidia.com/gpu``
(internal/rm/rm.go ``AddDefaultResourcesToConfig``: ``AddGPUResource("*", "gpu")``), MIG
devices under the mixed strategy as ``nvidia.com/mig-<profile>`` with "+" as "."
(same function), and replicas renamed by default with the ``.shared`` suffix
(api/config/v1/consts.go ``DefaultSharedResourceNameSuffix``)."""

from __future__ import annotations

import pytest

from profiler_app.cli import main
from profiler_app.commands.run import RunConfig
from profiler_app.core.errors import UserError
from profiler_app.core.gpu_resources import DEFAULT_GPU_RESOURCES, parse_gpu_resources
from profiler_app.profiles.pods import pod_usage
from profiler_app.sources.kube_pods import pod_info
from profiler_app.trial.manifests import load_template
from tests.support.apiserver.objects import pod_manifest
from tests.unit.test_run_cli import parse


@pytest.mark.parametrize(
    ("name", "is_gpu"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/gpu.shared", True),
        ("nvidia.com/mig-3g.40gb", True),
        ("nvidia.com/mig-1g.10gb.me", True),  # 1g.10gb+me
        ("nvidia.com/mig-1g.10gb.shared", True),
        ("nvidia.com/mig-", False),
        ("nvidia.com/gpu-fast", False),
        ("nvidia.com/gpus", False),
        ("amd.com/gpu", False),
        ("cpu", False),
    ],
)
def test_the_device_plugins_names(name: str, is_gpu: bool) -> None:
    assert (name in DEFAULT_GPU_RESOURCES) is is_gpu


def test_every_gpu_resource_counts_in_a_pods_requests() -> None:
    manifest = pod_manifest("ml", "mixed", "node-a", gpus=2, gpu_resource="nvidia.com/mig-3g.40gb")
    manifest["spec"]["containers"].append(
        {
            "name": "side",
            "resources": {
                "limits": {"nvidia.com/gpu.shared": "1", "cpu": "4"},
                "requests": {"nvidia.com/gpu.shared": "1"},
            },
        }
    )
    info = pod_info(manifest)
    assert (info.gpu_requests, info.gpu_limits, info.uses_gpus) == (3, 3, True)
    renamed = pod_manifest("ml", "r", "node-a", gpus=1, gpu_resource="example.com/fast-gpu")
    assert pod_info(renamed).uses_gpus is False
    assert pod_info(renamed, gpus=parse_gpu_resources("example.com/fast-gpu")).gpu_requests == 1


def test_renamed_resources_come_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = RunConfig.from_args(parse("--gpu-resource", "example.com/a, example.com/b"))
    assert config.gpu_resources.declared == {"example.com/a", "example.com/b"}
    assert "gpu-resource=example.com/a gpu-resource=example.com/b" in config.describe()
    monkeypatch.setenv("GPU_PROFILER_GPU_RESOURCES", "example.com/c")
    assert "example.com/c" in RunConfig.from_args(parse()).gpu_resources
    assert RunConfig.from_args(parse()).gpu_resources.count({"nvidia.com/gpu": "1"}) == 1


@pytest.mark.parametrize(
    ("argv", "environment", "message"),
    [
        (["--gpu-resource", "fast gpu"], None, "--gpu-resource 'fast gpu' is not a resource name"),
        ([], "nvidia.com/", "GPU_PROFILER_GPU_RESOURCES 'nvidia.com/' is not a resource name"),
    ],
)
def test_a_bad_resource_name_is_one_error_line(
    argv: list[str],
    environment: str | None,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if environment is not None:
        monkeypatch.setenv("GPU_PROFILER_GPU_RESOURCES", environment)
    assert main(["run", "--once", "--store-url", "none", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu-profiler: error: {message}")
    assert "Traceback" not in err


@pytest.mark.parametrize("resource", ["nvidia.com/mig-3g.40gb", "nvidia.com/gpu.shared"])
def test_a_trial_template_on_mig_or_shared_gpus_is_refused_by_name(resource: str) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        pod_manifest("ml", "p", "n", gpus=1, gpu_resource=resource)["spec"][
                            "containers"
                        ][0]
                    ]
                }
            }
        },
    }
    with pytest.raises(UserError, match=rf"requests {resource}, not nvidia.com/gpu"):
        load_template(job, "job.yaml")


@pytest.mark.parametrize("resource", ["nvidia.com/mig-3g.40gb", "nvidia.com/gpu.shared"])
def test_a_pod_holding_a_mig_device_or_a_shared_gpu_is_reported_while_it_runs(
    resource: str,
) -> None:
    """Allocated, on no GPU's series yet: reported as holding GPUs all the same (pods.pod_usage,
    which the store and ``report`` read)."""
    holder = pod_info(pod_manifest("ml", "holder", "node-a", gpus=1, gpu_resource=resource))
    cpu_only = pod_info(pod_manifest("ml", "web", "node-a"))
    usage = pod_usage([], [holder, cpu_only], {}, "node-a", listed_only=True)
    assert [row.pod for row in usage] == ["holder"]
