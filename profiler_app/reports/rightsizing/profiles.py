"""MIG profiles per GPU model: what each GPU instance gets (memory, SMs, slices).

Where the numbers come from (docs/sharing.md repeats this with the sources):

- Fractions of memory and SMs, and how many instances of a profile fit: NVIDIA's MIG user guide
  ("Supported MIG Profiles", R580), for A100, H100 and H200. The guide gives fractions only.
- Usable memory (GiB) and SM counts: ``nvidia-smi mig -lgip`` on real GPUs, as published by
  their users, two independent dumps agreeing for each of A100 40GB, A100 80GB and H100 SXM5 80GB,
  one for H100 PCIe. They differ between SKUs of one family (an H100 PCIe's 1g.10gb has 14 SMs,
  an H100 SXM5's 16), so the table is keyed by product.
- H200 141GB: no ``-lgip`` dump was found. Its SM counts for 2g.35gb (32) and 3g.71gb (60) are
  what CUDA reported inside those instances on real H200s; the rest follow H100 SXM5, the same
  GH100 die with 132 SMs. Its usable memory is derived from the 69.8 GiB CUDA reported inside a
  3g.71gb (four eighths): eighths of 139.5 GiB, rounded down to 1/8 GiB. These entries say
  ``measured=False``; prefer NVML's own table at run time (``profiles_from_nvml``).

A profile's name is not its size: ``1g.10gb`` on an H100 holds 9.75 GiB (NVIDIA's naming rounds a
fraction of the GPU's memory, go-nvlib's ``getMigMemorySizeGB``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MEMORY_EIGHTHS = 8
COMPUTE_SEVENTHS = 7
# "MIG 2g.20gb", "2g.20gb", "1g.10gb+me": compute slices, nominal GB, attributes.
PROFILE_NAME = re.compile(r"^(?:MIG\s+)?(\d+)g\.(\d+)gb(\+[a-z.]+)?$")

LGIP_SOURCE = "nvidia-smi mig -lgip on real GPUs (two published dumps agree)"
LGIP_ONE_SOURCE = "nvidia-smi mig -lgip on a real GPU (one published dump)"
DERIVED_SOURCE = "derived: MIG user guide fractions, CUDA inside 2g/3g instances, H100 SXM5 SMs"
NVML_SOURCE = "NVML (nvmlDeviceGetGpuInstanceProfileInfo) on this GPU"


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile: what an instance of it gets."""

    name: str  # "2g.20gb"
    memory_gib: float  # usable framebuffer
    sms: int
    compute_slices: int  # of 7
    memory_slices: int  # of 8
    instances: int  # how many fit on one GPU

    @property
    def resource(self) -> str:
        """The device plugin's resource under migStrategy mixed."""
        return f"{MIG_RESOURCE_PREFIX}{self.name}"

    @property
    def memory_fraction(self) -> float:
        """Its share of the GPU's memory controllers, hence of the memory bandwidth."""
        return self.memory_slices / MEMORY_EIGHTHS

    @property
    def size(self) -> tuple[int, int, float]:
        """Order from smallest: fewer compute slices, then fewer memory slices."""
        return (self.compute_slices, self.memory_slices, self.memory_gib)


@dataclass(frozen=True)
class GpuModel:
    """A MIG-capable GPU product and its instance profiles."""

    key: str  # "H100-SXM5-80GB"
    products: tuple[str, ...]  # NVML names (also dcgm-exporter's modelName)
    sms: int  # the whole GPU's
    memory_gib: float  # usable as one 7g instance
    profiles: tuple[MigProfile, ...]
    source: str
    measured: bool = True  # False: some numbers are derived (see ``source``)

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def whole_gpu_profile(self) -> MigProfile:
        """The profile spanning the whole GPU (7 compute slices)."""
        return max(self.profiles, key=lambda p: p.size)


def _p(name: str, memory_gib: float, sms: int, memory_slices: int, instances: int) -> MigProfile:
    compute = int(name.split("g.", 1)[0])
    return MigProfile(name, memory_gib, sms, compute, memory_slices, instances)


