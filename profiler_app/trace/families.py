"""Kernel families by name: what the model is made of (GEMM, attention, convolution, ...).

Each family is a list of regular expressions, searched case-insensitively in the kernel's
demangled name. Families are tried in order and the first match wins, so the specific come
before the general: NCCL first, then attention (flash-attention kernels carry cutlass GEMM
types in their names), normalisation and convolution (cuDNN's implicit-GEMM convolutions say
"gemm"), then GEMM, memory (copy kernels are element-wise kernels in PyTorch) and
element-wise/reduction; a kernel that matches none is ``other``. A file of extra families
(``load_extra``) is tried before the built-in ones, so it can claim a name or add a family.

``reading`` turns a GPU's family shares into one line about the model, e.g. "transformer:
attention + GEMM 78%": the scope notes' "model architecture", from kernel names only.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from profiler_app.core.errors import UserError

COMMUNICATION = "communication"
ATTENTION = "attention"
NORMALISATION = "normalisation"
CONVOLUTION = "convolution"
GEMM = "gemm"
MEMORY = "memory"
ELEMENTWISE = "elementwise"
OTHER = "other"


@dataclass(frozen=True)
class Family:
    name: str  # the JSON key
    label: str  # as printed
    patterns: tuple[str, ...]  # regular expressions, searched ignoring case


BUILT_IN: tuple[Family, ...] = (
    # ncclDevKernel_AllReduce_Sum_bf16_RING_LL, ncclKernel_AllGather_RING_LL_Sum_int8_t
    Family(COMMUNICATION, "NCCL", (r"\bnccl",)),
    Family(
        ATTENTION,
        "attention",
        (
            r"flash",  # flash::flash_fwd_kernel, FlashAttention 3, flashinfer
            r"fmha",  # cutlass and xformers fmha_cutlassF, TensorRT fmha_v2
            r"scaled_dot_product",  # PyTorch's _scaled_dot_product_* kernels
            r"attention",  # vLLM paged_attention, mem-efficient AttentionKernel
            r"sdpa",  # cuDNN's fused attention (cudnn_generated_fort_native_sdpa)
            r"(?<![a-z])m?mha(?![a-z])",  # TensorRT-LLM masked multi-head attention
        ),
    ),
    Family(
        NORMALISATION,
        "normalisation",
        (
            r"layer_?norm",  # vectorized_layer_norm_kernel, apex cuApplyLayerNorm
            r"rms_?norm",
            r"batch_?norm",
            r"group_?norm",
            r"instance_?norm",
            r"\bbn_(fw|bw)",  # cuDNN's batch norm (cudnn::bn_fw_tr_1C11_kernel_NCHW)
        ),
    ),
    Family(
        CONVOLUTION,
        "convolution",
        (
            r"conv(?!ert)",  # implicit_convolve_sgemm, cutlass conv, not "convert"
            r"fprop|dgrad|wgrad",  # sm80_xmma_fprop_implicit_gemm_..., its gradients
            r"implicit_?gemm",
            r"winograd",
            r"cudnn",  # cuDNN's other kernels (scudnn_128x64_relu_...): its convolutions
        ),
    ),
    Family(
        GEMM,
        "GEMM",
        (
            r"gemm|gemv",  # sm80_xmma_gemm_..._cublas, ampere_sgemm, cutlass gemm
            r"nvjet",  # cuBLAS's kernels on Hopper and later (nvjet_tst_192x192_...)
            r"cublas",
            r"cutlass",
            r"xmma",
            r"matmul",
            r"splitkreduce",  # cuBLAS's split-K reduction
            r"(?<![a-z])(b|add)?mm(?![a-z])",  # Triton's templated mm, bmm, addmm
        ),
    ),
    Family(
        MEMORY,
        "memory",
        (
            r"copy",  # direct_copy_kernel_cuda, CatArrayBatchedCopy, dtype casts
            r"memcpy|memset",
            r"fill",  # FillFunctor, fill_kernel
            r"gather|scatter",
            r"index",  # index_select, indexing_backward
            r"embedding",
            r"transpose|permute",
            r"nchwtonhwc|nhwctonchw",  # layout conversions
        ),
    ),
    Family(
        ELEMENTWISE,
        "elementwise/reduction",
        (
            r"elementwise",  # PyTorch's vectorized_/unrolled_elementwise_kernel
            r"reduce|reduction",
            r"softmax",
            r"triton_(poi|red|per)_",  # Inductor's pointwise and reduction kernels
            r"multi_tensor_apply|adam|sgd",  # fused optimisers
            r"gelu|relu|silu|sigmoid|tanh|dropout",
            r"cross_entropy|nll_loss",
        ),
    ),
)
LABELS = {family.name: family.label for family in BUILT_IN} | {OTHER: "other"}


class Classifier:
    """Kernel name -> family name, through ``families`` in order."""

    def __init__(self, families: Sequence[Family]) -> None:
        self.families = tuple(families)
        self._patterns = [
            (f.name, re.compile("|".join(f"(?:{p})" for p in f.patterns), re.IGNORECASE))
            for f in self.families
        ]
        self._labels = {f.name: f.label for f in reversed(self.families)} | {OTHER: "other"}

    def family(self, kernel_name: str) -> str:
        for name, pattern in self._patterns:
            if pattern.search(kernel_name):
                return name
        return OTHER

    def label(self, family: str) -> str:
        return self._labels.get(family, family)


DEFAULT = Classifier(BUILT_IN)


def load_extra(path_text: str) -> Classifier:
    """The built-in families after those of a TOML file (tried first)::

    [[family]]
    name = "attention"           # a built-in family: these patterns join it
    patterns = ["my_attn_fwd"]

    [[family]]
    name = "moe-routing"         # a new family
    label = "MoE routing"        # as printed (default: the name)
    patterns = ["topk_gating", "moe_align"]
    """
    path = Path(path_text).expanduser()
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise UserError(f"cannot read kernel families {path}: {error.strerror or error}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"kernel families {path} is not valid TOML: {error}") from None
    entries = document.get("family")
    if not isinstance(entries, list) or not entries:
        raise UserError(f"kernel families {path}: no [[family]] tables")
    extra = [_family(entry, path, index) for index, entry in enumerate(entries, 1)]
    return Classifier((*extra, *BUILT_IN))


def _family(entry: object, path: Path, index: int) -> Family:
    where = f"kernel families {path}, family {index}"
    if not isinstance(entry, dict):
        raise UserError(f"{where}: not a table")
    unknown = sorted(set(entry) - {"name", "label", "patterns"})
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r} (name, label, patterns)")
    name, patterns = entry.get("name"), entry.get("patterns")
    if not isinstance(name, str) or not name.strip():
        raise UserError(f"{where}: give a name")
    if (
        not isinstance(patterns, list)
        or not patterns
        or not all(isinstance(p, str) and p for p in patterns)
    ):
        raise UserError(f"{where} ({name}): patterns must be a list of regular expressions")
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as error:
            raise UserError(f"{where} ({name}): bad pattern {pattern!r}: {error}") from None
    label = entry.get("label", LABELS.get(name, name))
    if not isinstance(label, str):
        raise UserError(f"{where} ({name}): label must be text")
    return Family(name.strip(), label, tuple(patterns))


@dataclass(frozen=True)
class Share:
    family: str
    label: str
    total_ns: int
    instances: int
    names: int  # distinct kernel names

    def percent_of(self, whole_ns: int) -> float:
        return 100.0 * self.total_ns / whole_ns if whole_ns else 0.0


# A family's share of the GPU's compute kernel time (collectives aside) for each reading.
TRANSFORMER_MIN_ATTENTION = 0.05
TRANSFORMER_MIN_WITH_GEMM = 0.50
CONVOLUTION_MIN = 0.25
GEMM_MIN = 0.50
OTHER_MIN = 0.50
SMALL_OPERATORS_MIN = 0.50
COMMUNICATION_SHOWN_MIN = 0.05  # of all kernel time


def reading(shares: Sequence[Share]) -> str | None:
    """One line on what the kernels say the model is, from a GPU's family shares."""
    whole = sum(s.total_ns for s in shares)
    if whole <= 0:
        return None
    by_family = {s.family: s.total_ns for s in shares}
    communication = by_family.get(COMMUNICATION, 0)
    compute = whole - communication

    def share(*names: str) -> float:
        return sum(by_family.get(name, 0) for name in names) / compute if compute else 0.0

    def percent(*names: str) -> str:
        return f"{100 * sum(by_family.get(n, 0) for n in names) / whole:.0f}%"

    if share(ATTENTION) >= TRANSFORMER_MIN_ATTENTION and (
        share(ATTENTION, GEMM) >= TRANSFORMER_MIN_WITH_GEMM
    ):
        text = f"transformer: attention + GEMM {percent(ATTENTION, GEMM)}"
    elif share(CONVOLUTION) >= CONVOLUTION_MIN:
        parts = [CONVOLUTION] + ([NORMALISATION] if by_family.get(NORMALISATION) else [])
        text = f"convolutional network: {' + '.join(parts)} {percent(*parts)}"
    elif share(GEMM) >= GEMM_MIN:
        text = (
            f"dense layers: GEMM {percent(GEMM)}, no fused attention kernel (an MLP, or "
            "attention computed as separate GEMMs)"
        )
    elif share(OTHER) >= OTHER_MIN:
        text = (
            f"custom kernels: {percent(OTHER)} in no known family (e.g. HPC or hand-written code)"
        )
    elif share(ELEMENTWISE, MEMORY) >= SMALL_OPERATORS_MIN:
        text = (
            f"small operators: elementwise/reduction + memory {percent(ELEMENTWISE, MEMORY)} "
            "(unfused: fusing them, e.g. with torch.compile, saves their memory traffic)"
        )
    elif compute:
        largest = max(
            (s for s in shares if s.family != COMMUNICATION), key=lambda s: (s.total_ns, s.family)
        )
        text = f"mixed: largest {largest.label} {percent(largest.family)}"
    else:
        text = f"communication only: NCCL {percent(COMMUNICATION)}"
    if compute and communication / whole >= COMMUNICATION_SHOWN_MIN:
        text += f"; NCCL collectives {percent(COMMUNICATION)}"
    return text
