"""Kernel categories: the rule table on real kernel names, and breakdowns of real public traces."""

from __future__ import annotations

import gzip

import orjson
import pytest

from commtag.kernels import CATEGORIES, KERNEL_RULES, Breakdown, categorize
from commtag.testing import PUBLIC_TRACES as PUBLIC
from kernel_reference import Kernel, add_kernel, by_graph_launch, by_stream, kernels_from_events



@pytest.mark.parametrize(
    ("name", "category"),
    [
        # Names as they appear in the public traces.
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, ", "communication"),
        ("Memcpy DtoD (Device -> Device)", "memcpy/memset"),
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_tenso", "GEMM"),
        ("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", "GEMM"),
        ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT32x32x256_MI16x16x1_SN_LDSB1", "GEMM"),
        ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu", "GEMM"),
        ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw", "GEMM"),
        ("fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext", "attention"),
        ("kernel_unified_attention_3d", "attention"),
        ("attn_fwd", "attention"),
        # Inductor's pointwise kernels name the ops they fused; they are still elementwise.
        ("triton_poi_fused__scaled_dot_product_flash_attention_cat_transpose_view_10", "elementwise/reduction"),
        ("triton_poi_fused_addmm_gelu_view_15", "elementwise/reduction"),
        ("triton_red_fused_add_addmm_mul_native_layer_norm_split_unsqueeze_view_16", "elementwise/reduction"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::", "elementwise/reduction"),
        ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float, float,", "elementwise/reduction"),
        # 'Convert' is not a convolution.
        ("vllm::_typeConvert<c10::BFloat16>::exists, void>::type vllm::fused_add_rms_norm_kernel", "elementwise/reduction"),
        ("_combined_routing_compute", "other"),
    ],
)
def test_rules_on_real_kernel_names(name, category):
    assert categorize(name) == category


#: Public traces the convolution and attention names below come from (repository, path).
_HTA_V100 = "facebookresearch/HolisticTraceAnalysis tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
_KINETO_RESNET = ("pytorch/kineto tb_plugin/samples/resnet50_autograd_api_num_workers_0/worker0.pt.trace.json.gz"
                  " (commit 025228426e3d)")
_TRACELENS = "AMD-AGI/TraceLens tests/traces/"


@pytest.mark.parametrize(
    ("name", "category", "source"),
    [
        # cuDNN's convolution engines and their helpers: convolutions count as GEMM.
        ("void wgrad_alg0_engine<float, 128, 5, 5, 3, 3, 3, false, 512>(int, int, int, float const*, int, float*, "
         "float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)", "GEMM", _HTA_V100),
        ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int, "
         "float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, float, "
         "int, int, int)", "GEMM", _HTA_V100),
        ("void cudnn::winograd::generateWinogradTilesKernel<0, float, float>(cudnn::winograd::"
         "GenerateWinogradTilesParams<float, float>)", "GEMM", _HTA_V100),
        ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::"
         "WinogradDataParams<float, float>)", "GEMM", _HTA_V100),
        ("cask_cudnn_train::computeWgradSplitKOffsetsKernel(cask_cudnn_train::ComputeSplitKOffsetsParams)", "GEMM",
         _HTA_V100),
        ("void cudnn::detail::dgrad2d_alg1_1<float, 0, 4, 6, 3, 2, 4, false, true>(int, int, int, float const*, int, "
         "float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, float, "
         "int, int, int)", "GEMM", _KINETO_RESNET),
        ("void cudnn::cnn::wgrad_alg1_engine<float, 128, 5, 5, 3, 3, 3, false, true>(int, int, int, float const*, "
         "int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)", "GEMM",
         _KINETO_RESNET),
        ("void fft2d_r2c_16x16<float>(float2*, float const*, int, int, int, int, int, int, int, int)", "GEMM",
         _KINETO_RESNET),
        ("void flip_filter<float, float>(float*, float const*, int, int, int, int)", "GEMM", _KINETO_RESNET),
        ("void cudnn::cnn::reduce_wgrad_nchw_helper<float, float>(void*, void const*, float, int, int)", "GEMM",
         "facebookresearch/HolisticTraceAnalysis tests/data/nccl_parser_config/nccl_data.json.gz"),
        ("Im2d2Col_v2", "GEMM", _TRACELENS + "inference/xdit_sd_3.5/profile_trace_rank_0.json.gz"),
        # Attention beyond FlashAttention.
        ("sage_fwd", "attention", _TRACELENS + "inference/xdit_flux.1_aiter_sage/profile_trace_rank_0.json.gz"),
        ("void (anonymous namespace)::store_kvcache<2048l, 4, false, long>((anonymous namespace)::"
         "StoreKVCacheParams)", "attention", _TRACELENS + "inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"),
        # SageAttention's quantization step is not the attention itself.
        ("sage_quant_kernel", "elementwise/reduction",
         _TRACELENS + "inference/xdit_flux.1_aiter_sage/profile_trace_rank_0.json.gz"),
        # Tensor arithmetic, scans, losses and normalization internals.
        ("void cudnn::ops::scalePackedTensor_kernel<float, float>(long, float*, float)", "elementwise/reduction",
         _HTA_V100),
        ("SubTensorOpWithScalar1d", "elementwise/reduction", _TRACELENS + "mi210/gpu_only_trace/gpu_only_trace.json.gz"),
        ("void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<float, float>(long, float, float const*, "
         "float*, float*)", "elementwise/reduction",
         "facebookresearch/HolisticTraceAnalysis tests/data/trace_filter/sampled_rank-0.json.gz"),
        ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>(long, long, float const*, "
         "float const*, float const*, float const*, float*, float*)", "elementwise/reduction",
         "facebookresearch/HolisticTraceAnalysis tests/data/trace_filter/sampled_rank-0.json.gz"),
        ("void at::native::(anonymous namespace)::ComputeFusedParamsCUDAKernel<float>(long, long, long, float const*, "
         "float const*, float const*, float const*, float*, float*)", "elementwise/reduction",
         _TRACELENS + "perf_model/normalization/normalization_layer_test.json.gz"),
        ("void cunn_ClassNLLCriterion_updateOutput_kernel<float, float>(float*, float*, float*, long*, float*, int, "
         "int, int, int, long)", "elementwise/reduction", _KINETO_RESNET),
        ("void cub::DeviceScanInitKernel<cub::ScanTileState<int, true> >(cub::ScanTileState<int, true>, int)",
         "elementwise/reduction", "facebookresearch/HolisticTraceAnalysis tests/data/trace_filter/sampled_rank-0.json.gz"),
    ],
)
def test_convolution_attention_and_helper_kernels(name, category, source):
    """Each name is copied from the public trace ``source``; without these rules every one but
    sage_quant_kernel would get another category, most of them "other"."""
    assert categorize(name) == category


