"""Kernel families by name (``profiler_app.trace.families``): the built-in table on real kernel
names, the one-line reading, and families added from a TOML file.

Names marked "real export" are from the public Nsight Systems exports that
``benchmarks/check_real_reports.py`` reads (PyTorch on H100s, CloverLeaf and an MPI saxpy on
A100s); the others are library kernels as public profiles and Nsight Systems show them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler_app.cli import main
from profiler_app.core.errors import UserError
from profiler_app.trace import families
from profiler_app.trace.families import DEFAULT, Share, load_extra, reading
from tests.support.nsys.builder import NCCL_ALL_REDUCE, NCCL_SEND_RECV, ReportBuilder

MS = 1_000_000

NAMES = [
    # real export (nsys-ai, H100)
    ("communication", NCCL_SEND_RECV),
    ("communication", NCCL_ALL_REDUCE),
    ("communication", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm *, ncclWorkElem)"),
    (
        "attention",
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)64, "
        "(int)4, (bool)0, (bool)0, cutlass::bfloat16_t, Flash_kernel_traits<(int)128>>>"
        "(Flash_fwd_params)",
    ),
    (
        "attention",
        "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)",
    ),
    ("attention", "void vllm::paged_attention_v1_kernel<__nv_bfloat16, 128, 16, 128>()"),
    ("attention", "cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_kernel0_0"),
    ("gemm", "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN"),  # real export
    (
        "gemm",
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_"
        "aligna4_alignc4_execute_kernel__5x_cublas",  # real export
    ),
    ("gemm", "ampere_sgemm_128x64_tn"),
    ("gemm", "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>()"),
    ("gemm", "triton_tem_fused_mm_0"),
    (
        "convolution",
        "void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, "
        "false, true>(int, int, int, float const*, int, float*)",
    ),
    (
        "convolution",
        "sm80_xmma_fprop_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32"
        "_stage4_warpsize2x2x1_g1_tensor16x8x16_kernel_cudnn",
    ),
    ("convolution", "_5x_cudnn_ampere_scudnn_128x64_relu_small_nn_v1"),
    (
        "normalisation",
        "void at::native::<unnamed>::vectorized_layer_norm_kernel<float, float, (bool)0>(int, T2, "
        "const T1 *, const T1 *, const T1 *, T2 *, T2 *, T1 *)",  # real export
    ),
    ("normalisation", "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>()"),
    ("normalisation", "triton_per_fused_native_layer_norm_0"),
    ("normalisation", "void vllm::rms_norm_kernel<c10::BFloat16>()"),
    (
        "memory",
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
        "at::TensorIteratorBase &)::[lambda() (instance 3)]>()",  # real export
    ),
    (
        "memory",
        "void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, "
        "std::array<char *, (unsigned long)1>>(int, T2, T3)",  # real export
    ),
    ("memory", "void at::native::vectorized_gather_kernel<(int)16, long>()"),  # real export
    (
        "elementwise",
        "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, "
        "at::native::MeanOps<float, float, float, float>>>()",  # real export
    ),
    (
        "elementwise",
        "void <unnamed>::softmax_warp_forward<float, float, float, (int)6, (bool)0, (bool)0>()",
    ),
    (
        "elementwise",
        "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>"
        ", std::array<char *, (unsigned long)3>>(int, T2, T3)",  # real export
    ),
    ("elementwise", "triton_poi_fused_add_mul_0"),
    ("elementwise", "triton_red_fused_sum_1"),
    ("other", "saxpy(double *, double *, double *, double, int)"),  # real export
    (
        "other",
        "void clover::par_ranged2d_kernel<PdV_kernel(bool, int, int, int, int, double)>()",
    ),  # real export (CloverLeaf)
    ("other", "void at::native::convert_dtype_kernel()"),  # "conv" of convert is no convolution
]


@pytest.mark.parametrize(("family", "name"), NAMES)
def test_kernel_names_fall_in_their_family(family: str, name: str) -> None:
    assert DEFAULT.family(name) == family


def shares(**totals: int) -> list[Share]:
    return [Share(name, families.LABELS.get(name, name), ns, 1, 1) for name, ns in totals.items()]


@pytest.mark.parametrize(
    ("totals", "line"),
    [
        ({"attention": 50, "gemm": 28, "elementwise": 22}, "transformer: attention + GEMM 78%"),
        (
            {"attention": 40, "gemm": 20, "elementwise": 10, "communication": 30},
            "transformer: attention + GEMM 60%; NCCL collectives 30%",
        ),
        (
            {"convolution": 55, "normalisation": 15, "elementwise": 30},
            "convolutional network: convolution + normalisation 70%",
        ),
        (
            {"gemm": 87, "elementwise": 13},
            "dense layers: GEMM 87%, no fused attention kernel (an MLP, or attention computed "
            "as separate GEMMs)",
        ),
        (
            {"other": 92, "elementwise": 8},
            "custom kernels: 92% in no known family (e.g. HPC or hand-written code)",
        ),
        (
            {"elementwise": 40, "memory": 30, "gemm": 30},
            "small operators: elementwise/reduction + memory 70% (unfused: fusing them, e.g. "
            "with torch.compile, saves their memory traffic)",
        ),
        ({"gemm": 40, "memory": 35, "other": 25}, "mixed: largest GEMM 40%"),
        ({"communication": 10}, "communication only: NCCL 100%"),
    ],
)
def test_the_reading_names_the_architecture(totals: dict[str, int], line: str) -> None:
    assert reading(shares(**totals)) == line


def test_no_kernels_no_reading() -> None:
    assert reading([]) is None


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_file_adds_families_before_the_built_in_ones(tmp_path: Path) -> None:
    classifier = load_extra(
        write(
            tmp_path / "families.toml",
            """
            [[family]]
            name = "attention"
            patterns = ["^my_decode_kernel"]

            [[family]]
            name = "moe"
            label = "MoE routing"
            patterns = ["topk_gating", "moe_align"]
            """,
        )
    )
    assert classifier.family("my_decode_kernel<128>") == "attention"
    assert classifier.family("void vllm::moe_align_block_size_kernel<int>()") == "moe"
    assert classifier.label("moe") == "MoE routing"
    assert classifier.label("attention") == "attention"
    assert classifier.family(NCCL_SEND_RECV) == "communication"  # built-ins still apply


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[family]\nname = 1", "is not valid TOML"),
        ("[other]\nx = 1", "no [[family]] tables"),
        ('[[family]]\npatterns = ["x"]', "give a name"),
        ('[[family]]\nname = "x"', "patterns must be a list of regular expressions"),
        ('[[family]]\nname = "x"\npatterns = ["(unclosed"]', "bad pattern '(unclosed'"),
        ('[[family]]\nname = "x"\npatterns = ["a"]\ncolour = "red"', "unknown key 'colour'"),
    ],
)
def test_a_bad_families_file_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_extra(write(tmp_path / "families.toml", text))


def test_the_cli_takes_a_families_file_and_refuses_a_missing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = ReportBuilder()
    report.add_kernels("my_decode_kernel<128>", [0, 2 * MS], MS)
    path = str(report.write(tmp_path / "r.sqlite"))
    extra = write(tmp_path / "f.toml", '[[family]]\nname = "attention"\npatterns = ["^my_dec"]\n')
    status = main(
        ["trace", path, "--store-url", "none", "--output", "json", "--kernel-families", extra]
    )
    out, _ = capsys.readouterr()
    assert status == 0
    assert json.loads(out)["gpus"][0]["families"][0]["family"] == "attention"
    status = main(["trace", path, "--store-url", "none", "--kernel-families", str(tmp_path / "no")])
    _, err = capsys.readouterr()
    assert status == 2
    assert err.count("\n") == 1
    assert "cannot read kernel families" in err
