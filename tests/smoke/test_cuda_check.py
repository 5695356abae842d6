"""The smoke suite's CUDA program (checks/cuda_check.py), run as the pods run it, against the
stand-in driver (tests/support/fake_libcuda.c, a TEST DOUBLE built here with the C compiler): every
driver call with the real signatures, on host memory. What a host without a GPU cannot show, that a
GPU runs the kernel, is as far as can be checked without one: NVIDIA's own PTX assembler (ptxas,
from the nvidia-cuda-nvcc-cu12 wheel) accepts the kernel for the GPU generations the clusters run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.smoke.checks import cuda_check
from tests.smoke.checks.pods import CUDA_CHECK_SOURCE
from tests.support.fake_cuda import NoCompilerError, fake_libcuda_dir, run_cuda_program

UUIDS = ["GPU-5e2f1b7a-3c4d-5e6f-7a8b-9c0d1e2f3a4b", "GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d"]


@pytest.fixture(scope="module", autouse=True)
def stand_in_driver() -> Path:
    try:
        return fake_libcuda_dir()
    except NoCompilerError as error:
        pytest.skip(f"{error} (Debian: gcc, libc6-dev)")


def check(arguments: list[str], **driver: Any) -> tuple[dict[str, Any], int]:
    output, code = run_cuda_program(CUDA_CHECK_SOURCE, arguments, **driver)
    return json.loads(output.strip().splitlines()[-1]), code


def test_one_gpu_runs_the_kernel_and_reports_its_uuid() -> None:
    result, code = check(["--expect-devices", "1"], uuids=UUIDS[:1])
    assert (code, result["problems"]) == (0, [])
    assert result["devices"] == 1
    assert result["uuids"] == UUIDS[:1]
    assert result["vector_add"] == "ok"


def test_a_visible_device_whose_kernel_fails_is_a_failure() -> None:
    """Fabric Manager down: the GPU is listed, CUDA work fails with error 802."""
    result, code = check(
        ["--expect-devices", "1"], uuids=UUIDS[:1], failure=("cuLaunchKernel", 802)
    )
    assert code == 1
    assert result["uuids"] == UUIDS[:1]
    assert result["problems"] == [
        "cuLaunchKernel failed: CUDA_ERROR_SYSTEM_NOT_READY (802): system not yet initialized"
    ]


def test_wrong_sums_are_a_failure(tmp_path: Path) -> None:
    environment = {
        "LD_LIBRARY_PATH": str(fake_libcuda_dir()),
        "FAKE_CUDA_UUIDS": UUIDS[0],
        "FAKE_CUDA_WRONG_SUM": "1",
        "FAKE_CUDA_LOG": str(tmp_path / "calls"),
        "PATH": os.environ["PATH"],
    }
    completed = subprocess.run(
        [sys.executable, "-c", CUDA_CHECK_SOURCE, "--expect-devices", "1"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    result = json.loads(completed.stdout)
    assert completed.returncode == 1
    assert result["vector_add"] == "wrong results"
    assert result["problems"][0].startswith("vector addition gave wrong results at 1 of 65536")
    calls = (tmp_path / "calls").read_text().split()
    assert calls.index("cuModuleLoadData") < calls.index("cuLaunchKernel")
    assert calls.count("cuMemAlloc_v2") == 3


@pytest.mark.parametrize(
    ("arguments", "uuids", "problems"),
    [
        (["--expect-devices", "1"], UUIDS, ["2 GPUs visible, expected 1"]),
        (["--expect-devices", "0"], UUIDS, ["2 GPUs visible, expected 0"]),
        (["--expect-devices", "0"], None, []),  # no GPU handed over: no driver library at all
        (["--expect-devices", "1"], None, ["no CUDA driver in the container ("]),
    ],
)
def test_the_number_of_visible_gpus_is_checked(
    arguments: list[str], uuids: list[str] | None, problems: list[str]
) -> None:
    result, code = check(arguments, uuids=uuids)
    assert code == (1 if problems else 0)
    assert len(result["problems"]) == len(problems)
    for found, expected in zip(result["problems"], problems, strict=True):
        assert found.startswith(expected)


def test_no_device_from_the_driver_is_none_visible() -> None:
    result, code = check(["--expect-devices", "0"], uuids=[], failure=("cuInit", 100))
    assert (code, result["devices"], result["problems"]) == (0, 0, [])


def test_every_gpu_copies_to_every_other() -> None:
    four = [f"GPU-0000000{i}-0000-0000-0000-000000000000" for i in range(4)]
    result, code = check(["--expect-devices", "4", "--peer-to-peer"], uuids=four)
    assert (code, result["peer_to_peer"], result["problems"]) == (0, "ok", [])
    denied, code = check(["--expect-devices", "4", "--peer-to-peer"], uuids=four, peer_access=False)
    assert code == 1
    assert denied["peer_to_peer"] == "failed"
    assert len(denied["problems"]) == 12  # every ordered pair of 4 GPUs
    assert denied["problems"][0] == "GPU 0 cannot access GPU 1 as a peer"
    single, code = check(["--peer-to-peer"], uuids=UUIDS[:1])
    assert code == 1
    assert single["problems"] == ["peer-to-peer needs at least 2 GPUs"]


def test_hold_keeps_running_after_the_result() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", CUDA_CHECK_SOURCE, "--expect-devices", "0", "--hold", "0.2"],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0
    assert json.loads(completed.stdout)["devices"] == 0


def _ptxas() -> Path | None:
    try:
        import nvidia.cuda_nvcc  # noqa: PLC0415  the wheel NVIDIA publishes ptxas in
    except ImportError:
        return None
    for folder in nvidia.cuda_nvcc.__path__:
        candidate = Path(folder) / "bin" / "ptxas"
        if candidate.is_file():
            return candidate
    return None


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100"])
def test_the_kernel_assembles_for_ampere_hopper_and_blackwell(tmp_path: Path, arch: str) -> None:
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("no ptxas: pip install nvidia-cuda-nvcc-cu12 (the dev extra, on x86_64)")
    source = tmp_path / "vector_add.ptx"

    def assemble(ptx: bytes) -> subprocess.CompletedProcess[str]:
        source.write_bytes(ptx)
        return subprocess.run(
            [str(ptxas), f"-arch={arch}", str(source), "-o", str(tmp_path / "vector_add.cubin")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    completed = assemble(cuda_check.VECTOR_ADD_PTX)
    assert completed.returncode == 0, completed.stderr
    # The assembler is a real judge: a kernel with an undefined register is refused.
    broken = assemble(cuda_check.VECTOR_ADD_PTX.replace(b"%f2;", b"%f9;"))
    assert broken.returncode != 0
    assert "Unknown symbol '%f9'" in broken.stderr