def test_every_rule_names_a_known_category_and_says_why():
    assert {c for c, _, _ in KERNEL_RULES} <= set(CATEGORIES)
    assert all(why for _, _, why in KERNEL_RULES)


def _events(relpath: str) -> list[dict]:
    path = PUBLIC / relpath
    raw = path.read_bytes()
    data = orjson.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    return data["traceEvents"] if isinstance(data, dict) else data


def test_graph_launch_breakdown_on_a_real_hip_graph_replay():
    kernels = kernels_from_events(_events("edge-cases/tracelens_vllm_hipgraph_replay.json.gz"), rank=0)
    launches = by_graph_launch(kernels)
    assert len(launches) == 1  # the trace has one hipGraphLaunch
    (launch,) = launches.values()
    assert sum(launch.count.values()) > 400  # a decode step: hundreds of kernels behind one launch
    category, share = launch.dominant
    assert category == "GEMM" and 0.5 < share < 1.0
    assert launch.describe().startswith("GEMM ")
    assert launch.count["attention"] > 0
    # The eager kernels outside the launch are not counted in it.
    assert sum(launch.count.values()) < len(kernels)


def test_stream_breakdown_separates_nccl_stream_from_compute():
    kernels = kernels_from_events(_events("eager-nccl-metadata/hta_a100_nccl_data.json.gz"), rank=0)
    streams = by_stream(kernels)
    dominant = {stream: b.dominant[0] for (_, stream), b in streams.items()}
    assert dominant[40] == "communication" and streams[(0, 40)].dominant[1] == 1.0
    assert dominant[7] in ("elementwise/reduction", "GEMM")
    assert streams[(0, 7)].time_us["GEMM"] > 0
    assert by_graph_launch(kernels) == {}  # an eager trace has no graph launches


def test_breakdown_arithmetic():
    b = Breakdown()
    for cat, dur in (("GEMM", 60.0), ("communication", 30.0), ("GEMM", 0.0), ("other", 10.0)):
        add_kernel(b, Kernel(0, "k", 7, 0.0, dur, cat))
    assert b.total_us == 100.0
    assert b.dominant == ("GEMM", 0.6)
    assert b.describe() == "GEMM 60% | communication 30% | other 10%"
    assert b.to_dict()["count"] == {"GEMM": 2, "communication": 1, "other": 1}
