"""Engine and framework identity (profiler_app.profiles.engines, profiler_app.sources.processes).

The pod cases are real images as their projects publish them, with the commands their own
documentation shows (vLLM's and SGLang's Kubernetes guides, TGI's quick tour, KServe's runtime
definitions, KubeRay's samples, the NeMo and TensorRT-LLM containers on NGC, ...). The process
cases run on a stand-in /proc tree (command lines, parents, mapped libraries) written to a
temporary directory, as local mode reads them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler_app.core.model import GPU_UTIL, Prior
from profiler_app.profiles.build import build_profiles
from profiler_app.profiles.engines import (
    ENGINE_NAMES,
    FRAMEWORK_NAMES,
    ContainerSpec,
    Identity,
    identify_container,
    identify_pod,
    identify_process,
    identity_of,
)
from profiler_app.sources.kube_pods import pod_info
from profiler_app.sources.nvml import NvmlSource
from profiler_app.sources.processes import process_identity
from tests.support.nvml import Clock, FakeGpu, FakeNvml

SH = ("/bin/sh", "-c")
# (image, command, args, engine, framework)
CONTAINERS: list[tuple[str, tuple[str, ...], tuple[str, ...], str | None, str | None]] = [
    # Serving engines.
    (
        "vllm/vllm-openai:latest",
        SH,
        ("vllm serve meta-llama/Llama-3.2-1B-Instruct",),
        "vllm",
        "pytorch",
    ),
    (
        "vllm/vllm-openai:v0.6.3",
        (),
        ("--model", "mistralai/Mistral-7B-Instruct-v0.3"),
        "vllm",
        "pytorch",
    ),
    (
        "registry.example.com/llm/server:3",
        ("python3", "-m", "vllm.entrypoints.openai.api_server"),
        ("--model", "facebook/opt-125m", "--tensor-parallel-size", "2"),
        "vllm",
        "pytorch",
    ),
    (
        "ghcr.io/huggingface/text-generation-inference:2.4.0",
        (),
        ("--model-id", "teknium/OpenHermes-2.5-Mistral-7B", "--num-shard", "2"),
        "tgi",
        "pytorch",
    ),
    (
        "registry.example.com/tgi-custom:1",
        SH,
        ('export MODEL_ID="$HF_MODEL_ID" && text-generation-launcher --port 8080',),
        "tgi",
        "pytorch",
    ),
    (
        "lmsysorg/sglang:latest",
        ("python3", "-m", "sglang.launch_server"),
        ("--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0"),
        "sglang",
        "pytorch",
    ),
    (
        "nvcr.io/nvidia/tritonserver:24.08-py3",
        ("tritonserver",),
        ("--model-repository=/models",),
        "triton",
        None,
    ),
    ("nvcr.io/nvidia/tritonserver:24.02-trtllm-python-py3", (), (), "tensorrt-llm", "tensorrt"),
    (
        "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc6",
        ("trtllm-serve",),
        ("meta-llama/Llama-3.1-8B-Instruct",),
        "tensorrt-llm",
        "tensorrt",
    ),
    ("nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8", (), (), "nim", None),
    (
        "kserve/huggingfaceserver:v0.14.0",
        (),
        ("--model_name=llama3", "--model_id=meta-llama/meta-llama-3-8b-instruct"),
        "kserve",
        None,
    ),
    ("pytorch/torchserve-kfs:0.9.0-gpu", (), (), "torchserve", "pytorch"),
    ("tensorflow/serving:2.17.0-gpu", (), (), "tf-serving", "tensorflow"),
    ("ollama/ollama:latest", (), (), "ollama", "ggml"),
    (
        "ghcr.io/ggml-org/llama.cpp:server-cuda",
        (),
        ("-m", "/models/model.gguf", "--n-gpu-layers", "99"),
        "llama.cpp",
        "ggml",
    ),
    # A RayService's pods: the head runs `ray start`, a Serve app is deployed with `serve run`.
    ("rayproject/ray-ml:2.7.0", SH, ("ray start --head --dashboard-host=0.0.0.0",), "ray", None),
    (
        "rayproject/ray:2.9.0-gpu",
        ("serve", "run", "mobilenet.mobilenet:app"),
        (),
        "ray-serve",
        None,
    ),
    # Training launchers and frameworks.
    (
        "nvcr.io/nvidia/pytorch:24.08-py3",
        ("torchrun",),
        ("--nproc-per-node=8", "--nnodes=2", "train.py"),
        "torchrun",
        "pytorch",
    ),
    (
        "docker.io/kubeflowkatib/pytorch-mnist:v1beta1-45c5727",
        ("python3", "-m", "torch.distributed.run"),
        ("--nproc_per_node=4", "/opt/pytorch-mnist/mnist.py"),
        "torchrun",
        "pytorch",
    ),
    (
        "deepspeed/deepspeed:v072_torch112_cu117",
        ("deepspeed",),
        ("--num_gpus=8", "train.py", "--deepspeed", "ds_config.json"),
        "deepspeed",
        "pytorch",
    ),
    (
        "huggingface/transformers-pytorch-gpu:4.41.3",
        ("python", "run_clm.py"),
        ("--model_name_or_path", "gpt2", "--deepspeed=ds_zero3.json"),
        "deepspeed",
        "pytorch",
    ),
    (
        "huggingface/transformers-pytorch-gpu:4.41.3",
        ("accelerate", "launch"),
        ("--multi_gpu", "--num_processes", "8", "train.py"),
        "accelerate",
        "pytorch",
    ),
    (
        "nvcr.io/nvidia/pytorch:24.01-py3",
        ("python", "pretrain_gpt.py"),
        ("--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4"),
        "megatron",
        "pytorch",
    ),
    (
        "nvcr.io/nvidia/nemo:24.07",
        ("python", "/opt/NeMo/examples/nlp/language_modeling/megatron_gpt_pretraining.py"),
        ("trainer.devices=8",),
        "nemo",
        "pytorch",
    ),
    ("nvcr.io/nvidia/nemo:24.01.framework", (), (), "nemo", "pytorch"),
    (
        "horovod/horovod:0.28.1",
        ("horovodrun",),
        ("-np", "4", "-H", "localhost:4", "python", "keras_mnist_advanced.py"),
        "horovod",
        None,
    ),
    (
        "pytorchlightning/pytorch_lightning:base-cuda-py3.10-torch2.1-cuda12.1.0",
        ("fabric", "run"),
        ("--devices=8", "train.py"),
        "lightning",
        "pytorch",
    ),
    (
        "ghcr.io/nvidia/jax:maxtext",
        ("python3", "-m", "MaxText.train"),
        ("MaxText/configs/base.yml", "run_name=r1"),
        "maxtext",
        "jax",
    ),
    # A framework alone: no engine, no role.
    ("nvcr.io/nvidia/jax:24.04-py3", ("python", "train.py"), (), None, "jax"),
    ("tensorflow/tensorflow:2.17.0-gpu", ("python", "mnist.py"), (), None, "tensorflow"),
    # Arguments that merely mention an engine do not name it.
    (
        "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
        ("python", "finetune.py"),
        ("--output-dir", "/models/vllm-ready", "--hub-model", "my-sglang-test"),
        None,
        "pytorch",
    ),
    ("busybox:1.36", ("sleep", "infinity"), (), None, None),
]


@pytest.mark.parametrize(
    ("image", "command", "args", "engine", "framework"),
    CONTAINERS,
    ids=[f"{case[0]}|{' '.join(case[1][:2])}" for case in CONTAINERS],
)
def test_a_container_names_its_engine_and_framework(
    image: str,
    command: tuple[str, ...],
    args: tuple[str, ...],
    engine: str | None,
    framework: str | None,
) -> None:
    found = identify_container(ContainerSpec(image, command, args, gpus=1)) or Identity()
    assert (found.engine, found.framework) == (engine, framework)
    assert found.engine is None or found.engine in ENGINE_NAMES
    assert found.framework is None or found.framework in FRAMEWORK_NAMES


def test_the_table_covers_at_least_twenty_real_images_and_every_issue_engine() -> None:
    named = {case[3] for case in CONTAINERS} - {None}
    assert len({case[0] for case in CONTAINERS}) >= 20
    assert {
        "vllm",
        "tgi",
        "sglang",
        "triton",
        "tensorrt-llm",
        "ray-serve",
        "kserve",
        "ollama",
        "llama.cpp",
        "torchrun",
        "deepspeed",
        "accelerate",
        "megatron",
        "nemo",
        "horovod",
        "lightning",
    } <= named


def test_roles_serving_engines_serve_launchers_train_ray_and_frameworks_say_nothing() -> None:
    def role(image: str, *command: str) -> Prior | None:
        found = identify_container(ContainerSpec(image, tuple(command)))
        return found.role if found else None

    assert role("vllm/vllm-openai:v0.6.3") is Prior.SERVING
    assert role("nvcr.io/nvidia/pytorch:24.08-py3", "torchrun", "train.py") is Prior.TRAINING
    assert role("rayproject/ray-ml:2.7.0") is None
    assert role("nvcr.io/nvidia/pytorch:24.08-py3", "python", "serve.py") is None


def test_the_command_wins_over_the_image() -> None:
    """A NeMo image running a vLLM server serves."""
    found = identify_container(
        ContainerSpec("nvcr.io/nvidia/nemo:24.07", ("vllm", "serve", "/models/llama"))
    )
    assert found == Identity("vllm", "pytorch", Prior.SERVING)


def test_a_pod_is_named_by_its_gpu_container_not_its_sidecars() -> None:
    sidecar = ContainerSpec("istio/proxyv2:1.22.0", ("pilot-agent", "proxy"))
    trainer = ContainerSpec("nvcr.io/nvidia/pytorch:24.08-py3", ("torchrun", "train.py"), gpus=8)
    queue = ContainerSpec("gcr.io/knative-releases/queue:v1", (), (), gpus=0)
    assert identify_pod([sidecar, queue, trainer]) == Identity(
        "torchrun", "pytorch", Prior.TRAINING
    )
    assert identify_pod([sidecar]) is None
    # No container requests GPUs (a device plugin the profiler does not see): the first that
    # tells anything.
    server = ContainerSpec("ollama/ollama:0.3.14")
    assert identify_pod([sidecar, server]) == Identity("ollama", "ggml", Prior.SERVING)


def test_pods_from_the_api_keep_their_identity_not_their_command_line() -> None:
    manifest = {
        "metadata": {"uid": "u", "namespace": "ml", "name": "api-0"},
        "spec": {
            "nodeName": "n",
            "containers": [
                {
                    "name": "server",
                    "image": "lmsysorg/sglang:v0.3.5-cu124",
                    "command": ["python3", "-m", "sglang.launch_server"],
                    "args": ["--model-path", "m", "--api-key", "sk-secret"],
                    "resources": {"limits": {"nvidia.com/gpu": "2"}},
                }
            ],
        },
        "status": {"phase": "Running"},
    }
    info = pod_info(manifest)
    assert info.identity == Identity("sglang", "pytorch", Prior.SERVING)
    assert "sk-secret" not in repr(info)


def test_series_labels_are_read_only_for_names_in_the_tables() -> None:
    assert identity_of("vllm", "pytorch") == Identity("vllm", "pytorch", Prior.SERVING)
    assert identity_of("my-own-engine", "pytorch") == Identity(None, "pytorch", None)
    assert identity_of("", "bogus") is None


# -- local mode: the process table -------------------------------------------------------------

TORCH_MAPS = (
    "7f0000000000-7f0000100000 r-xp 00000000 08:01 1234 "
    "/usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so\n"
    "7f0000100000-7f0000200000 r-xp 00000000 08:01 1235 "
    "/usr/local/lib/python3.10/dist-packages/torch/lib/libc10_cuda.so\n"
)
VLLM_MAPS = TORCH_MAPS + (
    "7f0000200000-7f0000300000 r-xp 00000000 08:01 2000 "
    "/usr/local/lib/python3.10/dist-packages/vllm/_C.abi3.so\n"
)
JAX_MAPS = (
    "7f0000000000-7f0000100000 r-xp 00000000 08:01 3000 "
    "/usr/local/lib/python3.10/dist-packages/jaxlib/xla_extension.so\n"
    "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n"
)
TF_MAPS = (
    "7f0000000000-7f0000100000 r-xp 00000000 08:01 4000 "
    "/usr/local/lib/python3.11/dist-packages/tensorflow/libtensorflow_framework.so.2\n"
)


def write_process(
    root: Path, pid: int, argv: list[str], parent: int = 1, maps: str | None = None
) -> None:
    folder = root / str(pid)
    folder.mkdir()
    (folder / "cmdline").write_bytes(b"\0".join(word.encode() for word in argv) + b"\0")
    (folder / "stat").write_text(f"{pid} ({argv[0][:15]}) S {parent} {pid} {pid} 0 -1\n")
    if maps is not None:
        (folder / "maps").write_text(maps)


@pytest.fixture
def process_table(tmp_path: Path) -> Path:
    """A node's processes: a torchrun job (launcher and two workers), a vLLM server with a
    tensor-parallel worker spawned by multiprocessing, a JAX trainer, a TensorFlow script, a
    process whose maps cannot be read, and a process with a space and parentheses in its
    command name."""
    write_process(tmp_path, 100, ["/bin/sh", "-c", "torchrun --nproc-per-node=2 train.py"])
    write_process(
        tmp_path,
        101,
        ["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node=2", "train.py"],
        parent=100,
    )
    write_process(
        tmp_path,
        102,
        ["/usr/bin/python3", "-u", "train.py", "--lr", "3e-4"],
        parent=101,
        maps=TORCH_MAPS,
    )
    write_process(
        tmp_path, 103, ["/usr/bin/python3", "-u", "train.py"], parent=101, maps=TORCH_MAPS
    )
    write_process(
        tmp_path,
        200,
        ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"],
        maps=VLLM_MAPS,
    )
    write_process(
        tmp_path,
        201,
        [
            "/usr/bin/python3",
            "-c",
            "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
        ],
        parent=200,
        maps=VLLM_MAPS,
    )
    write_process(tmp_path, 300, ["python", "train.py", "--config", "c.yaml"], maps=JAX_MAPS)
    write_process(tmp_path, 400, ["python3", "mnist.py"], maps=TF_MAPS)
    write_process(tmp_path, 500, ["python3", "serve.py"])  # maps unreadable: not written
    write_process(tmp_path, 600, ["/opt/my (odd) server", "--port", "1"], maps=TORCH_MAPS)
    return tmp_path


@pytest.mark.parametrize(
    ("pid", "expected"),
    [
        (102, Identity("torchrun", "pytorch", Prior.TRAINING)),  # the launcher is the parent
        (103, Identity("torchrun", "pytorch", Prior.TRAINING)),
        (200, Identity("vllm", "pytorch", Prior.SERVING)),
        (201, Identity("vllm", "pytorch", Prior.SERVING)),  # its libraries name vLLM
        (300, Identity(None, "jax", None)),
        (400, Identity(None, "tensorflow", None)),
        (500, None),
        (600, Identity(None, "pytorch", None)),
        (999, None),  # gone
    ],
)
def test_a_process_is_named_by_its_command_its_parents_and_its_libraries(
    process_table: Path, pid: int, expected: Identity | None
) -> None:
    assert process_identity(pid, process_table) == expected


def test_the_process_itself_wins_over_its_parents() -> None:
    lineage = [["python", "-m", "sglang.launch_server"], ["torchrun", "x.py"]]
    assert identify_process(lineage) == Identity("sglang", "pytorch", Prior.SERVING)


def test_local_mode_puts_the_main_processs_engine_on_each_gpu(process_table: Path) -> None:
    """GPU 0 runs two torchrun workers, GPU 1 the vLLM server and its worker (the server holds
    the most memory), GPU 2 a TensorFlow script, GPU 3 nothing: the profiles carry what each
    runs, and the serving engine is GPU 1's prior."""
    gpus = [
        FakeGpu(
            "GPU-0", "NVIDIA H100 80GB HBM3", util=90, processes=[(102, 30 << 30), (103, 1 << 30)]
        ),
        FakeGpu(
            "GPU-1", "NVIDIA H100 80GB HBM3", util=60, processes=[(201, 2 << 30), (200, 40 << 30)]
        ),
        FakeGpu("GPU-2", "NVIDIA H100 80GB HBM3", util=30, processes=[(400, 1 << 30)]),
        FakeGpu("GPU-3", "NVIDIA H100 80GB HBM3"),
    ]
    clock = Clock()
    source = NvmlSource(
        "node-a", 60, 1.0, nvml=FakeNvml(gpus, clock), proc_root=process_table, clock=clock
    )
    assert source.open()
    for _ in range(60):
        clock.now += 1.0
        source.sample()

    matrices = source.read(60)
    labels = {matrix.field: matrix for matrix in matrices}[GPU_UTIL].labels
    assert [(series.get("engine"), series.get("framework")) for series in labels] == [
        ("torchrun", "pytorch"),
        ("vllm", "pytorch"),
        (None, "tensorflow"),
        (None, None),
    ]
    profiles = build_profiles(matrices)
    assert [(p.engine, p.framework) for p in profiles] == [
        ("torchrun", "pytorch"),
        ("vllm", "pytorch"),
        (None, "tensorflow"),
        (None, None),
    ]
    assert "engine vllm (serving)" in profiles[1].reasons
    assert np.isfinite(profiles[0].stats[GPU_UTIL].mean)


@settings(max_examples=300, deadline=None)
@given(
    image=st.text(max_size=60),
    command=st.lists(st.text(max_size=40), max_size=6),
    args=st.lists(st.text(max_size=40), max_size=6),
)
def test_any_container_spec_is_read_without_an_error(
    image: str, command: list[str], args: list[str]
) -> None:
    """Pod specs are user input: unbalanced quotes in a shell script, empty words, odd images
    name nothing or a table entry, and never raise."""
    found = identify_container(ContainerSpec(image, tuple(command), tuple(args)))
    if found is not None:
        assert found.engine is None or found.engine in ENGINE_NAMES
        assert found.framework is None or found.framework in FRAMEWORK_NAMES
    shell = identify_container(ContainerSpec(image, SH, (" ".join(command + args),)))
    assert shell is None or shell.engine is None or shell.engine in ENGINE_NAMES