A100_40GB = GpuModel(
    key="A100-40GB",
    products=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
    sms=108,
    memory_gib=39.38,
    profiles=(
        _p("1g.5gb", 4.75, 14, 1, 7),
        _p("1g.10gb", 9.75, 14, 2, 4),
        _p("2g.10gb", 9.75, 28, 2, 3),
        _p("3g.20gb", 19.62, 42, 4, 2),
        _p("4g.20gb", 19.62, 56, 4, 1),
        _p("7g.40gb", 39.38, 98, 8, 1),
    ),
    source=LGIP_SOURCE,
)
A100_80GB = GpuModel(
    key="A100-80GB",
    products=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
    sms=108,
    memory_gib=79.0,
    profiles=(
        _p("1g.10gb", 9.5, 14, 1, 7),
        _p("1g.20gb", 19.5, 14, 2, 4),
        _p("2g.20gb", 19.5, 28, 2, 3),
        _p("3g.40gb", 39.25, 42, 4, 2),
        _p("4g.40gb", 39.25, 56, 4, 1),
        _p("7g.80gb", 79.0, 98, 8, 1),
    ),
    source=LGIP_SOURCE,
)
H100_SXM5_80GB = GpuModel(
    key="H100-SXM5-80GB",
    products=("NVIDIA H100 80GB HBM3",),
    sms=132,
    memory_gib=79.25,
    profiles=(
        _p("1g.10gb", 9.75, 16, 1, 7),
        _p("1g.20gb", 19.62, 26, 2, 4),
        _p("2g.20gb", 19.62, 32, 2, 3),
        _p("3g.40gb", 39.5, 60, 4, 2),
        _p("4g.40gb", 39.5, 64, 4, 1),
        _p("7g.80gb", 79.25, 132, 8, 1),
    ),
    source=LGIP_SOURCE,
)
H100_PCIE_80GB = GpuModel(
    key="H100-PCIe-80GB",
    products=("NVIDIA H100 PCIe",),
    sms=114,
    memory_gib=79.25,
    profiles=(
        _p("1g.10gb", 9.75, 14, 1, 7),
        _p("1g.20gb", 19.62, 14, 2, 4),
        _p("2g.20gb", 19.62, 30, 2, 3),
        _p("3g.40gb", 39.5, 46, 4, 2),
        _p("4g.40gb", 39.5, 62, 4, 1),
        _p("7g.80gb", 79.25, 114, 8, 1),
    ),
    source=LGIP_ONE_SOURCE,
)
H200_141GB = GpuModel(
    key="H200-141GB",
    products=("NVIDIA H200", "NVIDIA H200 NVL"),
    sms=132,
    memory_gib=139.5,
    profiles=(
        _p("1g.18gb", 17.375, 16, 1, 7),
        _p("1g.35gb", 34.875, 26, 2, 4),
        _p("2g.35gb", 34.875, 32, 2, 3),
        _p("3g.71gb", 69.75, 60, 4, 2),
        _p("4g.71gb", 69.75, 64, 4, 1),
        _p("7g.141gb", 139.5, 132, 8, 1),
    ),
    source=DERIVED_SOURCE,
    measured=False,
)
MODELS: tuple[GpuModel, ...] = (A100_40GB, A100_80GB, H100_SXM5_80GB, H100_PCIE_80GB, H200_141GB)


@functools.lru_cache(maxsize=256)  # a fleet's advice asks for a few names, once per workload
def _normal(name: str) -> str:
    """GFD's label value ("NVIDIA-H100-80GB-HBM3"), NVML's name and dcgm's modelName alike."""
    return re.sub(r"[\s_-]+", "-", name.strip()).upper()


def model_for(product: str, models: Iterable[GpuModel] = MODELS) -> GpuModel | None:
    """The table of a GPU product (NVML name, dcgm-exporter ``modelName``, GFD
    ``nvidia.com/gpu.product``, or a table key); None for GPUs without MIG or unknown ones."""
    wanted = _normal(product)
    for model in models:
        if wanted in {_normal(model.key), *(_normal(p) for p in model.products)}:
            return model
    return None


class ProfileInfo(Protocol):
    """What NVML's ``nvmlGpuInstanceProfileInfo_v2_t`` holds (the fields used here)."""

    sliceCount: int  # noqa: N815  NVML's field names
    instanceCount: int  # noqa: N815
    multiprocessorCount: int  # noqa: N815
    memorySizeMB: int  # noqa: N815
    name: bytes


class Nvml(Protocol):
    """The part of pynvml this module calls (the real module, or a stand-in in tests)."""

    NVMLError: type[Exception]

    def nvmlDeviceGetGpuInstanceProfileInfo(  # noqa: N802  NVML's names
        self, handle: Any, profile: int
    ) -> ProfileInfo: ...

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...  # noqa: N802


# NVML's GPU instance profile ids without media or graphics extensions: 1, 2, 3, 4, 7 slices and
# the 1-slice profile with two memory slices (NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2).
NVML_PLAIN_PROFILES = (0x0, 0x9, 0x1, 0x2, 0x3, 0x4)


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def profiles_from_nvml(nvml: Nvml, handle: Any) -> GpuModel | None:
    """The GPU's own profile table, from NVML at run time; None where NVML offers none (a GPU
    without MIG, or a driver that does not answer). Prefer it to ``MODELS``."""
    profiles: list[MigProfile] = []
    for profile_id in NVML_PLAIN_PROFILES:
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_id)
        except nvml.NVMLError:
            continue  # this GPU has no such profile
        match = PROFILE_NAME.match(_text(info.name).strip())
        if match is None or match.group(3):
            continue
        profiles.append(
            MigProfile(
                name=f"{match.group(1)}g.{match.group(2)}gb",
                memory_gib=info.memorySizeMB / 1024,
                sms=int(info.multiprocessorCount),
                compute_slices=int(info.sliceCount),
                memory_slices=0,  # set below, against the whole-GPU profile
                instances=int(info.instanceCount),
            )
        )
    if not profiles:
        return None
    whole = max(profiles, key=lambda p: (p.compute_slices, p.memory_gib))
    scaled = tuple(
        MigProfile(
            p.name,
            p.memory_gib,
            p.sms,
            p.compute_slices,
            max(1, round(MEMORY_EIGHTHS * p.memory_gib / whole.memory_gib)),
            p.instances,
        )
        for p in profiles
    )
    product = _text(nvml.nvmlDeviceGetName(handle))
    return GpuModel(
        key=product,
        products=(product,),
        sms=whole.sms,
        memory_gib=whole.memory_gib,
        profiles=tuple(sorted(scaled, key=lambda p: p.size)),
        source=NVML_SOURCE,
    )
